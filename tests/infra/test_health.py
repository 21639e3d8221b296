"""areal/infra/health.is_healthy against real sockets: a 200, a 503, nothing listening, and a peer
that sends its own request back instead of an answer (what a probe reads when it connects to
itself, found in CI as http.client.BadStatusLine)."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from areal.infra.health import is_healthy


def serve(handler) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


def answering(status: int):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    return Handler


def test_a_200_is_healthy_and_a_503_is_not():
    for status, healthy in ((200, True), (503, False)):
        server, addr = serve(answering(status))
        try:
            assert is_healthy(addr) is healthy
        finally:
            server.shutdown()
            server.server_close()


def test_nothing_listening_is_not_healthy():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        assert is_healthy(f"127.0.0.1:{port}") is False


def test_a_peer_that_echoes_the_request_is_not_healthy():
    """Its first line is 'GET /health HTTP/1.1', which http.client rejects as a status line."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def echo_once():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(conn.recv(4096))

    echo = threading.Thread(target=echo_once, daemon=True)
    echo.start()
    try:
        assert is_healthy(f"127.0.0.1:{listener.getsockname()[1]}") is False
    finally:
        echo.join(timeout=10)
        listener.close()
