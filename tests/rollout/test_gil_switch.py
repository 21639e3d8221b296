"""The executor lowers its process's GIL switch interval (rollout.gil_switch_interval_ms)."""

import sys

import pytest

from areal.config.rollout import RolloutConfig
from areal.rollout.executor import RolloutExecutor, shorten_gil_switch_interval


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


@pytest.mark.parametrize("ms, expected_s", [(0.2, 0.0002), (None, 0.005)])
def test_executor_applies_the_config(switch_interval, ms, expected_s):
    executor = RolloutExecutor(VersionOnly(), RolloutConfig(consumer_batch_size=1, gil_switch_interval_ms=ms))
    try:
        assert sys.getswitchinterval() == pytest.approx(expected_s)
    finally:
        executor.destroy()


def test_config_rejects_a_non_positive_interval():
    with pytest.raises(ValueError, match="gil_switch_interval_ms"):
        RolloutConfig(gil_switch_interval_ms=0)
