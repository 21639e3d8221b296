"""The PPO/GRPO actor objective assembled from the pure pieces, for the training loop.

The loop calls, per step:
    batch = prepare_ppo_batch(batch, actor_cfg, group_size=n_samples)   # rewards -> advantages
    rows = rows_to_recompute(batch, actor_cfg)                           # if actor.recompute_logprob
    rows["prox_logprobs"] = engine.forward(rows)                        # (all, all but minibatch 0's, or none)
    batch["ref_logprobs"] = ref_engine.forward(batch)                   # if actor.kl_ctl > 0
    for mb in proximal_minibatches(batch, rows, actor_cfg, version=V):  # V: the trainer's weight version
        engine.train_batch(mb, ppo_loss_fn(actor_cfg), loss_weight_fn(actor_cfg))

Batch keys (right-padded [B, L] unless noted): input_ids, attention_mask, loss_mask,
logprobs (behaviour, from the inference servers), rewards [B], versions (each generated token's
weight version, for actor.prox_logp_method other than recompute); added here: advantages, and
overlong_penalty [B] when actor.overlong_buffer_frac > 0.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .advantages import broadcast_to_tokens, compute_advantages, overlong_penalty, scale_rewards
from .correction import mismatch_sums, rollout_is_weights
from .masked import aggregate, aggregation_weight, masked_mean
from .ppo import entropy_bonus, kl_penalty, ppo_actor_loss
from .proximal import approximate_proximal, interpolation_weight


def prepare_ppo_batch(
    batch: dict[str, Any], cfg, *, group_size: int, max_new_tokens: int | None = None
) -> dict[str, Any]:
    """Shape rewards (overlong penalty, bias, scaling, clip), normalise them into advantages and
    put them on tokens. The overlong penalty (actor.overlong_buffer_frac > 0) needs the generation
    budget `max_new_tokens` (gconfig.max_new_tokens) and counts an answer's loss tokens."""
    out = dict(batch)
    rewards = batch["rewards"].float()
    if cfg.overlong_buffer_frac > 0:
        if max_new_tokens is None:
            raise ValueError(
                "actor.overlong_buffer_frac > 0 needs the generation budget: pass "
                "max_new_tokens=gconfig.max_new_tokens to prepare_ppo_batch"
            )
        penalty = overlong_penalty(
            batch["loss_mask"].sum(-1),
            max_len=max_new_tokens,
            buffer_len=cfg.overlong_buffer_frac * max_new_tokens,
            factor=cfg.overlong_penalty,
        )
        out["overlong_penalty"] = penalty
        rewards = rewards + penalty
    rewards = scale_rewards(rewards, scaling=cfg.reward_scaling, bias=cfg.reward_bias, clip=cfg.reward_clip)
    adv = compute_advantages(rewards, mode=cfg.adv_norm, group_size=group_size, std=cfg.adv_norm_std)
    out["rewards"] = rewards
    out["advantages"] = broadcast_to_tokens(adv, batch["loss_mask"])
    return out


def clip_bounds(cfg) -> tuple[float, float]:
    """(eps low, eps high): actor.eps_clip_low / eps_clip_high, each following actor.eps_clip when null."""
    low = cfg.eps_clip if cfg.eps_clip_low is None else cfg.eps_clip_low
    high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    return low, high


