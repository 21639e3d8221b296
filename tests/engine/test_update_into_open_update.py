"""FSDPEngine.update_weights handed a WeightUpdate that its caller opened (`with
control.weight_update(v) as update`, as a time-shared step does to resume the server's memory
around the load) loads into it and leaves pause and continue to the caller.

It used to take the WeightUpdate's `.control` for the control and open a second update inside,
whose end continued generation while a time-shared server's KV cache was still released: the
next batch's /generate got a 400 in 3 of 6 colocated CPU runs (scripts/chaos.py --config colocated).
"""

import requests


def test_update_weights_into_an_open_update_continues_only_when_the_caller_ends_it(tmp_path):
    from areal.api.inference import WeightUpdateMeta
    from areal.config import ExperimentConfig
    from areal.engine.fsdp.engine import FSDPEngine
    from areal.engine.sglang.client import RemoteSGLangEngine
    from areal.server.testing import make_varied_model_dir, start_server

    model_dir = str(make_varied_model_dir(tmp_path / "m", scale=4.0))
    fileroot = tmp_path / "fileroot"
    server = start_server(
        model_dir,
        extra_args=["--device", "cpu", "--dtype", "float32", "--weight-dirs", str(fileroot)],
        env={"OMP_NUM_THREADS": "1"},
    )
    engine = client = None
    try:
        engine = FSDPEngine.from_pretrained(
            model_dir, dtype="float32", experiment_name="e", trial_name="t", fileroot=str(fileroot)
        )
        cfg = ExperimentConfig.model_validate({"rollout": {"server_addrs": [server.url], "request_timeout_s": 60}})
        client = RemoteSGLangEngine(cfg)
        client.initialize()

        class Gate:  # sees every pause and continue of the control
            def __init__(self):
                self.events = []

            def pause(self):
                self.events.append("pause")

            def resume(self):
                self.events.append("continue")

        gate = Gate()
        client.control.add_listener(gate)
        with client.control.weight_update(1) as update:
            stats = engine.update_weights(WeightUpdateMeta(type="disk", version=1), inference=update)
            assert gate.events == ["pause"] and client.control.paused  # still paused: the caller's turn
            assert update.loads == 1 and stats["weight_update/bytes"] > 0
        assert gate.events == ["pause", "continue"] and not client.control.paused
        assert client.get_version() == 1
        assert requests.get(server.url + "/model_info", timeout=10).json()["weight_version"] == "1"
    finally:
        if client is not None:
            client.destroy()
        if engine is not None:
            engine.destroy()
        server.stop()
