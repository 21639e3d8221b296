"""Full (unsharded) Hugging Face tensors out of a sharded model, and back in.

Used by `save` (HF folder), the disk and distributed weight updates, and `load`. Every rank must
iterate in the same order, because gathering a DTensor (`full_tensor()`) is a collective; only
rank 0 keeps the result. With LoRA the adapters are merged on the fly, W + (B @ A) * alpha / r,
under the base model's names, so servers always receive a plain model.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

PEFT_PREFIX = "base_model.model."


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def hf_name(name: str) -> str:
    """peft's name of a parameter -> the base model's HF name."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX) :]
    return name.replace(".base_layer.", ".")


def iter_full_state(
    model: nn.Module,
    *,
    keep: bool,
    dtype: torch.dtype | None = None,
    lora_scaling: float | None = None,
    tied_lm_head: bool = False,
    to_cpu: bool = True,
) -> Iterator[tuple[str, torch.Tensor | None]]:
    """Yield (HF name, full tensor) in state-dict order; tensor is None where keep=False.

    Tensors are copied to CPU unless to_cpu=False (they then stay on the model's device).

    lm_head.weight is skipped when tied to the embeddings (HF convention; loaders re-tie it).
    """
    state = model.state_dict()
    for name, value in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue  # merged into their base weight below
        out_name = hf_name(name)
        if tied_lm_head and out_name == "lm_head.weight":
            continue
        full = _full(value)
        if ".base_layer.weight" in name and lora_scaling is not None:
            prefix = name[: -len("base_layer.weight")]
            a = _full(_adapter(state, prefix, "lora_A"))
            b = _full(_adapter(state, prefix, "lora_B"))
            full = full + (b.float() @ a.float()).to(full.dtype) * lora_scaling
        if keep:
            full = full.detach().to(dtype or full.dtype)
            full = full.cpu() if to_cpu else full.contiguous()
        yield out_name, full if keep else None


def _adapter(state: dict, prefix: str, kind: str) -> torch.Tensor:
    matches = [k for k in state if k.startswith(prefix + kind + ".") and k.endswith(".weight")]
    if len(matches) != 1:
        raise RuntimeError(f"expected one {kind} adapter under {prefix!r}, found {matches}")
    return state[matches[0]]


def iter_adapter_state(model: nn.Module, *, keep: bool) -> Iterator[tuple[str, torch.Tensor | None]]:
    """LoRA adapter tensors under peft's saved names (adapter name dropped), for adapter pushes."""
    for name, value in model.state_dict().items():
        if ".lora_A." in name or ".lora_B." in name:
            full = _full(value)
            saved = name.replace(".default.", ".")
            yield saved, full.detach().cpu() if keep else None


def to_model_names(hf_state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """HF-named tensors -> the model's own parameter names (peft-wrapped or not)."""
    names = set(model.state_dict())
    out = {}
    for name, tensor in hf_state.items():
        for candidate in (name, PEFT_PREFIX + name):
            if candidate in names:
                out[candidate] = tensor
                break
        else:
            raise KeyError(
                f"checkpoint tensor {name!r} has no parameter in the model; "
                "is the folder a checkpoint of the same architecture?"
            )
    return out
