"""The GRPO training loop, phase by phase as the algorithm reads:

prepare batch -> recompute logprobs -> advantages -> PPO update
-> pause, weight update, continue -> version bump -> save / evaluate / log -> recovery checkpoint
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.algo.actor import (
    loss_weight_fn,
    ppo_loss_fn,
    prepare_ppo_batch,
    proximal_minibatches,
    rollout_mismatch_sums,
    rows_to_recompute,
)
from areal.rollout.batch import sample_stats
from areal.trainer.prompt_log import record_ids_of
from areal.utils.gc_freeze import freeze_long_lived_objects

if TYPE_CHECKING:
    from .context import TrainContext


@dataclass
class Phases:
    """Seconds per named phase of one step (logged as timing/<phase>_s), and the CPU seconds
    spent meanwhile by the training thread and by the process's other threads (logged as
    cpu/<phase>_main_s and cpu/<phase>_others_s).

    `marker` (RUN/logs/trainer-K.phase, TrainContext.phase_marker) names the phase a rank is in: the
    launcher quotes it when a rank hangs, and scripts/chaos.py waits on it to strike mid-phase.

    The other threads are the rollout client (HTTP, rewards, tensors) in an asynchronous run and,
    on CUDA, autograd's device thread, which runs every backward pass while the training thread
    waits: on one H200 (SmolLM2 recipe, 2026-12-03 runs) the others took 0.42 s of CPU in a 0.85 s
    `train` and 0.007 s in `recompute_logprob`, which has no backward. So `train`'s figure mixes
    both; `recompute_logprob`'s is the client's alone, the better sign of GIL contention when
    training is slower in an async run than in a sync one.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # name -> [main thread, others]
    marker: Path | None = None  # overwritten with "step N PHASE" as each phase starts
    step: int = 0
    annotate: bool = False  # a traced step (profiler.steps): each phase is a profiler annotation

    @contextmanager
    def __call__(self, name: str):
        if self.marker is not None:
            self.marker.write_text(f"step {self.step} {name}\n")
        t, main, process = time.perf_counter(), time.thread_time(), time.process_time()
        with _annotation(name) if self.annotate else nullcontext():
            yield
        main, process = time.thread_time() - main, time.process_time() - process
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
        acc = self.cpu.setdefault(name, [0.0, 0.0])
        acc[0] += main
        acc[1] += max(process - main, 0.0)

    def metrics(self) -> dict[str, float]:
        out = {f"timing/{k}_s": v for k, v in self.seconds.items()}
        for k, (main, others) in self.cpu.items():
            out[f"cpu/{k}_main_s"], out[f"cpu/{k}_others_s"] = main, others
        return out


def _annotation(name: str):
    from torch.profiler import record_function

    from areal.trainer.profiling import PHASE_PREFIX

    return record_function(PHASE_PREFIX + name)


def grpo_step(ctx: TrainContext, step: int, traced: bool = False) -> dict[str, Any]:
    """One training step; returns its metrics. `traced`: the step runs under torch.profiler
    (profiler.steps), its phases marked."""
    cfg, actor, a = ctx.cfg, ctx.actor, ctx.cfg.actor
    phases, t0 = Phases(marker=ctx.phase_marker, step=step, annotate=traced), time.perf_counter()
    with phases("rollout"):
        batch = ctx.source.next_batch()  # with dynamic sampling: only groups whose rewards differ
    with phases("advantages"):
        batch = prepare_ppo_batch(batch, a, group_size=cfg.gconfig.n_samples, max_new_tokens=cfg.gconfig.max_new_tokens)
        local = actor.dp_shard(batch)
    with phases("recompute_logprob"):
        recomputed = rows_to_recompute(local, a) if a.recompute_logprob else None
        if recomputed is not None:
            recomputed["prox_logprobs"] = actor.forward(recomputed, temperature=ctx.temperature)
        if ctx.ref is not None:
            local["ref_logprobs"] = ctx.ref.forward(local, temperature=ctx.temperature)
    algo_metrics = {**ctx.source.batch_metrics(), **(_mismatch(recomputed, a) if recomputed is not None else {})}
    with phases("train"):
        minibatches = proximal_minibatches(local, recomputed, a, version=ctx.version)
        ahead_at = pause_ahead_index(len(minibatches), cfg.rollout.pause_ahead_minibatches)
        train_stats = []
        for k, mb in enumerate(minibatches):
            if k == ahead_at:
                ctx.source.pause_ahead()
            train_stats.append(actor.train_batch(mb, ppo_loss_fn(a), loss_weight_fn(a), temperature=ctx.temperature))
    with phases("weight_update"):
        update = ctx.source.push_weights(ctx.version + 1)
        ctx.version += 1  # the version bump, once the servers hold it
    with phases("save"):
        ctx.save(step)
    with phases("eval"):
        evaluation = ctx.evaluate(step)
    ctx.step_records = record_ids_of(batch, cfg.gconfig.n_samples)  # RUN/prompts.jsonl, with the step's log
    out = _metrics(step, ctx, batch, train_stats, update, evaluation, phases, time.perf_counter() - t0, algo_metrics)
    if traced:
        out["profiler/traced"] = 1.0  # its timings include the profiler's cost
    return out


def pause_ahead_index(n_minibatches: int, ahead: int) -> int | None:
    """The minibatch before whose training the servers start pausing (rollout.pause_ahead_minibatches:
    the last `ahead` of them train while they pause); None: they pause at the weight update."""
    return max(n_minibatches - ahead, 0) if ahead > 0 else None


