"""duet's Python client: the native client API of a stack (flatbuffers over ZeroMQ, what `duet
generate` speaks), for Debian's python3-zmq and python3-flatbuffers.

    import duet
    with duet.Client("default") as c:                  # the stack id of `duet stack up --stack`
        print(c.generate("Once upon a time", max_tokens=24).text)
        for piece in c.generate("The cat", stream=True).text():
            print(piece, end="", flush=True)
        print(c.chat([{"role": "user", "content": "Tell me a fortune"}]).text)
        print(c.status()["queue"])

The package is assembled in the build tree (build/python/duet: these files beside the code
`flatc --python` generates from schemas/*.fbs): PYTHONPATH=build/python /usr/bin/python3."""

from duet._wire import Chunk, Result, Stats, TokenLogprob, TokenProb
from duet.client import Client, Stream, run_root, stack_endpoint
from duet.errors import DuetError, code_name

__all__ = [
    "Client", "Stream", "Chunk", "Result", "Stats", "TokenLogprob", "TokenProb", "DuetError",
    "code_name", "run_root", "stack_endpoint"
]
