"""The trained policy: model, parallelism, precision, optimizer, micro-batching, LoRA and PPO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .base import DType, Section

# actor.max_tokens_per_mb=auto (areal/engine/fsdp/mb_budget.py): the budget of a pass measured on
# CUDA, and the fixed budget where there is no device memory to measure (CPU)
AUTO_PROBE_TOKENS = 4096
AUTO_CPU_TOKENS = 16384
# A measured budget that cuts a pass into this many micro-batches or more is reported once per pass
# kind: at the 1.5B shape beside a server holding half an H100, auto gave 3,072-token train
# micro-batches (17 a PPO minibatch) and training took 11.7 s, against 6.3 s with checkpointing and a
# quarter for the server (two H100s, 2026-12-06, docs/benchmarks.md section 10).
CRAMPED_MICROBATCHES = 8


def token_budget(value) -> int | str:
    """actor.max_tokens_per_mb's value: a whole number of tokens >= 1 or 'auto', with one message for
    anything else (not one per member of the union). bench_e2e.py parses its option with it too."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError("must be a whole number of tokens >= 1 (e.g. 16384) or 'auto' (sized from the free device memory)")


class OptimizerConfig(Section):
    type: Literal["adamw"] = Field("adamw", description="Optimizer (AdamW).")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Schedule after warmup. Warmup and decay count optimizer steps: "
        "training steps x actor.ppo_n_minibatches.",
    )
    warmup_steps_proportion: float = Field(
        0.0, ge=0, le=1, description="Fraction of total steps with linear warmup from 0."
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final LR as a fraction of lr for linear/cosine schedules."
    )
    gradient_clipping: float | None = Field(1.0, gt=0, description="Max global gradient norm; null disables clipping.")