def _mismatch(local: dict[str, Any], actor_cfg) -> dict[str, float]:
    """mismatch/* between the servers' and the trainer's logprobs over the recomputed rows (the
    whole batch, unless actor.recompute_first_minibatch=false): each rank's sums, added up over
    all ranks (a shard copied to tensor-parallel ranks counts alike in numerators and
    denominators, so the ratios hold)."""
    import torch
    import torch.distributed as dist

    from areal.algo.correction import mismatch_metrics

    sums = rollout_mismatch_sums(local, actor_cfg)
    if dist.is_initialized() and dist.get_world_size() > 1:
        names = sorted(k for k in sums if k != "weight_max")
        total = torch.stack([sums[k] for k in names])
        peak = sums["weight_max"].clone()
        dist.all_reduce(total)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        sums = {**dict(zip(names, total)), "weight_max": peak}
    return mismatch_metrics(sums)


def _staleness(versions, generated, trained_version: int) -> dict[str, float]:
    """How far behind the policy that trained on them the generated tokens were: the largest and
    the mean lag in versions, and the share of samples whose tokens span more than one version
    (requests that lived through a weight update)."""
    gen = versions[generated]
    if not gen.numel():
        return {}
    rows = generated.any(dim=1)
    big = versions.max() + 1  # so that non-generated positions never win a min
    row_min = versions.masked_fill(~generated, big).amin(dim=1)[rows]
    row_max = versions.masked_fill(~generated, -1).amax(dim=1)[rows]
    return {
        "rollout/staleness_max": int(trained_version - gen.min()),
        "rollout/staleness_mean": float(trained_version - gen.float().mean()),
        "rollout/mixed_version_frac": float((row_max > row_min).float().mean()),
    }


# train_batch figures summed over a step's PPO minibatches: this rank's trained tokens, micro-batches
# and skipped optimizer steps
STEP_TOTALS = ("n_tokens", "n_microbatches", "skipped")


def train_metrics(train_stats: list[dict[str, float]]) -> dict[str, float]:
    """train/* of a step from each PPO minibatch's train_batch figures: STEP_TOTALS summed; the loss,
    the grad norm and the loss function's stats (loss_fn/*: entropy, clip fractions, ...) averaged
    over the minibatches, weighted by their tokens (train/grad_norm_max: the largest); the rest (lr,
    micro-batch budgets) the last minibatch's, where the step ends."""
    out = {f"train/{key}": float(value) for key, value in train_stats[-1].items()}
    weights = [float(s.get("n_tokens", 0.0)) for s in train_stats]
    if sum(weights) <= 0:
        weights = [1.0] * len(train_stats)
    averaged = {"loss", "grad_norm"} | {k for s in train_stats for k in s if k.startswith("loss_fn/")}
    for key in averaged:
        pairs = [(float(s[key]), w) for s, w in zip(train_stats, weights) if key in s]
        if pairs and sum(w for _, w in pairs) > 0:
            out[f"train/{key}"] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    out["train/grad_norm_max"] = max(float(s.get("grad_norm", 0.0)) for s in train_stats)
    for key in STEP_TOTALS:
        out[f"train/{key}"] = sum(float(s.get(key, 0.0)) for s in train_stats)
    return out


# push_weights' figures that keep their own prefix (the rest are the update's, weight_update/)
OWN_PREFIXES = ("server/", "handoff/", "memory/")


def _metrics(step, ctx, batch, train_stats, update, evaluation, phases, step_s, algo_metrics) -> dict[str, Any]:
    rewards = batch["rewards"].float()
    n_tokens = int(batch["loss_mask"].sum())
    out = {
        "step": step,
        "epoch": ctx.epoch(),
        "weight_version": ctx.version,
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()),
        "rollout/n_samples": int(rewards.numel()),
        "rollout/gen_tokens": n_tokens,
        # prompt and generated tokens: what the trainer's passes run over (bench_e2e's tokens/s and MFU)
        "rollout/tokens": int(batch["attention_mask"].sum()),
        "timing/step_s": step_s,
        "throughput/samples_per_s": rewards.numel() / max(step_s, 1e-9),
    }
    if "versions" in batch:
        out.update(_staleness(batch["versions"], batch["loss_mask"].bool(), ctx.version - 1))
    if "overlong_penalty" in batch:
        penalty = batch["overlong_penalty"].float()
        out["rollout/overlong_frac"] = float((penalty < 0).float().mean())
        out["rollout/overlong_penalty_mean"] = float(penalty.mean())
    out.update(algo_metrics)  # dynamic sampling, rollout/trainer mismatch
    out.update(sample_stats(batch))  # a workflow's per-sample figures (e.g. rollout/agent/*)
    out.update(train_metrics(train_stats))
    out.update(
        {
            k if k.startswith(OWN_PREFIXES) else f"weight_update/{k.removeprefix('weight_update/')}": float(v)
            for k, v in update.items()
            if isinstance(v, (int, float))
        }
    )
    out.update(phases.metrics())
    out.update(evaluation)
    return out


def train(ctx: TrainContext) -> None:
    from areal.trainer.profiling import StepProfiler

    engine = ctx.source.rollout_engine
    profiler = StepProfiler(ctx.cfg, ctx.actor.rank, getattr(engine, "control", None))
    for step in range(ctx.start_step, ctx.total_steps + 1):
        with profiler.step(step) as traced:
            metrics = grpo_step(ctx, step, traced)
        ctx.log(step, metrics)
        ctx.checkpoint(step)  # after the log: a run resumed from step N's checkpoint has step N's rows
        if step == ctx.start_step:
            freeze_long_lived_objects()
