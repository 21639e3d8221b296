"""The built-in server short of and out of open files while clients connect (areal/server/connections.py):
connections are closed after their response rather than kept idle, the ones that come at the limit
wait in the listen queue, and one warning names the limit (not asyncio's traceback per accept())."""

import resource
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.serving import server_load, start_server, wait_for

HELD = 40  # connections held open, well past the descriptors the server is left with


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_short_of_files_closes_connections_and_out_of_files_holds_them_in_the_queue(tiny_model_dir):
    server = start_server(tiny_model_dir, extra_args=["--log-level", "warning"])
    held: list[socket.socket] = []
    try:
        # with descriptors to spare, connections stay alive
        assert requests.get(server.url + "/health", timeout=60).headers.get("Connection") != "close"
        pid = server.proc.pid
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + 8, hard))  # room for a few connections
        # short of them, each answer closes its connection (and says so: the client does not reuse it)
        with requests.Session() as session:
            for _ in range(3):
                answer = session.get(server.url + "/health", timeout=60)
                assert answer.status_code == 200 and answer.headers.get("Connection") == "close"
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(HELD)]
        wait_for(lambda: "cannot accept connections" in server.log(), "the server's out-of-files warning")
        with ThreadPoolExecutor(1) as pool:
            # a request that connects while the server is out of files waits in the listen queue
            late = pool.submit(requests.get, server.url + "/health", timeout=120)
            for s in held:
                s.close()
            held = []
            assert late.result().status_code == 200
        assert server_load(server.url)["accept_out_of_files"] > 0
        log = server.log()
        warning = next(line for line in log.splitlines() if "cannot accept connections" in line)
        assert "RLIMIT_NOFILE" in warning and "ulimit -n" in warning, warning
        assert "Too many open files" in warning, warning
        # asyncio alone logs a traceback for each of up to `backlog` (here 1,088) accept() attempts
        # per wake-up; the guard says it once per 10 s
        assert "socket.accept() out of system resource" not in log, log[-3000:]
        assert log.count("cannot accept connections") < 10, log[-3000:]
    finally:
        for s in held:
            s.close()
        assert server.stop() == 0, server.log()