class ActorConfig(Section):
    path: str | None = Field(
        None, description="Model to train: a Hugging Face folder or hub id. Required when trainers run."
    )
    tokenizer_path: str | None = Field(None, description="Tokenizer location; defaults to path.")
    backend: str = Field(
        "fsdp:d1", description="Trainer parallelism, e.g. fsdp:d4 (FSDP), fsdp:d4r2 (HSDP 2x2), fsdp:d2t2 (TP)."
    )
    dtype: DType = Field("bfloat16", description="Parameter dtype during compute.")
    grad_reduce_dtype: DType = Field("float32", description="Dtype of gradient reduction across ranks.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and LR schedule.")
    max_tokens_per_mb: int | Literal["auto"] = Field(
        16384,
        description="Token budget of one packed micro-batch (sequences are packed, never split), or 'auto': "
        f"on CUDA the first pass of each kind (logprob recompute, training) runs at {AUTO_PROBE_TOKENS} tokens "
        "and its peak memory per token is measured; later passes get the free memory x (1 - "
        "mb_memory_headroom) over that, a multiple of 1024, never below the longest sequence. On CPU 'auto' "
        f"is a fixed {AUTO_CPU_TOKENS}. Logged as train/mb_token_budget; a budget that cuts a pass into "
        f"{CRAMPED_MICROBATCHES} micro-batches or more is reported once, with what frees memory.",
    )
    mb_memory_headroom: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="With max_tokens_per_mb=auto: the fraction of the free device memory left unused "
        "(allocator fragmentation, memory others take meanwhile). Not read with a fixed budget.",
    )
    mb_server_margin: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="With max_tokens_per_mb=auto beside colocated servers that keep their memory (an "
        "asynchronous run): the share of each device left to the servers beyond sglang.mem_fraction_static "
        "(their activations, CUDA graphs and sampler). The budget then counts on at most 1 - "
        "mem_fraction_static - this of the device (areal.config.experiment.trainer_memory_share); SGLang's "
        "sampler ran out of memory beside a trainer whose budget had taken the rest.",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    compile: bool = Field(
        False,
        description="torch.compile every decoder layer: fuses norms, rotary embeddings and activations "
        "(the first two steps pay the compilation, tens of seconds; needs a C++ compiler on CPU).",
    )
    fused_logprobs: bool = Field(
        False,
        description="Compute token logprobs from the hidden states chunk by chunk, with the lm_head folded "
        "in: no [tokens, vocab] logits or logit gradients are kept (12 GB each in bf16 for a 152k vocabulary "
        "and 40k tokens), at the cost of one more lm_head matmul per micro-batch in backward.",
    )
    compile_logprobs: bool = Field(
        False,
        description="torch.compile the token log-probabilities and entropy over the vocabulary and their "
        "gradient: one fused pass over the bf16 logits each way instead of several fp32 passes (element-wise "
        "kernels over the 152k vocabulary outweighed the matmuls in a profiled 0.5B step). The first "
        "micro-batches pay the compilation; needs a C++ compiler on CPU.",
    )
    logprobs_on_every_token: bool = Field(
        False,
        description="Compute token logprobs on every token, prompts included. By default the trainer "
        "computes them (in the loss, the recompute pass and the reference model) only on tokens with "
        "loss_mask 1 where a batch has one: the lm_head and the vocabulary-wide kernels run on the rows "
        "that predict those tokens (transformers' logits_to_keep), and the others get 0, as padding does.",
    )
    share_prompts: bool | Literal["auto"] = Field(
        "auto",
        description="Compute a prompt once per micro-batch for all the sequences that start with it (GRPO's "
        "n answers to one prompt), each answer attending to the prompt's keys and values: at 235-token "
        "prompts, 192 generated tokens and 8 answers a prompt the trainer computes 48% fewer tokens. The math "
        "is that of the unshared sequences. 'auto' (default): on on CUDA wherever it applies, i.e. with the "
        "engine's packed attention (its default) and logprobs on loss tokens only (actor.logprobs_on_every_"
        "token=false); off on CPU, where small models gain nothing; true: required (refused where it cannot "
        "apply); false: each sequence computed whole.",
    )
    # LoRA (peft)
    use_lora: bool = Field(False, description="Train LoRA adapters (peft) instead of all weights.")
    lora_rank: int = Field(16, ge=1, description="LoRA rank r.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha (scaling = lora_alpha / lora_rank).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="Module names that get adapters."
    )
    lora_push: Literal["merged", "adapter"] = Field(
        "merged", description="What weight updates send to servers: merged dense weights or adapters only."
    )
    # PPO / GRPO objective
    eps_clip: float = Field(
        0.2,
        gt=0,
        description="PPO ratio clip epsilon on both sides: the shorthand that eps_clip_low and "
        "eps_clip_high follow when they are null.",
    )
    eps_clip_low: float | None = Field(
        None,
        gt=0,
        description="Lower clip epsilon: the ratio is clipped below at 1 - eps_clip_low "
        "(below 1); null follows eps_clip.",
    )
    eps_clip_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip epsilon: the ratio is clipped above at 1 + eps_clip_high; null "
        "follows eps_clip. Above eps_clip_low it is DAPO's clip-higher (e.g. 0.28 with 0.2): unlikely "
        "tokens of good answers may gain more per step, which keeps entropy from collapsing.",
    )
    ratio_level: Literal["token", "sequence"] = Field(
        "token",
        description="PPO importance ratio per token, or per sequence as the geometric mean of its "
        "token ratios, the same on each of its tokens (GSPO; pair with small clip epsilons, e.g. "
        "eps_clip_low=3e-4 and eps_clip_high=4e-4, and token_aggregation=seq_mean).",
    )
    c_clip: float | None = Field(
        None, description="Dual-clip bound for negative advantages (must be > 1.0); null disables."
    )
    ppo_n_minibatches: int = Field(1, ge=1, description="PPO minibatches per training step.")
    reward_scaling: float = Field(1.0, description="Rewards are (r + reward_bias) * reward_scaling, then clipped.")
    reward_bias: float = Field(0.0, description="Added to rewards before scaling.")
    reward_clip: float = Field(20.0, gt=0, description="Rewards are clipped to [-reward_clip, reward_clip].")
    kl_ctl: float = Field(0.0, ge=0, description="KL penalty coefficient to the reference model; 0 disables.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token estimator of KL(policy || reference) in the penalty: k1 = log-ratio "
        "(unbiased, can be negative), k2 = squared log-ratio / 2, k3 = ratio - 1 - log-ratio (unbiased, >= 0).",
    )
    entropy_coeff: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus: the loss subtracts entropy_coeff x the policy entropy "
        "(aggregated like the loss; its gradient is a sampled-token estimate, docs/algorithms.md); 0 disables. "
        "The entropy is logged every step either way.",
    )
    recompute_logprob: bool = Field(
        True, description="Recompute logprobs with the current trainer weights before the update (proximal policy)."
    )
    recompute_first_minibatch: bool = Field(
        True,
        description="With recompute_logprob: the recompute pass covers the first PPO minibatch too. False "
        "takes that minibatch's proximal logprobs from its own training forward (detached), which runs at "
        "the same weights, before any update of the step: the pass then covers the other minibatches only "
        "(none with ppo_n_minibatches=1), and mismatch/* are measured over those.",
    )
    prox_logp_method: Literal["recompute", "loglinear", "metrics"] = Field(
        "recompute",
        description="With recompute_logprob, where the proximal logprobs come from. recompute: the "
        "recompute pass. loglinear: no pass; each token's is interpolated between its behaviour logprob "
        "and the current weights' in its own training forward, by how many versions old the token is "
        "(docs/algorithms.md; exact in the first PPO minibatch). metrics: the recompute pass, and "
        "train/loss_fn/prox_approx_abs_err says how far loglinear's value would be from it.",
    )
    use_decoupled_loss: bool = Field(
        True,
        description="Decoupled PPO loss: clip against recomputed proximal logprobs, importance-weight by "
        "behaviour logprobs (needs recompute_logprob).",
    )
    behav_imp_weight_cap: float | None = Field(
        None, gt=0, description="Cap on behaviour importance weights in the decoupled loss; tokens above are masked."
    )
    adv_norm: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage normalisation: per prompt group (GRPO), over the batch, or none."
    )
    adv_norm_std: bool = Field(True, description="Divide by the std as well as subtracting the mean.")
    token_aggregation: Literal["token_mean", "seq_mean", "seq_mean_token_sum"] = Field(
        "token_mean",
        description="Loss aggregation: mean over all tokens, mean of per-sequence means, or "
        "mean of per-sequence sums (Dr. GRPO: no length normalisation; the loss scales with answer length).",
    )
    rollout_is: Literal["none", "tis", "mis"] = Field(
        "none",
        description="Rollout-policy correction: weight the loss by rho = exp(trainer's proximal "
        "logprob - server's behaviour logprob), truncated at rollout_is_cap (tis) or zeroed above it (mis). "
        "It replaces the decoupled loss's raw behaviour weight; needs recompute_logprob (docs/algorithms.md).",
    )
    rollout_is_level: Literal["token", "sequence"] = Field(
        "token",
        description="rho per token, or per sequence (the product over its tokens, one weight for "
        "all of them: mis then drops whole sequences).",
    )
    rollout_is_cap: float = Field(
        2.0,
        ge=1,
        description="Cap C of the rollout correction's weight (and the threshold of mismatch/is_capped_frac).",
    )
    overlong_buffer_frac: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Overlong reward shaping (DAPO): in the last overlong_buffer_frac x "
        "gconfig.max_new_tokens tokens of the budget the reward falls linearly, down to -overlong_penalty at "
        "the full budget; 0 disables.",
    )
    overlong_penalty: float = Field(
        1.0, ge=0, description="Penalty at the full generation budget (see overlong_buffer_frac)."
    )
    weight_update: Literal["disk", "distributed", "tensor"] = Field(
        "disk",
        description="How new weights reach servers: save + reload from disk; broadcast over a "
        "process group (NCCL on GPU, gloo on CPU); or, for a server on the trainer's own device "
        "(launcher.colocate), through memory: SGLang's /update_weights_from_tensor with CUDA IPC handles "
        "(shared memory on CPU).",
    )
    collective_timeout_s: float = Field(
        7200.0,
        gt=0,
        description="Seconds a collective between trainer ranks (torch.distributed's default process group: "
        "gloo on CPU, NCCL on GPU) may wait for the other ranks before it fails with an error. It must exceed "
        "the longest time one rank works alone while the others wait: rank 0 gathering a batch (one request "
        "may take rollout.request_timeout_s), evaluating, or saving weights.",
    )
    weight_update_bucket_mb: int = Field(256, ge=1, description="Bucket size of distributed and tensor weight updates.")
    offload: bool = Field(
        False,
        description="Colocated synchronous runs (sglang.enable_memory_saver): move the trainer's "
        "parameters, gradients and optimizer state to CPU memory while the servers generate, and back "
        "for training, so generation can use the whole device.",
    )

    @field_validator("max_tokens_per_mb", mode="before")
    @classmethod
    def _token_budget(cls, value):
        return token_budget(value)


class RefConfig(Section):
    path: str | None = Field(
        None,
        description="Reference model for the KL penalty; null uses actor.path (the initial policy). "
        "Loaded only when actor.kl_ctl > 0.",
    )
    dtype: DType | None = Field(None, description="Reference dtype; null follows actor.dtype.")
