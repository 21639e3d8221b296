"""A server that takes a control request and never answers (SIGSTOP) is named within the configured
deadline, with the key that sets it, in the middle of a weight update too; a real built-in server."""

import os
import signal

import pytest

from areal.api.weights import WeightUpdateMeta
from areal.engine.sglang.control import ServerControl
from tests.serving import start_server


@pytest.fixture
def server(tiny_model_dir):
    handle = start_server(tiny_model_dir, env={"OMP_NUM_THREADS": "1"})
    yield handle
    os.kill(handle.proc.pid, signal.SIGCONT)
    handle.stop()


def test_a_stopped_server_is_named_within_the_weight_update_deadline(server, tiny_model_dir):
    addr = f"127.0.0.1:{server.port}"
    control = ServerControl([addr], pause_mode="abort", weight_timeout_s=2.0, control_timeout_s=1.0)
    try:
        with pytest.raises(RuntimeError) as caught:
            with control.weight_update(WeightUpdateMeta("disk", version=1)) as update:  # paused: the server answered
                os.kill(server.proc.pid, signal.SIGSTOP)  # ...and stops inside the update
                update.load_disk(tiny_model_dir)
        message = str(caught.value)
        assert addr in message and "/update_weights_from_disk" in message
        assert "no answer within 2 s (rollout.weight_update_timeout_s" in message
        assert control.get_version() == 0  # the update did not land

        with pytest.raises(RuntimeError, match=r"no answer within 1 s \(rollout.control_timeout_s"):
            control.pause()  # a control call has the shorter deadline

        os.kill(server.proc.pid, signal.SIGCONT)  # back: the same control works again
        control.update_weights(WeightUpdateMeta("disk", path=tiny_model_dir, version=2))
        assert control.server_versions() == {addr: 2}
    finally:
        control.close()
