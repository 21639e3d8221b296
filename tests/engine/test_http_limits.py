"""areal/engine/sglang/http.py at a process's open-file limit: a connection that cannot be made for
want of a descriptor is an error naming the limit at once, not a connection error retried with
backoff until it reads 'unreachable; is the server still running?'."""

import subprocess
import sys

CODE = """
import asyncio, resource, socket
import aiohttp
from areal.engine.sglang.http import ServerError, apost_json

server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(8)
port = server.getsockname()[1]

async def main():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(socket.socket())  # every descriptor left
    except OSError:
        pass
    try:
        await apost_json(f"127.0.0.1:{port}", "/generate", {}, timeout=30, retries=3)
    except ServerError as e:
        print(e)

asyncio.run(main())
"""


def test_out_of_descriptors_names_the_limit_without_retrying():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "this process is out of open files (RLIMIT_NOFILE 256" in r.stdout
    assert "rollout.max_concurrent_rollouts x gconfig.n_samples" in r.stdout and "unreachable" not in r.stdout
