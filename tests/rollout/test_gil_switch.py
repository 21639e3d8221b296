"""The GIL switch interval (rollout.gil_switch_interval_ms): the helper lowers it, never raises it;
the process entry points apply the config; constructing the executor leaves it alone."""

import sys

import pytest

from areal.config.launcher import LauncherConfig
from areal.config.rollout import GenerationConfig, RolloutConfig, WorkflowConfig
from areal.rollout.executor import RolloutExecutor
from areal.utils.gil import shorten_gil_switch_interval


class VersionOnly:
    def get_version(self):
        return 0


@pytest.fixture
def switch_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_lowers_never_raises_and_none_leaves_it(switch_interval):
    shorten_gil_switch_interval(None)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    shorten_gil_switch_interval(0.5)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    shorten_gil_switch_interval(2.0)  # a larger value than the current one is ignored
    assert sys.getswitchinterval() == pytest.approx(0.0005)


def test_the_executor_leaves_the_interpreter_alone(switch_interval):
    executor = RolloutExecutor(VersionOnly(), RolloutConfig(consumer_batch_size=1, gil_switch_interval_ms=0.2))
    try:
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        executor.destroy()


@pytest.mark.parametrize("module", ["areal.trainer.main", "areal.trainer.driver"])
@pytest.mark.parametrize("ms, rank, expected_s", [(0.2, "0", 0.0002), (None, "0", 0.005), (0.2, "1", None)])
def test_entry_points_apply_the_config(switch_interval, monkeypatch, module, ms, rank, expected_s):
    import importlib

    mod = importlib.import_module(module)
    sections = {"rollout": RolloutConfig(gil_switch_interval_ms=ms), "gconfig": GenerationConfig()}
    sections["launcher"] = LauncherConfig()
    cfg = type("Cfg", (), {**sections, "workflow": WorkflowConfig()})()  # what the entry points read
    seen = {}
    monkeypatch.setattr("areal.trainer.main.load_run_config", lambda path: cfg)  # the driver uses it too
    monkeypatch.setattr(
        mod,
        "run" if module.endswith("main") else "drive",
        lambda c: seen.setdefault("interval", sys.getswitchinterval()),
    )
    monkeypatch.setattr("logging.basicConfig", lambda **kw: None)
    monkeypatch.setenv("RANK", rank)
    assert mod.main(["--config", "unused.yaml"]) == 0
    if expected_s is None:  # trainer ranks other than 0 have no rollout client thread
        expected_s = 0.005 if module.endswith("main") else 0.0002
    assert seen["interval"] == pytest.approx(expected_s)


def test_config_rejects_a_non_positive_interval():
    with pytest.raises(ValueError, match="gil_switch_interval_ms"):
        RolloutConfig(gil_switch_interval_ms=0)
