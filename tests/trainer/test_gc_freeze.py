"""The training loop freezes the objects alive after its first step (gc.freeze), so full
collections triggered by the rollout client's allocations stay short for the training thread."""

import gc
import types

from areal.trainer import grpo


def test_objects_are_frozen_once_after_the_first_step(monkeypatch):
    events = []
    monkeypatch.setattr(grpo, "grpo_step", lambda ctx, step: events.append(("step", step, gc.get_freeze_count())) or {})
    ctx = types.SimpleNamespace(start_step=3, total_steps=5, log=lambda step, metrics: None)
    gc.unfreeze()
    try:
        grpo.train(ctx)
        assert [e[:2] for e in events] == [("step", 3), ("step", 4), ("step", 5)]
        assert events[0][2] == 0  # nothing frozen before the first step ran
        assert events[1][2] > 0 and events[2][2] == events[1][2]  # frozen once, after it
    finally:
        gc.unfreeze()
