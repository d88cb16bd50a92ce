#!/usr/bin/python3
"""Soak (issue 22): N clients send short requests to a running stack for a bounded time while the
RSS and open fds of every process of the stack, its shm segments and its log bytes are sampled;
prints one JSON object with the samples and each series' least-squares slope per 1000 requests.

usage: PYTHONPATH=build/python /usr/bin/python3 bench/soak/soak.py --stack ID [--seconds 120]
       [--clients 4] [--samples 20]
"""
import argparse
import glob
import json
import os
import subprocess
import threading
import time

import duet


def stack_pids(duet_bin, stack):
    out = subprocess.run([duet_bin, "stack", "status", "--stack", stack, "--json"],
                         capture_output=True, text=True, check=True).stdout
    s = json.loads(out)
    pids = {"supervisor": s["pid"]}
    for svc in s["services"]:
        pids[svc["name"]] = svc["pid"]
    return pids, s["run_dir"]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def sample(pids, run_dir, stack, requests):
    row = {"t": time.time(), "requests": requests}
    for name, pid in pids.items():
        try:
            row[f"rss_kb.{name}"] = rss_kb(pid)
            row[f"fds.{name}"] = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:  # restarted or gone: the series would jump; report it
            row[f"gone.{name}"] = 1
    segs = glob.glob(f"/dev/shm/duet-{stack}-*")
    row["shm_segments"] = len(segs)
    row["shm_bytes"] = sum(os.path.getsize(p) for p in segs)
    row["log_bytes"] = sum(os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "*.log")))
    return row


def slope_per_1000(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", required=True)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--duet", default="build/bin/duet")
    a = ap.parse_args()
    pids, run_dir = stack_pids(a.duet, a.stack)
    prompts = ["Q: Why", "The", "It is", "A fool and his money"]
    done, errors, lock, stop = [0], [0], threading.Lock(), threading.Event()

    def client(i):
        c = duet.Client(a.stack)
        k = i
        while not stop.is_set():
            try:
                c.generate(prompts[k % len(prompts)], max_tokens=16)
                with lock:
                    done[0] += 1
            except duet.Error:
                with lock:
                    errors[0] += 1
            k += 1
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    rows = [sample(pids, run_dir, a.stack, 0)]
    for t in threads:
        t.start()
    for _ in range(a.samples):
        time.sleep(a.seconds / a.samples)
        with lock:
            n = done[0]
        rows.append(sample(pids, run_dir, a.stack, n))
    stop.set()
    for t in threads:
        t.join()
    # The first sample is before any request (the engine is built by the first one): slopes are
    # taken from the second on, over the steady run.
    steady = rows[1:]
    xs = [r["requests"] for r in steady]
    keys = [k for k in steady[0] if k.split(".")[0] in ("rss_kb", "fds") or k.startswith(("shm_", "log_"))]
    slopes = {k: round(slope_per_1000(xs, [r.get(k, 0) for r in steady]), 3) for k in keys}
    print(json.dumps({"stack": a.stack, "seconds": a.seconds, "clients": a.clients,
                      "requests": done[0], "errors": errors[0],
                      "slope_per_1000_requests": slopes, "first": rows[1], "last": rows[-1],
                      "samples": rows}))


if __name__ == "__main__":
    main()
