"""What a pause reads from the servers' /v1/loads: the requests they ran or queued. A server
that has no such route (SGLang before /v1/loads, or another program) is asked once, and the pause
goes on without the count."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from areal.engine.sglang.control import OpenRequests, ServerControl
from tests.serving import start_server


class NoLoadsHandler(BaseHTTPRequestHandler):
    """A real HTTP server that knows no /v1/loads and counts what it was asked."""

    asked: list[str] = []

    def do_GET(self):
        type(self).asked.append(self.path)
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"detail": "Not Found"}')

    def log_message(self, *args):
        pass


@pytest.fixture
def no_loads_server():
    NoLoadsHandler.asked = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NoLoadsHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_server_without_the_route_is_asked_once(no_loads_server):
    control = ServerControl([no_loads_server], pause_mode="abort")
    try:
        assert control.requests_in_flight() is None
        assert control.requests_in_flight() is None
        assert NoLoadsHandler.asked == ["/v1/loads?include=core"]  # refused once, not asked again
    finally:
        control.close()


def test_an_idle_builtin_server_reports_none_in_flight(tiny_model_dir):
    import requests

    handle = start_server(tiny_model_dir, env={"OMP_NUM_THREADS": "1"})
    control = ServerControl([f"127.0.0.1:{handle.port}"], pause_mode="abort")
    try:
        url = f"http://127.0.0.1:{handle.port}/v1/loads"
        (load,) = requests.get(url, timeout=30).json()["loads"]  # SGLang's shape, one scheduler
        assert (load["dp_rank"], load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 0, 0)
        refused = requests.get(url, params={"include": "core,kv"}, timeout=30)
        assert refused.status_code == 400 and "kv" in refused.json()["error"]["message"]
        report = control.pause()
        assert report["requests_in_flight"] == 0 and report["requests_aborted"] == 0
        assert "requests_drained" not in report  # nothing watched was open: no /abort_request first
        control.resume()
    finally:
        control.close()
        handle.stop()


def test_open_requests_are_counted_until_answered_across_threads():
    requests = OpenRequests()
    entered, release = threading.Event(), threading.Event()

    def post():
        with requests.posted():
            entered.set()
            release.wait(30)

    worker = threading.Thread(target=post)
    worker.start()
    assert entered.wait(30)
    assert requests.count == 1
    assert requests.wait_none(0.0) is False  # still open: the wait gives up at its deadline
    release.set()
    assert requests.wait_none(30) is True
    worker.join(30)
    assert requests.count == 0
