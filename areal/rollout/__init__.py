"""Asynchronous rollout: the executor (executor.py), its staleness bound (staleness.py) and batch
assembly (batch.py)."""