def ppo_loss_fn(cfg) -> Callable:
    """loss_fn(logprobs, entropy, mb) -> (loss, stats) for FSDPEngine.train_batch (an ActorConfig)."""
    if cfg.use_decoupled_loss and not cfg.recompute_logprob:
        raise ValueError(
            "actor.use_decoupled_loss needs actor.recompute_logprob=true (the proximal logprobs come from the trainer)"
        )
    if cfg.rollout_is != "none" and not cfg.recompute_logprob:
        raise ValueError(
            f"actor.rollout_is={cfg.rollout_is} needs actor.recompute_logprob=true "
            "(its weights compare the trainer's logprobs with the servers')"
        )
    if cfg.prox_logp_method != "recompute" and not cfg.recompute_logprob:
        raise ValueError(
            f"actor.prox_logp_method={cfg.prox_logp_method} needs actor.recompute_logprob=true "
            "(it says where the trainer's proximal logprobs come from)"
        )
    eps_low, eps_high = clip_bounds(cfg)

    def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, mb: dict[str, Any]):
        mask = mb["loss_mask"]
        behav = mb["logprobs"]
        prox_stats: dict[str, torch.Tensor] = {}
        if mb.get(PROX_FROM_TRAINING):  # the step's first minibatch: this forward runs at the proximal weights
            prox = logprobs.detach()
        elif cfg.prox_logp_method == "loglinear":  # (checked above: recompute_logprob is on)
            alpha = _require(
                mb, PROX_ALPHA, "actor.prox_logp_method=loglinear", "split the batch with proximal_minibatches"
            )
            prox = approximate_proximal(behav, logprobs, alpha)
            prox_stats["prox_alpha"] = masked_mean(alpha, mask)
        else:
            prox = _require(mb, "prox_logprobs", "actor.recompute_logprob") if cfg.recompute_logprob else behav
            if PROX_ALPHA in mb:  # actor.prox_logp_method=metrics: loglinear's error against the recompute
                approx = approximate_proximal(behav, logprobs, mb[PROX_ALPHA])
                prox_stats["prox_approx_abs_err"] = masked_mean((approx - prox).abs(), mask)
                prox_stats["prox_behav_abs_err"] = masked_mean((behav - prox).abs(), mask)
        is_weights = None
        if cfg.rollout_is != "none":  # replaces the decoupled loss's raw behaviour weight
            is_weights, _ = rollout_is_weights(
                prox, behav, mask, mode=cfg.rollout_is, level=cfg.rollout_is_level, cap=cfg.rollout_is_cap
            )
        loss, stats = ppo_actor_loss(
            logprobs,
            prox,
            mb["advantages"],
            mask,
            eps_clip=eps_low,
            eps_clip_high=eps_high,
            c_clip=cfg.c_clip,
            behav_logprobs=behav if cfg.use_decoupled_loss and is_weights is None else None,
            behav_imp_weight_cap=cfg.behav_imp_weight_cap,
            is_weights=is_weights,
            aggregation=cfg.token_aggregation,
            ratio_level=cfg.ratio_level,
        )
        stats["pg_loss"] = loss.detach()
        if cfg.kl_ctl > 0:
            ref = _require(mb, "ref_logprobs", "actor.kl_ctl")
            kl = aggregate(kl_penalty(logprobs, ref, cfg.kl_estimator), mask, cfg.token_aggregation)
            loss = loss + cfg.kl_ctl * kl
            stats["kl_ref"] = kl.detach()
        if cfg.entropy_coeff > 0:
            bonus = aggregate(entropy_bonus(logprobs, entropy), mask, cfg.token_aggregation)
            loss = loss - cfg.entropy_coeff * bonus
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        stats.update({k: v.detach() for k, v in prox_stats.items()})
        return loss, stats

    return loss_fn


def rollout_mismatch_sums(batch: dict[str, Any], cfg) -> dict[str, torch.Tensor]:
    """`correction.mismatch_sums` of a batch holding prox_logprobs, at the configured level and
    with the cap in force: actor.rollout_is_cap with a correction, else behav_imp_weight_cap
    under the decoupled loss (token level), else none."""
    if cfg.rollout_is != "none":
        level, cap = cfg.rollout_is_level, cfg.rollout_is_cap
    else:
        level, cap = "token", cfg.behav_imp_weight_cap if cfg.use_decoupled_loss else None
    return mismatch_sums(batch["prox_logprobs"], batch["logprobs"], batch["loss_mask"], level=level, cap=cap)


