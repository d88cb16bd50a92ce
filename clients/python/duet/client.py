"""The Python client of a stack's frontend: schemas/client.fbs over a ZeroMQ DEALER on
ipc://<run dir>/frontend.sock, the protocol of the C++ client (core/ipc/client.h).

Every call has a deadline. While a generation runs the client sends the frontend a KeepAlive
every third of `heartbeat_ms` (default 1000; the frontend cancels a request whose KeepAlives stop
for 3 x heartbeat_ms, so a killed client never holds KV pages). A stream sends them while it is
being iterated: a consumer that stops reading for longer than that loses its request (it is
reaped with a `timeout` error); pass heartbeat_ms=0 to opt out (the request then runs to its
end even when nobody listens).

A killed frontend does not end a generation (issue 22): the client's socket has a random, stable
identity, a socket monitor sees the frontend go and come back, and the client then sends Resume
(ids and text bytes received so far) for every generation in flight; the restarted frontend,
which adopted them from its request journal, streams the rest: no token twice, none missing.
As core/ipc/client.h: KeepAlives pause until the Resume is answered (an empty chunk, never shown),
an `unavailable` error meanwhile is a KeepAlive's answer and skipped, a request the new
frontend never saw is sent again when nothing of it had arrived, and a frontend that stays away
longer than resume_timeout (30 s) fails the generation with `unavailable`."""

import json
import os
import re
import stat
import time
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import zmq

from duet import _wire
from duet._wire import Chunk, Event, Result
from duet.errors import DuetError
from duet.fb.Code import Code

_STACK_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_MAX_MESSAGE_BYTES = 64 << 20  # msg::kMaxMessageBytes (core/ipc/messaging.h)
_UNIX_PATH_MAX = 107  # sockaddr_un.sun_path less its terminating zero


def run_root() -> str:
    """$DUET_RUN_ROOT, else $XDG_RUNTIME_DIR/duet, else /tmp/duet-<uid> (core/ipc/run_dir.h)."""
    if os.environ.get("DUET_RUN_ROOT"):
        return os.environ["DUET_RUN_ROOT"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "duet")
    return f"/tmp/duet-{os.getuid()}"


def stack_endpoint(stack: str = "default", run_dir: Optional[str] = None) -> str:
    """ipc://<run dir>/frontend.sock of a stack; DuetError(unavailable) naming the stack when it
    has no such socket (the stack is down)."""
    if not _STACK_ID.match(stack):
        raise DuetError(Code.InvalidArgument,
                        f"stack id '{stack}': use 1-32 characters from [A-Za-z0-9_-]")
    path = os.path.join(run_dir or os.path.join(run_root(), stack), "frontend.sock")
    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        raise DuetError(Code.Unavailable, f"stack '{stack}' has no frontend socket {path} "
                        f"(is it up? `duet stack up --stack {stack}`)")
    if len(path.encode()) > _UNIX_PATH_MAX:
        raise DuetError(Code.InvalidArgument, f"socket path {path} is too long for a unix socket")
    return "ipc://" + path


Message = Union[dict, Tuple[str, str]]


class Stream:
    """An iterator over the Chunks of one streaming generation. After the last chunk `result`
    holds the Result (the whole text, ids and stats). close() (or leaving a `with` block, or
    breaking out of a for loop and dropping the stream) cancels a request still running."""

    def __init__(self, client: "Client", request_id: int, heartbeat_ms: int, deadline: float):
        self._client = client
        self.request_id = request_id
        self.result: Optional[Result] = None
        self.heartbeat_ms = heartbeat_ms
        self.deadline = deadline
        self.next_beat = time.monotonic() + heartbeat_ms / 3000.0

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        if self.result is not None:
            raise StopIteration
        e = self._client._next_of_generation(self)
        if e.kind == "done":
            self.result = e.done
            raise StopIteration
        return e.chunk

    def text(self) -> Iterator[str]:
        """The stream as text pieces."""
        for c in self:
            if c.text:
                yield c.text

    def close(self) -> None:
        """Cancels the request if it still runs and waits (2 s at most) for the frontend's word,
        so its KV pages are free when this returns."""
        if self.result is None:
            self.result = self._client._cancel_and_wait(self.request_id)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # the client may be closed already; its frontend reaps the request
            pass


