"""Long-lived objects out of the cycle collector's reach, in processes that run the rollout client.

A full (generation 2) collection walks every tracked object and stops every thread of the process
while it does. In a process that imported torch and transformers and built its models, that is
hundreds of thousands of objects, and the rollout client's allocations (answers, requests,
tensors) trigger such collections every few batches: in the trainer they stall the training
thread (docs/benchmarks.md, section 8), in an episode worker its event loop, and with it every
episode it runs (about 0.13 s a collection with 320k objects tracked, 2 cores).
"""

from __future__ import annotations

import gc


def freeze_long_lived_objects() -> None:
    """Move every object alive now (modules, parameters, optimizer state, compiled graphs,
    imported libraries, a workflow and its tokenizer) out of the collector's reach (gc.freeze).

    Objects frozen here are never freed by the cycle collector (reference counting still frees
    them), which for what a process holds once it is built is the intent; call it then, once."""
    gc.collect()
    gc.freeze()