def loss_weight_fn(cfg) -> Callable[[dict[str, Any]], float]:
    """Weight of a micro-batch so weighted micro-batch losses equal the whole-batch aggregate."""
    return lambda mb: aggregation_weight(mb["loss_mask"], cfg.token_aggregation)


# A minibatch key: its proximal logprobs are those of its own training forward (detached).
PROX_FROM_TRAINING = "prox_from_training"
# A minibatch key: each token's interpolation weight toward its own training forward's logprob
# (areal.algo.proximal), with actor.prox_logp_method loglinear (used) or metrics (compared).
PROX_ALPHA = "prox_alpha"


def rows_to_recompute(batch: dict[str, Any], cfg) -> dict[str, Any] | None:
    """The rows whose proximal logprobs the recompute pass computes (an ActorConfig): all of them, or
    with actor.recompute_first_minibatch=false all but the first PPO minibatch's; None when none
    (and always with actor.prox_logp_method=loglinear, which interpolates them instead)."""
    if cfg.prox_logp_method == "loglinear":
        return None
    size = batch["input_ids"].shape[0]
    first = 0 if cfg.recompute_first_minibatch else size // cfg.ppo_n_minibatches
    if first >= size:
        return None
    return {k: _rows(v, first, size, size) for k, v in batch.items()}


def proximal_minibatches(
    batch: dict[str, Any], recomputed: dict[str, Any] | None, cfg, *, version: int | None = None
) -> list[dict[str, Any]]:
    """The PPO minibatches of a batch, each with its rows of `recomputed`'s prox_logprobs
    (rows_to_recompute's rows), or, where the first minibatch's were not recomputed, marked
    PROX_FROM_TRAINING. With actor.prox_logp_method loglinear or metrics each also gets PROX_ALPHA,
    from the batch's per-token `versions` and the trainer's weight `version` (required then)."""
    minibatches = split_minibatches(batch, cfg.ppo_n_minibatches)
    if not cfg.recompute_logprob:
        return minibatches
    if cfg.prox_logp_method != "recompute":
        if version is None:
            raise ValueError(f"actor.prox_logp_method={cfg.prox_logp_method} needs the trainer's weight version")
        _require(
            batch,
            "versions",
            f"actor.prox_logp_method={cfg.prox_logp_method}",
            "a workflow's samples carry each token's weight version (areal/workflow/common.py); "
            "set actor.prox_logp_method=recompute for batches without one",
        )
        for k, mb in enumerate(minibatches):
            mb[PROX_ALPHA] = interpolation_weight(mb["versions"], version, k / len(minibatches))
        if cfg.prox_logp_method == "loglinear":
            return minibatches
    own = 0 if cfg.recompute_first_minibatch else 1
    for mb in minibatches[:own]:
        mb[PROX_FROM_TRAINING] = True
    if recomputed is not None:
        parts = split_minibatches(recomputed, len(minibatches) - own)
        for mb, part in zip(minibatches[own:], parts, strict=True):
            mb["prox_logprobs"] = part["prox_logprobs"]
    return minibatches


def split_minibatches(batch: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """n contiguous minibatches of whole sequences (PPO updates once per minibatch)."""
    size = batch["input_ids"].shape[0]
    if size % n:
        raise ValueError(f"{size} sequences do not split into actor.ppo_n_minibatches={n} minibatches")
    step = size // n
    return [{k: _rows(v, i * step, (i + 1) * step, size) for k, v in batch.items()} for i in range(n)]


def _rows(value, start: int, end: int, size: int):
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
        return value[start:end]
    return value


def _require(mb: dict[str, Any], key: str, because: str, fix: str | None = None) -> torch.Tensor:
    if key not in mb:
        fix = fix or "compute it with engine.forward(batch) before train_batch"
        raise KeyError(f"the batch has no '{key}', needed because {because} is set; {fix}")
    return mb[key]
