"""The Python client (clients/python/duet) against a real stack (`duet stack up` on the default
tiny model): greedy generate equals `duet generate`, a stream's pieces make the same text, chat
equals `duet generate --chat`, status shows what runs, a closed stream frees its KV pages, and the
KeepAlive rule is the C++ client's (kept alive past 3 x heartbeat_ms; reaped without them).

Run by ctest (tests/clients/python/CMakeLists.txt) as
    DUET_BIN_DIR=build/bin PYTHONPATH=build/python /usr/bin/python3 -m unittest test_client"""

import json
import os
import subprocess
import time
import unittest

import duet

BIN = os.environ.get("DUET_BIN_DIR", "build/bin")
STACK = f"pyclient_{os.getpid() % 100000}"


def run_duet(*args: str, timeout: float = 120) -> str:
    r = subprocess.run([os.path.join(BIN, "duet"), *args], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(
            f"duet {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def native(*args: str) -> dict:
    """`duet generate --json` on the test's stack."""
    out = run_duet("generate", "--stack", STACK, "--json", *args)
    return json.loads(out[out.index("{"):])


class ClientOnARealStack(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # Cleanups run even when setUpClass fails half way (tearDownClass would not).
        cls.addClassCleanup(subprocess.run, [os.path.join(BIN, "duet"), "stack", "down", "--stack",
                                             STACK], capture_output=True, timeout=60)
        run_duet("stack", "up", "--stack", STACK)
        cls.client = duet.Client(STACK)
        cls.addClassCleanup(cls.client.close)

    def wait_idle(self, seconds: float = 10) -> dict:
        """The frontend's status once nothing runs and every KV page is free (or at the end)."""
        end = time.monotonic() + seconds
        while True:
            st = self.client.status()
            idle = not st["running"] and st["engine"]["kv_pages_free"] == st["engine"][
                "kv_pages_total"]
            if idle or time.monotonic() > end:
                return st
            time.sleep(0.02)

    def test_logprobs_come_with_every_token_and_equal_the_cli(self):
        want = native("--max-tokens", "6", "--ignore-eos", "--logprobs", "2", "Once upon a time")
        got = self.client.generate("Once upon a time", max_tokens=6, ignore_eos=True, logprobs=2)
        self.assertEqual(got.ids, want["ids"])
        self.assertEqual([t.chosen.id for t in got.logprobs], got.ids)
        for mine, cli in zip(got.logprobs, want["logprobs"]):
            self.assertAlmostEqual(mine.chosen.logprob, cli["logprob"], places=5)
            self.assertEqual([p.id for p in mine.top], [p["id"] for p in cli["top"]])
            self.assertEqual(mine.top[0].id, mine.chosen.id)  # greedy: the likeliest
        self.assertEqual(b"".join(t.chosen.bytes for t in got.logprobs).decode(), got.text)
        streamed = []
        for chunk in self.client.generate("Once upon a time", max_tokens=6, ignore_eos=True,
                                          logprobs=0, stream=True):
            streamed += chunk.logprobs
        self.assertEqual([t.chosen.id for t in streamed], got.ids)
        # The prompt's own: every token after the first, the first none (NaN).
        echo = self.client.generate("Once upon a time", max_tokens=0, prompt_logprobs=True)
        self.assertEqual(echo.ids, [])
        self.assertEqual(len(echo.prompt_logprobs), echo.stats.prompt_tokens)
        self.assertNotEqual(echo.prompt_logprobs[0].chosen.logprob,
                            echo.prompt_logprobs[0].chosen.logprob)  # NaN
        self.assertTrue(all(t.chosen.logprob <= 0 for t in echo.prompt_logprobs[1:]))

    def test_greedy_generate_equals_duet_generate(self):
        want = native("--max-tokens", "24", "Once upon a time")
        got = self.client.generate("Once upon a time", max_tokens=24)
        self.assertEqual(got.ids, want["ids"])
        self.assertEqual(got.text, want["text"])
        self.assertEqual(got.stats.generated_tokens, want["stats"]["generated_tokens"])
        self.assertEqual(got.stats.finish_reason, want["stats"]["finish_reason"])

    def test_stream_yields_the_same_tokens_piece_by_piece(self):
        want = native("--max-tokens", "24", "The cat")
        stream = self.client.generate("The cat", max_tokens=24, stream=True)
        chunks = list(stream)
        self.assertGreater(len(chunks), 1)
        self.assertEqual([i for c in chunks for i in c.ids], want["ids"])
        self.assertEqual("".join(c.text for c in chunks), want["text"])
        self.assertEqual(stream.result.text, want["text"])
        pieces = self.client.generate("The cat", max_tokens=24, stream=True).text()
        self.assertEqual("".join(pieces), want["text"])

    def test_chat_equals_duet_generate_chat(self):
        want = native("--max-tokens", "20", "--chat", "--chat-template", "chatml",
                      "Tell me a fortune")
        got = self.client.chat([{"role": "user", "content": "Tell me a fortune"}],
                               chat_template="chatml", max_tokens=20)
        self.assertEqual(got.ids, want["ids"])
        self.assertEqual(got.text, want["text"])
        streamed = self.client.chat([("user", "Tell me a fortune")], chat_template="chatml",
                                    max_tokens=20, stream=True)
        self.assertEqual("".join(streamed.text()), want["text"])

    def test_status_shows_a_running_request_and_its_priority(self):
        st = self.client.status()
        for key in ("queue", "running", "limits", "engine", "metrics"):
            self.assertIn(key, st)
        with self.client.generate("Once", max_tokens=480, ignore_eos=True, stream=True,
                                  priority="proactive") as stream:
            next(stream)
            running = self.client.status()["running"]
            self.assertEqual(len(running), 1, running)
            self.assertEqual(running[0]["priority"], "proactive")
            self.assertEqual(running[0]["request_id"], stream.request_id)

    def test_closing_a_stream_cancels_it_and_frees_its_kv_pages(self):
        before = self.wait_idle()["metrics"]["requests"]["cancelled"]
        stream = self.client.generate("Once", max_tokens=480, ignore_eos=True, stream=True)
        self.assertTrue(next(stream).ids)
        stream.close()
        self.assertEqual(stream.result.stats.finish_reason, "cancelled")
        st = self.wait_idle()
        self.assertEqual(st["running"], [])
        self.assertEqual(st["engine"]["kv_pages_free"], st["engine"]["kv_pages_total"])
        self.assertEqual(st["metrics"]["requests"]["cancelled"], before + 1)

    def test_keep_alives_hold_a_request_longer_than_its_heartbeat(self):
        # The frontend reaps after 3 x heartbeat_ms + 20 ms without a KeepAlive: 140 ms here,
        # less than 480 tokens take, so only the client's KeepAlives let it finish.
        start = time.monotonic()
        r = self.client.generate("Once", max_tokens=480, ignore_eos=True, heartbeat_ms=40)
        self.assertGreater(time.monotonic() - start, 0.14)
        self.assertEqual(r.stats.generated_tokens, 480)
        self.assertEqual(r.stats.finish_reason, "length")

    def test_a_stream_nobody_reads_is_reaped(self):
        stream = self.client.generate("Once", max_tokens=480, ignore_eos=True, stream=True,
                                      heartbeat_ms=10)
        next(stream)
        time.sleep(0.5)  # no KeepAlives while the consumer does not iterate
        with self.assertRaises(duet.DuetError) as e:
            for _ in stream:
                pass
        self.assertEqual(e.exception.name, "timeout", str(e.exception))
        st = self.wait_idle()
        self.assertEqual(st["engine"]["kv_pages_free"], st["engine"]["kv_pages_total"])

    def test_without_heartbeat_a_stream_nobody_reads_runs_to_its_end(self):
        stream = self.client.generate("Once", max_tokens=200, ignore_eos=True, stream=True,
                                      heartbeat_ms=0)
        chunks = [next(stream)]
        time.sleep(0.5)  # no KeepAlives, none promised
        chunks += list(stream)
        self.assertEqual(stream.result.stats.finish_reason, "length")
        self.assertEqual(sum(len(c.ids) for c in chunks), 200)

    def test_tokenize_and_detokenize_round_trip(self):
        ids, pieces = self.client.tokenize("Hello world")
        self.assertTrue(ids)
        self.assertEqual(b"".join(pieces), b"Hello world")
        self.assertEqual(self.client.detokenize(ids), "Hello world")
        with_bos, _ = self.client.tokenize("Hello world", add_special=True)
        self.assertEqual(with_bos[1:], ids)

    def test_bad_requests_raise_the_frontends_error(self):
        with self.assertRaises(duet.DuetError) as e:
            self.client.generate("x", max_tokens=100000)
        self.assertEqual(e.exception.name, "out_of_range")
        self.assertIn("max_tokens", e.exception.message)
        with self.assertRaises(duet.DuetError) as e:
            self.client.generate("x", priority="urgent")
        self.assertEqual(e.exception.name, "invalid_argument")
        with self.assertRaises(duet.DuetError) as e:
            duet.Client("pyclient_no_such_stack")
        self.assertEqual(e.exception.name, "unavailable")
        # The connection still serves after the errors.
        self.assertEqual(self.client.generate("x", max_tokens=2).stats.generated_tokens, 2)


class ResumeAfterAFrontendKill(unittest.TestCase):
    """Issue 22: kill -9 of the frontend mid-stream; the restarted frontend adopts the request
    from its journal and the client resumes: every token once, the undisturbed run's. Plan
    npu-only: its ~2.7 ms decode steps keep the frontend mid-generation when token 100 arrives."""

    STACK = f"pyresume_{os.getpid() % 100000}"

    @classmethod
    def setUpClass(cls):
        cls.addClassCleanup(subprocess.run, [os.path.join(BIN, "duet"), "stack", "down", "--stack",
                                             cls.STACK], capture_output=True, timeout=60)
        run_duet("stack", "up", "--stack", cls.STACK, "--plan", "npu-only")

    def frontend_pid(self) -> int:
        st = json.loads(run_duet("stack", "status", "--stack", self.STACK, "--json"))
        return next(s["pid"] for s in st["services"] if s["name"] == "frontend")

    def test_a_seeded_stream_survives_a_frontend_kill_with_every_token_once(self):
        args = dict(max_tokens=200, ignore_eos=True, temperature=0.9, top_p=0.95, seed=11)
        with duet.Client(self.STACK) as c:
            clean = c.generate("Q: Why", **args)
            self.assertEqual(len(clean.ids), 200)
            pid = self.frontend_pid()
            ids, text, killed = [], "", False
            stream = c.generate("Q: Why", stream=True, timeout=60, **args)
            for chunk in stream:
                ids += chunk.ids
                text += chunk.text
                if not killed and len(ids) >= 100:
                    os.kill(pid, 9)
                    killed = True
            self.assertTrue(killed)
            self.assertEqual(ids, clean.ids, "a token streamed twice or never")
            self.assertEqual(text, clean.text)
            self.assertEqual(stream.result.ids, clean.ids)
            self.assertGreaterEqual(c.reconnects, 1)
            journal = c.status()["journal"]
            self.assertEqual(journal["adopted_live"], 1, journal)
            self.assertEqual(journal["resumed"], 1, journal)


class TwoModelsOnARealStack(unittest.TestCase):
    """Issue 25: a stack of two models (tiny-fortune at Q8_0 as "fortune", the default, and at
    Q4_0 as "q4"); generate(model=...) and Client(model=...) pick one, as `duet generate
    --model-name` does; an unknown name raises not_found naming it and the served ones."""

    STACK = f"pymodels_{os.getpid() % 100000}"
    DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../data/tiny-fortune")

    @classmethod
    def setUpClass(cls):
        cls.addClassCleanup(subprocess.run, [os.path.join(BIN, "duet"), "stack", "down", "--stack",
                                             cls.STACK], capture_output=True, timeout=60)
        run_duet("stack", "up", "--stack", cls.STACK,
                 "--model", "fortune=" + os.path.join(cls.DATA, "fortune-q8_0.gguf"),
                 "--model", "q4=" + os.path.join(cls.DATA, "fortune-q4_0.gguf"))

    def native(self, *args: str) -> dict:
        out = run_duet("generate", "--stack", self.STACK, "--json", *args)
        return json.loads(out[out.index("{"):])

    def test_each_model_is_picked_by_name(self):
        with duet.Client(self.STACK) as c, duet.Client(self.STACK, model="q4") as q4:
            for name, client in (("fortune", c), ("q4", q4)):
                want = self.native("--model-name", name, "--max-tokens", "24", "Once upon a time")
                self.assertEqual(client.generate("Once upon a time", max_tokens=24).ids,
                                 want["ids"], name)
                self.assertEqual(c.generate("Once upon a time", max_tokens=24, model=name).ids,
                                 want["ids"], name)
            self.assertEqual(q4.tokenize("Once upon a time")[0],
                             c.tokenize("Once upon a time")[0], "one tokenizer file, two names")
            st = c.status()
            self.assertEqual(st["default_model"], "fortune")
            self.assertEqual(sorted(st["models"]), ["fortune", "q4"])
            self.assertEqual(st["models"]["q4"]["metrics"]["requests"]["completed"], 3)

    def test_an_unknown_model_raises_not_found_naming_it(self):
        with duet.Client(self.STACK) as c:
            with self.assertRaises(duet.DuetError) as e:
                c.generate("x", max_tokens=2, model="nope")
            self.assertEqual(e.exception.name, "not_found")
            self.assertIn("unknown model 'nope'", e.exception.message)
            self.assertIn("fortune, q4", e.exception.message)
            self.assertEqual(c.generate("x", max_tokens=2).stats.generated_tokens, 2)


if __name__ == "__main__":
    unittest.main()
