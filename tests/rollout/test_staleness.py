"""Capacity arithmetic of bounded staleness, against hand-computed values."""

from areal.rollout.staleness import capacity, staleness_limit


def cap(**kw):
    base = dict(version=0, max_head_offpolicyness=0, consumer_batch_size=4, max_concurrent=100, running=0, accepted=0)
    return capacity(**{**base, **kw})


def test_synchronous_allows_one_batch_per_version():
    assert staleness_limit(0, 0, 4) == 4
    assert cap() == 4
    assert cap(running=3) == 1
    assert cap(running=1, accepted=3) == 0
    assert cap(version=1, accepted=4) == 4


def test_offpolicyness_widens_the_window():
    assert cap(max_head_offpolicyness=2) == 12
    assert cap(max_head_offpolicyness=2, version=3, accepted=20, running=2) == 2


def test_concurrency_caps_and_never_negative():
    assert cap(max_concurrent=2) == 2
    assert cap(max_concurrent=2, running=2) == 0
    assert cap(accepted=10) == 0
