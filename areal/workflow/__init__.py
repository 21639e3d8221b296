"""Rollout workflows (one dataset record to training tensors): rlvr.py, multi_turn.py, and
registry.py, which resolves `workflow.type`."""
