"""Datasets as lists of dict records: GSM8K, the synthetic demo task, and user loaders.

`load_dataset_by_name(spec, split, path=..., **kwargs)` is the one entry point configs use;
see `areal.dataset.registry` for the forms a spec takes. Only light modules are imported here.
"""

from areal.dataset.gsm8k import build_prompt, load_gsm8k
from areal.dataset.registry import BUILTIN_DATASETS, load_dataset_by_name
from areal.dataset.synthetic import load_synthetic_arith, make_synthetic_arith

__all__ = [
    "BUILTIN_DATASETS",
    "build_prompt",
    "load_dataset_by_name",
    "load_gsm8k",
    "load_synthetic_arith",
    "make_synthetic_arith",
]
