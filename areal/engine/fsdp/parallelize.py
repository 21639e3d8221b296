"""Device mesh and model parallelisation: FSDP2 (fully_shard), HSDP and tensor parallelism.

The mesh always has three named dimensions, so code and tests can ask for any of them:
    ("dp_replicate", "dp_shard", "tp") with sizes (r, d / r, t) from actor.backend = fsdp:d{d}t{t}r{r}
FSDP shards parameters over "dp_shard"; with r > 1 (HSDP) it also replicates them over
"dp_replicate" (a 2-D mesh passed to fully_shard). TP splits attention heads and MLP columns over
"tp" inside every decoder layer (Megatron-style: column-parallel q/k/v/gate/up, row-parallel
o/down), so each decoder layer needs one all-reduce per block and no change to the HF modules.
"""

from __future__ import annotations

import torch
from torch import nn

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


def build_mesh(strategy, device_type: str):
    """The 3-D DeviceMesh of a ParallelStrategy over the current default process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world != strategy.world_size:
        raise ValueError(
            f"actor.backend={strategy} needs {strategy.world_size} trainer processes "
            f"(dp {strategy.dp} x tp {strategy.tp}) but torch.distributed has {world}; launch with "
            f"`torchrun --nproc-per-node {strategy.world_size}` or change actor.backend (dp_size/tp_size)"
        )
    shape = (strategy.replicate, strategy.shard, strategy.tp)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


def dp_mesh(mesh):
    """The data-parallel part of the mesh as FSDP wants it: 1-D shard mesh, or 2-D for HSDP."""
    if mesh["dp_replicate"].size() > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


def flat_dp_mesh(mesh):
    """All data-parallel ranks as one dimension (for summing loss weights over the batch)."""
    return mesh["dp_replicate", "dp_shard"]._flatten("dp")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The stack of transformer blocks of a HF causal LM (also inside a peft wrapper)."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList) and len(module) > 0:
            return module
    raise ValueError(
        f"cannot find the decoder layers (a ModuleList named '*layers') in "
        f"{type(model).__name__}; only HF decoder-only models are supported"
    )


def check_tp_divisible(config, tp: int) -> None:
    """TP splits heads and the MLP width: each must divide by the TP size."""
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
        "intermediate_size": config.intermediate_size,
    }
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        raise ValueError(
            f"actor.backend tensor-parallel size t{tp} does not divide the model's "
            f"{bad}; pick a TP size that divides them"
        )


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Megatron-style plan for Llama/Qwen2-like blocks; embeddings and lm_head stay replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for layer in decoder_layers(model):
        missing = [k for k in plan if not _has_submodule(layer, k)]
        if missing:
            raise ValueError(f"TP plan expects modules {missing} in each decoder layer")
        parallelize_module(layer, tp_mesh, plan)


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def apply_fsdp(
    model: nn.Module, mesh, *, param_dtype: torch.dtype, reduce_dtype: torch.dtype, reshard_after_forward: bool = True
) -> None:
    """fully_shard every decoder layer, then the root (embeddings, final norm, lm_head).

    Parameters stay fp32 (the optimizer's master copy); MixedPrecisionPolicy casts them to
    param_dtype for compute and reduces gradients in reduce_dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)


def compile_decoder_layers(model: nn.Module) -> None:
    """torch.compile each decoder layer in place (Module.compile keeps names and state-dict keys).

    Per-layer graphs fuse the element-wise work around the matmuls (RMSNorm, rotary, SiLU x up,
    residual adds), which is most of the non-matmul GPU time of a training step. All layers run
    the same code, so dynamo compiles it once (dynamic sizes: packed micro-batches differ in
    length) and reuses it for every layer. FSDP2's hooks stay outside the graphs (dynamo skips
    them), and so does the attention kernel call (attention.packed_sdpa_attention is excluded).
    """
    for layer in decoder_layers(model):
        layer.compile(dynamic=True)
