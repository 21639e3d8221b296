"""FSDPEngine.update_weights pushes into the sink its caller opened (`with
control.weight_update(meta) as sink`, as a time-shared step does to resume the server's memory
around the load) and leaves pause and continue to the caller.

It once took the WeightUpdate's `.control` for the control and open a second update inside,
whose end continued generation while a time-shared server's KV cache was still released: the
next batch's /generate got a 400 in 3 of 6 colocated CPU runs (scripts/chaos.py --config colocated).
"""

import requests

from tests.engine.test_fsdp_helpers import trainer_and_server


def test_update_weights_into_an_open_update_continues_only_when_the_caller_ends_it(tmp_path):
    from areal.api.weights import WeightUpdateMeta
    from tests.serving import make_varied_model_dir

    model_dir = str(make_varied_model_dir(tmp_path / "m", scale=4.0))
    with trainer_and_server(model_dir, tmp_path / "fileroot", experiment_name="e", trial_name="t") as (
        server,
        engine,
        client,
    ):

        class Gate:  # sees every pause and continue of the control
            def __init__(self):
                self.events = []

            def pause(self):
                self.events.append("pause")

            def resume(self):
                self.events.append("continue")

        gate = Gate()
        client.control.add_listener(gate)
        meta = WeightUpdateMeta(type="disk", version=1)
        with client.control.weight_update(meta) as update:
            stats = engine.update_weights(meta, update)
            assert gate.events == ["pause"] and client.control.paused  # still paused: the caller's turn
            assert update.loads == 1 and stats["weight_update/bytes"] > 0
        assert gate.events == ["pause", "continue"] and not client.control.paused
        assert client.get_version() == 1
        assert requests.get(server.url + "/model_info", timeout=10).json()["weight_version"] == "1"
