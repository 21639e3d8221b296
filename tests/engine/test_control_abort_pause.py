"""An abort-mode pause for a weight update, once the drain has every watched request answered,
asks the servers for retract (ServerControl._server_pause_mode): SGLang 0.5.16's abort pause would
sleep a second while its request handlers let go of their lock. It must still hold nothing, as
abort promises: what no watched client posted is aborted after the retract, and a flush refused
after the update aborts what is held and is asked again. A pause before a memory release keeps
the servers' own abort. Against a real built-in server."""

import contextlib
import threading

import pytest
import requests

from areal.api.weights import WeightUpdateMeta
from areal.engine.sglang import protocol
from areal.engine.sglang.control import OpenRequests, ServerControl
from areal.models.tiny import make_tiny_model_dir
from tests.serving import server_load, start_server, wait_for

LONG = 30000  # new tokens: the request can only end by an abort here


def long_body() -> dict:
    return {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}


class Served:
    """A built-in server of a tiny model that can hold a LONG answer, and requests posted to it
    from threads (`post(watched)`: counted by `watched`, an OpenRequests, or by nobody)."""

    def __init__(self, tmp_path):
        self.model = make_tiny_model_dir(tmp_path / "long", max_position=LONG + 64)
        self.handle = start_server(str(self.model), env={"OMP_NUM_THREADS": "1"})
        self.addr = f"127.0.0.1:{self.handle.port}"
        self.url = f"http://{self.addr}"
        self.answers: list[dict] = []
        self.threads: list[threading.Thread] = []

    def post(self, watched: OpenRequests | None = None) -> None:
        def run():
            with watched.posted() if watched is not None else contextlib.nullcontext():
                self.answers.append(requests.post(f"{self.url}/generate", json=long_body(), timeout=300).json())

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(300)

    def stop(self) -> None:
        self.join()
        self.handle.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module's tests (a start costs seconds on 2 cores); each test continues
    it if it is left paused and starts with no answers of its own."""
    server = Served(tmp_path_factory.mktemp("abort_pause"))
    yield server
    server.stop()


@pytest.fixture
def served(server):
    server.join()
    server.answers.clear()
    server.threads.clear()
    yield server
    requests.post(f"{server.url}{protocol.CONTINUE}", json={}, timeout=30).raise_for_status()
    server.join()


@pytest.fixture
def control(served):
    """The control under test, abort mode; closed before the server stops."""
    control = ServerControl([served.addr], pause_mode="abort")
    yield control
    control.close()


def running(url: str, n: int) -> bool:
    return server_load(url)["running"] == n


def held_nothing(url: str) -> bool:
    load = server_load(url)
    return load["running"] == 0 and load["waiting"] == 0


def test_a_drained_pause_asks_for_retract_and_the_update_flushes(served, control):
    watched = OpenRequests()
    control.watch_requests(watched)
    served.post(watched)
    wait_for(lambda: running(served.url, 1), "the watched request running")
    with control.weight_update(WeightUpdateMeta("disk", version=1)) as update:
        assert server_load(served.url)["paused"] == "retract" and held_nothing(served.url)
        update.load_disk(str(served.model))
    report = update.report
    assert report["requests_drained"] == 1 and report["pause_sent_as_retract"] == 1.0
    assert report["requests_held"] == 0  # the drain had answered it: retract found nothing
    assert report["flush_s"] >= 0  # the flush after the update was accepted
    served.join()
    assert served.answers[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert not control.paused and control.get_version() == 1


def test_a_request_no_client_watches_is_aborted_not_held(served, control):
    control.watch_requests(OpenRequests())  # a client with nothing open: the drain has nothing to do
    served.post()  # posted behind the watched clients' back
    wait_for(lambda: running(served.url, 1), "the unwatched request running")
    report = control.pause()
    assert report["pause_sent_as_retract"] == 1.0 and report["requests_held"] == 1  # retracted...
    served.join()  # ... then aborted: its answer came back
    assert served.answers[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert held_nothing(served.url)
    control.resume()


def test_the_flush_after_a_drained_pause_aborts_a_request_held_since(served, control):
    """The race the abort after the retract cannot close: a request that reached the server's
    queue after it. Here one is put there by hand (continue, post, retract); the flush's own abort
    answers it, and the flush is accepted without waiting for it."""
    control.watch_requests(OpenRequests())
    with control.weight_update(WeightUpdateMeta("disk", version=1)) as update:
        assert update.report["pause_sent_as_retract"] == 1.0
        requests.post(f"{served.url}{protocol.CONTINUE}", json={}, timeout=30).raise_for_status()
        served.post()
        wait_for(lambda: running(served.url, 1), "the late request running")
        answer = requests.post(f"{served.url}{protocol.PAUSE}", json={"mode": "retract"}, timeout=30).json()
        assert answer["requests_held"] == 1  # held in the queue: a flush now is refused
        update.load_disk(str(served.model))
    served.join()
    assert served.answers[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert update.report["flush_s"] > 0 and control.get_version() == 1


def test_a_pause_before_a_memory_release_or_without_watched_clients_keeps_abort(served, control):
    served.post()
    wait_for(lambda: running(served.url, 1), "the request running")
    report = control.pause()  # no client watched: nothing says what runs on the servers
    assert report["pause_sent_as_retract"] == 0.0 and report["requests_aborted"] == 1
    control.resume()
    control.watch_requests(OpenRequests())
    served.post()
    wait_for(lambda: running(served.url, 1), "the second request running")
    report = control.pause(mode="abort", then_release=True)
    assert report["pause_sent_as_retract"] == 0.0 and report["requests_aborted"] == 1
    served.join()
    assert [a["meta_info"]["finish_reason"]["type"] for a in served.answers] == ["abort", "abort"]
    control.resume()
