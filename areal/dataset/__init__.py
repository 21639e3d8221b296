"""Datasets as lists of dict records: GSM8K, the synthetic demo task, and user loaders.

`load_dataset_by_name(spec, split, path=..., **kwargs)` is the one entry point configs use;
see `areal.dataset.registry` for the forms a spec takes.

Names are exported lazily (PEP 562) so `python -m areal.dataset.gsm8k` runs its module without
it having been imported already through this package.
"""

import importlib

_EXPORTS = {
    "BUILTIN_DATASETS": "areal.dataset.registry",
    "load_dataset_by_name": "areal.dataset.registry",
    "build_prompt": "areal.dataset.gsm8k",
    "load_gsm8k": "areal.dataset.gsm8k",
    "load_synthetic_arith": "areal.dataset.synthetic",
    "make_synthetic_arith": "areal.dataset.synthetic",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'areal.dataset' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