class Client:
    """A connection to one stack's frontend. Not thread-safe: one Client per thread."""

    def __init__(self, stack: str = "default", run_dir: Optional[str] = None,
                 endpoint: Optional[str] = None, model: str = ""):
        self.endpoint = endpoint or stack_endpoint(stack, run_dir)
        # Which of the stack's models every call names unless generate() names its own (issue
        # 25); "" = the stack's default (its first).
        self.model = model
        self._ctx = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.DEALER)
        # As core/ipc/client.cpp: no lingering, requests queue until the connection is up (set
        # before connect), quick reconnects, the frontend's message size limit, bounded sends.
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 0)
        self._socket.setsockopt(zmq.RECONNECT_IVL, 20)
        self._socket.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        self._socket.setsockopt(zmq.MAXMSGSIZE, _MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.SNDTIMEO, 2000)
        # Resuming: a stable identity (ZeroMQ reserves ids that start with a zero byte) and the
        # socket's connect/disconnect events, both before connect.
        first = os.urandom(1)[0] % 255 + 1
        self._socket.setsockopt(zmq.IDENTITY, bytes([first]) + os.urandom(15))
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED
                                                        | zmq.EVENT_DISCONNECTED)
        self._socket.connect(self.endpoint)
        self._next_id = 1
        self._live = set()  # ids of requests that may still get events
        self._pending: List[Event] = []  # events read while waiting for another request
        # generations in flight: id -> [Generate bytes, ids received, text bytes, resuming, model]
        self._inflight = {}
        self._lost_since: Optional[float] = None
        self.resume_timeout = 30.0
        self.reconnects = 0

    def close(self) -> None:
        if self._socket is not None:
            try:
                self._socket.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
            self._socket = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- generation ----------------------------------------------------------------------------

    def generate(self, prompt: Optional[str] = None, *, prompt_ids: Sequence[int] = (),
                 max_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop: Union[str, Sequence[str]] = (),
                 priority: str = "reactive", plan: str = "", ignore_eos: bool = False,
                 parse_special: bool = False, session: int = 0, stream: bool = False,
                 heartbeat_ms: int = 1000, timeout: float = 600.0,
                 messages: Sequence[Message] = (),
                 chat_template: str = "", model: str = "", logprobs: int = -1,
                 prompt_logprobs: bool = False) -> Union[Result, Stream]:
        """Generates from a text prompt (the frontend tokenises it, BOS as the vocab says) or from
        prompt_ids. temperature 0 is greedy. stream=False returns the Result; stream=True
        returns a Stream of Chunks (its `result` is set once it ends). Raises DuetError with the
        frontend's code: busy (queue full), invalid_argument (naming the field), timeout,
        not_found (a model the stack does not serve, named with the served ones).
        logprobs=N (0-20): each generated token's log-probability under the model's distribution
        and the N likeliest tokens' (Result.logprobs, Chunk.logprobs); prompt_logprobs: every
        prompt token's given the ones before it (Result.prompt_logprobs; max_tokens may be 0)."""
        if prompt is None and not prompt_ids and not messages:
            raise DuetError(Code.InvalidArgument, "generate: give a prompt, prompt_ids or messages")
        rid = self._new_id()
        model = model or self.model
        self._send_generate(
            rid, model,
            _wire.encode_generate(rid, prompt=prompt, prompt_ids=list(prompt_ids),
                                  messages=[_message(m) for m in messages],
                                  temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                  max_tokens=max_tokens,
                                  stop=[stop] if isinstance(stop, str) else list(stop),
                                  priority=priority, stream=stream, plan=plan, session=session,
                                  heartbeat_ms=heartbeat_ms, ignore_eos=ignore_eos,
                                  chat_template=chat_template, parse_special=parse_special,
                                  model=model, logprobs=logprobs,
                                  prompt_logprobs=prompt_logprobs))
        self._live.add(rid)
        s = Stream(self, rid, heartbeat_ms, time.monotonic() + timeout)
        if stream:
            return s
        for _ in s:
            pass
        return s.result

    def chat(self, messages: Sequence[Message], *, chat_template: str = "",
             **kwargs) -> Union[Result, Stream]:
        """Generates the assistant's reply to `messages` ({"role": system|user|assistant,
        "content": text} or (role, content)), formatted by the model's chat template (or the
        family `chat_template` names). Other arguments as generate(); with session=N the frontend
        keeps the conversation and each turn sends only its new messages."""
        if not messages:
            raise DuetError(Code.InvalidArgument, "chat: messages must not be empty")
        return self.generate(messages=messages, chat_template=chat_template, **kwargs)

    def cancel(self, request_id: int) -> None:
        """Asks the frontend to stop a request of this client (its Done says "cancelled")."""
        self._send(_wire.encode_cancel(request_id))

    def close_session(self, session: int, timeout: float = 5.0) -> None:
        """Ends a chat session and frees its KV cache."""
        rid = self._new_id()
        self._send(_wire.encode_close_session(rid, session, self.model))
        self._expect(rid, "done", time.monotonic() + timeout, "CloseSession")

    # -- the stack -----------------------------------------------------------------------------

    def status(self, timeout: float = 5.0) -> dict:
        """The frontend's status (`duet status --json`'s frontend part): queue by priority,
        running requests, limits, engine (KV pages), agent, metrics."""
        rid = self._new_id()
        self._send(_wire.encode_status(rid))
        return json.loads(self._expect(rid, "status", time.monotonic() + timeout, "Status").value)

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False,
                 timeout: float = 5.0) -> Tuple[List[int], List[bytes]]:
        """The stack's tokenizer: (ids, pieces), pieces[i] the bytes ids[i] stands for (maybe
        part of a UTF-8 character). add_special: BOS/EOS as the vocab says."""
        rid = self._new_id()
        self._send(_wire.encode_tokenize(rid, text, add_special, parse_special, self.model))
        return self._expect(rid, "tokenize", time.monotonic() + timeout, "Tokenize").value

    def detokenize(self, ids: Iterable[int], timeout: float = 5.0) -> str:
        rid = self._new_id()
        self._send(_wire.encode_detokenize(rid, list(ids), self.model))
        text = self._expect(rid, "detokenize", time.monotonic() + timeout, "Detokenize").value
        return text.decode("utf-8", errors="replace")

    # -- the socket ----------------------------------------------------------------------------

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def _send(self, data: bytes) -> None:
        if self._socket is None:
            raise DuetError(Code.Unavailable, "the client is closed")
        try:
            self._socket.send(data)
        except zmq.Again as e:
            raise DuetError(Code.Unavailable,
                            f"cannot send to the frontend at {self.endpoint} within 2 s (its queue "
                            "is full or it is not accepting connections)") from e

    def _send_generate(self, rid: int, model: str, data: bytes) -> None:
        self._inflight[rid] = [data, 0, 0, False, model]
        try:
            self._send(data)
        except DuetError:
            del self._inflight[rid]
            raise

    def _read_monitor(self) -> None:
        while self._monitor.poll(0, zmq.POLLIN):
            frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            event = int.from_bytes(frames[0][:2], "little") if frames and frames[0] else 0
            if event == zmq.EVENT_DISCONNECTED:
                if self._lost_since is None:
                    self._lost_since = time.monotonic()
            elif event == zmq.EVENT_CONNECTED and self._lost_since is not None:
                self._lost_since = None
                self.reconnects += 1
                for rid, f in self._inflight.items():
                    f[3] = True
                    self._send(_wire.encode_resume(rid, f[1], f[2], f[4]))

    def _track(self, e: Event) -> Optional[Event]:
        f = self._inflight.get(e.request_id)
        if f is None:
            return e
        if e.kind == "chunk":
            f[3] = False
            f[1] += len(e.chunk.ids)
            f[2] += e.chunk.text_bytes
            return e if (e.chunk.ids or e.chunk.text_bytes) else None  # empty: a Resume's ack
        if e.kind == "error":
            if f[3] and e.error.code == Code.Unavailable:
                return None  # a KeepAlive sent before the Resume, answered by the new frontend
            if f[3] and e.error.code == Code.NotFound and f[1] == 0 and f[2] == 0:
                f[3] = False  # the new frontend never saw it and nothing arrived: send it again
                self._send(f[0])
                return None
        if e.kind in ("error", "done"):
            del self._inflight[e.request_id]
        return e

    def _expire_lost(self) -> Optional[Event]:
        if (self._lost_since is None or not self._inflight
                or time.monotonic() - self._lost_since < self.resume_timeout):
            return None
        rid = next(iter(self._inflight))
        del self._inflight[rid]
        return Event("error", rid, error=DuetError(
            Code.Unavailable, f"request {rid}: the frontend at {self.endpoint} went away and no "
            f"frontend came back within {self.resume_timeout:g} s to resume it"))

    def _recv(self, timeout_s: float) -> Optional[Event]:
        """The next event (of any request), or None when timeout_s passed without one."""
        if self._socket is None:
            raise DuetError(Code.Unavailable, "the client is closed")
        end = time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            lost = self._expire_lost()
            if lost is not None:
                return lost
            ready = dict(poller.poll(max(0, int((end - time.monotonic()) * 1000))))
            if self._monitor in ready:
                self._read_monitor()
            if self._socket in ready:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
                e = self._track(_wire.decode(frames[-1]))  # the last frame: the message
                if e is not None:
                    return e
            if time.monotonic() >= end:
                return self._expire_lost()

    def _take(self, rid: int, timeout_s: float) -> Optional[Event]:
        """The next event of request rid; events of other live requests wait in _pending."""
        for i, e in enumerate(self._pending):
            if e.request_id == rid:
                return self._pending.pop(i)
        end = time.monotonic() + timeout_s
        while True:
            e = self._recv(max(0.0, end - time.monotonic()))
            if e is None:
                return None
            if e.request_id == rid:
                return e
            if e.request_id in self._live:
                self._pending.append(e)
            # else: a late answer (a KeepAlive's "not running" after Done): nobody waits for it

    def _expect(self, rid: int, kind: str, deadline: float, what: str) -> Event:
        self._live.add(rid)
        try:
            while True:
                left = deadline - time.monotonic()
                e = self._take(rid, left) if left > 0 else None
                if e is None:
                    raise DuetError(Code.Timeout, f"no {what} reply from the frontend at "
                                    f"{self.endpoint} before the deadline")
                if e.kind == "error":
                    raise e.error
                if e.kind == kind:
                    return e
        finally:
            self._live.discard(rid)

    def _next_of_generation(self, s: Stream) -> Event:
        """The next chunk or done of a generation, sending KeepAlives while it waits."""
        rid, beat = s.request_id, max(s.heartbeat_ms / 3000.0, 0.001)
        while True:
            now = time.monotonic()
            if now >= s.deadline:
                self._inflight.pop(rid, None)
                self._cancel_and_wait(rid)
                raise DuetError(Code.Timeout,
                                f"generate: no Done from the frontend at {self.endpoint} before "
                                "the deadline (the request was cancelled)")
            if s.heartbeat_ms > 0 and now >= s.next_beat:
                f = self._inflight.get(rid)
                if f is None or not f[3]:  # not while a Resume is unanswered
                    self._send(_wire.encode_keep_alive(rid))
                s.next_beat = now + beat
            wait = s.next_beat - now if s.heartbeat_ms > 0 else 0.1
            e = self._take(rid, max(0.001, min(wait, s.deadline - now)))
            if e is None:
                continue
            if e.kind == "error":
                self._live.discard(rid)
                raise e.error
            if e.kind == "done":
                self._live.discard(rid)
                return e
            if e.kind == "chunk":
                return e

    def _cancel_and_wait(self, rid: int) -> Optional[Result]:
        if rid not in self._live or self._socket is None:
            return None
        try:
            self.cancel(rid)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                e = self._take(rid, end - time.monotonic())
                if e is None:
                    break
                if e.kind == "done":
                    return e.done
                if e.kind == "error":
                    break
        finally:
            self._live.discard(rid)
        return None


def _message(m: Message) -> dict:
    if isinstance(m, dict):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DuetError(Code.InvalidArgument,
                            f"chat message {m!r}: 'role' and 'content' must be strings")
        return m
    role, content = m
    return {"role": role, "content": content}
