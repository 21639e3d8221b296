"""An abort-mode pause drains this process's open /generate requests first (ServerControl.drain):
it aborts through /abort_request, again every DRAIN_RECHECK_S, until every watched request has
its answer, and only then sends /pause_generation. Against a real built-in server."""

import threading

import requests

from areal.api.weights import WeightUpdateMeta
from areal.engine.sglang import control as control_module
from areal.engine.sglang import protocol
from areal.engine.sglang.control import OpenRequests, ServerControl
from areal.models.tiny import make_tiny_model_dir
from tests.serving import server_load, start_server, wait_for

LONG = 30000  # new tokens: the request can only end by an abort here


class HookedControl(ServerControl):
    """The real control; `after_first_abort` (the test's hook) runs once, after its first abort."""

    def __init__(self, *args, after_first_abort, **kwargs):
        super().__init__(*args, **kwargs)
        self._hook = after_first_abort

    def post_all(self, route, body_of, **kwargs):
        answers = super().post_all(route, body_of, **kwargs)
        if route == protocol.ABORT and self._hook is not None:
            hook, self._hook = self._hook, None
            hook()
        return answers


def test_a_request_that_reaches_the_server_after_the_first_abort_is_aborted_by_a_later_one(tmp_path, monkeypatch):
    monkeypatch.setattr(control_module, "DRAIN_TIMEOUT_S", 300.0)  # only a hang may end the drain
    model = make_tiny_model_dir(tmp_path / "long", max_position=LONG + 64)
    handle = start_server(str(model), env={"OMP_NUM_THREADS": "1"})
    addr = f"127.0.0.1:{handle.port}"
    first_abort_sent, answer = threading.Event(), {}

    def release_the_late_request():  # sent now, it must be running before the drain goes on
        first_abort_sent.set()
        wait_for(lambda: server_load(f"http://{addr}")["running"] == 1, "the late request running")

    control = HookedControl([addr], pause_mode="abort", after_first_abort=release_the_late_request)
    late = OpenRequests()
    control.watch_requests(late)

    def post_after_the_first_abort():
        with late.posted():  # open from here: the pause must drain it
            first_abort_sent.wait(300)
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
            answer.update(requests.post(f"http://{addr}/generate", json=body, timeout=300).json())

    client = threading.Thread(target=post_after_the_first_abort)
    client.start()
    try:
        wait_for(lambda: late.count == 1, "the request open")
        report = control.pause()
        client.join(300)
        assert report["requests_drained"] == 1 and report["drain_aborts"] >= 2
        assert answer["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(answer["output_ids"]) < LONG and late.count == 0
        # nothing left for /pause_generation: asked for retract (test_control_abort_pause.py), it held nothing
        assert report["pause_sent_as_retract"] == 1.0 and report["requests_held"] == 0
        control.resume()
    finally:
        first_abort_sent.set()
        client.join(300)
        control.close()
        handle.stop()


def test_a_pause_started_ahead_drains_while_the_caller_works_and_the_update_waits_for_it(tmp_path):
    """rollout.pause_ahead_minibatches: pause_ahead starts the pause in the background (here it
    aborts a request that can only end by an abort, while this thread goes on); the weight update
    then waits for that pause instead of pausing, reports it, and continues the server."""
    model = make_tiny_model_dir(tmp_path / "long", max_position=LONG + 64)
    handle = start_server(str(model), env={"OMP_NUM_THREADS": "1"})
    addr = f"127.0.0.1:{handle.port}"
    control = ServerControl([addr], pause_mode="abort")
    open_requests, answer = OpenRequests(), {}
    control.watch_requests(open_requests)

    def post_a_long_request():
        with open_requests.posted():
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
            answer.update(requests.post(f"http://{addr}/generate", json=body, timeout=300).json())

    client = threading.Thread(target=post_a_long_request)
    client.start()
    try:
        wait_for(lambda: server_load(f"http://{addr}")["running"] == 1, "the long request running")
        control.pause_ahead()
        control.pause_ahead()  # one is under way: nothing more
        client.join(300)  # answered by the pause's drain, which this thread did not wait for
        assert answer["meta_info"]["finish_reason"]["type"] == "abort" and control.paused
        with control.weight_update(WeightUpdateMeta("disk")) as update:
            pass  # no load: the pause and the continue around it are what is tested
        report = update.report
        assert report["requests_drained"] == 1 and report["drain_aborts"] >= 1
        assert 0 <= report["pause_s"] and report["pause_ahead_s"] >= report["drain_s"] > 0
        assert not control.paused
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
        after = requests.post(f"http://{addr}/generate", json=body, timeout=60).json()
        assert after["meta_info"]["finish_reason"]["type"] == "length"  # generating again
        control.pause_ahead()  # the next update's pause, ahead again: a fresh one
        with control.weight_update(WeightUpdateMeta("disk")) as update:
            pass
        assert "pause_ahead_s" in update.report and "requests_drained" not in update.report  # nothing open
    finally:
        client.join(300)
        control.close()
        handle.stop()
