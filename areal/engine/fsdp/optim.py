"""AdamW, the learning-rate schedule and gradient clipping for sharded (DTensor) parameters."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Iterable

import torch


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg) -> torch.optim.Optimizer:
    """AdamW over the fp32 master parameters that require grad (cfg: OptimizerConfig)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters (with actor.use_lora, check actor.target_modules)")
    # The fused kernel (CUDA and CPU) updates every parameter in one pass (DTensor shards
    # included); off it, DTensor parameters take the per-parameter loop, not the foreach path.
    fused = all(p.device.type in ("cuda", "cpu") for p in params)
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused or None
    )


def lr_multiplier(cfg, total_steps: int | None) -> Callable[[int], float]:
    """Multiplier of cfg.lr at optimizer step s (0-based).

    Warmup: (s + 1) / W for the first W = round(warmup_steps_proportion * total_steps) steps, so
    the first step already moves and step W - 1 reaches the peak. Then constant, or linear/cosine
    decay from 1 towards min_lr_ratio, reached at step total_steps (just after the last step, as
    in transformers' schedules, so the last step still learns).
    """
    needs_total = cfg.lr_scheduler_type != "constant" or cfg.warmup_steps_proportion > 0
    if needs_total and not total_steps:
        raise ValueError(
            f"actor.optimizer.lr_scheduler_type={cfg.lr_scheduler_type!r} with "
            f"warmup_steps_proportion={cfg.warmup_steps_proportion} needs the total number of "
            "training steps: pass total_train_steps to FSDPEngine.initialize (from "
            "total_train_steps or epochs x steps per epoch)"
        )
    warmup = int(round(cfg.warmup_steps_proportion * total_steps)) if total_steps else 0
    floor = cfg.min_lr_ratio

    def fn(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.lr_scheduler_type == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if cfg.lr_scheduler_type == "linear":
            return floor + (1.0 - floor) * (1.0 - progress)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn


def build_scheduler(optimizer: torch.optim.Optimizer, cfg, total_steps: int | None):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg, total_steps))


def _grads_by_mesh(params: Iterable[torch.nn.Parameter]) -> dict[object, list[torch.Tensor]]:
    """The gradients grouped by (device mesh, placements) for DTensors, one group for plain
    tensors: a foreach op takes one such group at a time."""
    from torch.distributed.tensor import DTensor

    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            key = (p.grad.device_mesh, p.grad.placements) if isinstance(p.grad, DTensor) else None
            groups[key].append(p.grad)
    return groups


def grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """Global L2 norm of the gradients of possibly differently-sharded parameters.

    With TP, decoder weights live on the (dp, tp) mesh and embeddings on the dp mesh only; one
    foreach norm per mesh, each made global with full_tensor(), then combined.
    """
    return _norm_of_groups(_grads_by_mesh(params))


def _norm_of_groups(groups: dict[object, list[torch.Tensor]]) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    total_sq = None
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        sq = norm.float() ** 2
        total_sq = sq if total_sq is None else total_sq + sq.to(total_sq.device)
    if total_sq is None:
        return torch.zeros(())
    return total_sq.sqrt()


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    """Scale gradients so their global norm is at most max_norm; returns the norm before clipping."""
    groups = _grads_by_mesh(params)
    norm = _norm_of_groups(groups)
    if max_norm is not None:
        coef = float(max_norm / (norm + 1e-6))
        if coef < 1.0:  # one foreach kernel per mesh, not one DTensor dispatch per parameter
            for grads in groups.values():
                torch._foreach_mul_(grads, coef)
    return float(norm)
