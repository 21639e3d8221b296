"""areal/infra/sockets.py: the listen backlog warns below net.core.somaxconn, the open-file limit is
raised to the hard limit and a need above it is an error naming both and the keys, and the
ListenOverflows counter it reads is the kernel's (a full accept queue makes it rise)."""

import logging
import socket
import subprocess
import sys
import time

import pytest

from areal.infra import sockets


def test_backlog_follows_the_concurrency_and_warns_under_somaxconn(tmp_path, monkeypatch, caplog):
    cap = tmp_path / "somaxconn"
    cap.write_text("4096\n")
    monkeypatch.setattr(sockets, "SOMAXCONN_PATH", str(cap))
    assert sockets.listen_backlog(10, what="x", keys="k") == sockets.MIN_BACKLOG
    with caplog.at_level(logging.WARNING, logger="areal.infra.sockets"):
        assert sockets.listen_backlog(2048, what="the proxy", keys="a x b") == 2048
    assert not caplog.records
    cap.write_text("64\n")
    with caplog.at_level(logging.WARNING, logger="areal.infra.sockets"):
        assert sockets.listen_backlog(512, what="the proxy", keys="a x b") == 512
    (record,) = caplog.records
    assert "512 connections at once (a x b)" in record.message and "net.core.somaxconn=64" in record.message


def test_open_file_limit_is_raised_and_a_need_above_the_hard_limit_is_named():
    code = """
import resource
from areal.infra.sockets import OpenFileLimitError, raise_open_file_limit
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))
print(raise_open_file_limit(300), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
try:
    raise_open_file_limit(2000, what="trainer rank 0", keys="rollout.max_concurrent_rollouts x gconfig.n_samples")
except OpenFileLimitError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, message = out.splitlines()[0], out.splitlines()[1]
    assert first == "512 512"
    assert "trainer rank 0 needs about 2000 open files" in message and "hard limit" in message
    assert "is 512" in message and "lower rollout.max_concurrent_rollouts x gconfig.n_samples" in message


def test_listen_overflows_counts_a_full_accept_queue():
    before = sockets.listen_overflows()
    if before is None:
        pytest.skip("no /proc/net/netstat here")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)  # the smallest accept queue, never accepted from
    clients = []
    try:
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(server.getsockname())
            clients.append(c)
        deadline = time.monotonic() + 10
        while sockets.listen_overflows() == before and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for c in clients:
            c.close()
        server.close()
    assert sockets.listen_overflows() > before
