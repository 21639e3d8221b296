"""Loaders a user would plug in by import path (used by test_registry)."""


def load_pairs(split, n=2, path=None):
    return [{"question": f"{split}-{i}", "answer": f"#### {i}", "source": path} for i in range(n)]


def load_strings(split):
    return ["not", "dicts"]


NOT_CALLABLE = [1, 2]
