"""The trained policy: model, parallelism, precision, optimizer, micro-batching, LoRA and PPO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import DType, Section


class OptimizerConfig(Section):
    type: Literal["adamw"] = Field("adamw", description="Optimizer (AdamW).")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Schedule after warmup.")
    warmup_steps_proportion: float = Field(
        0.0, ge=0, le=1, description="Fraction of total steps with linear warmup from 0.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final LR as a fraction of lr for linear/cosine schedules.")
    gradient_clipping: float | None = Field(
        1.0, gt=0, description="Max global gradient norm; null disables clipping.")


class ActorConfig(Section):
    path: str | None = Field(
        None, description="Model to train: a Hugging Face folder or hub id. Required when trainers run.")
    tokenizer_path: str | None = Field(None, description="Tokenizer location; defaults to path.")
    backend: str = Field(
        "fsdp:d1", description="Trainer parallelism, e.g. fsdp:d4 (FSDP), fsdp:d4r2 (HSDP 2x2), fsdp:d2t2 (TP).")
    dtype: DType = Field("bfloat16", description="Parameter dtype during compute.")
    grad_reduce_dtype: DType = Field("float32", description="Dtype of gradient reduction across ranks.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and LR schedule.")
    max_tokens_per_mb: int = Field(
        16384, ge=1, description="Token budget of one packed micro-batch (sequences are packed, never split).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    compile: bool = Field(
        False, description="torch.compile every decoder layer: fuses norms, rotary embeddings and activations "
        "(the first two steps pay the compilation, tens of seconds; needs a C++ compiler on CPU).")
    # LoRA (peft)
    use_lora: bool = Field(False, description="Train LoRA adapters (peft) instead of all weights.")
    lora_rank: int = Field(16, ge=1, description="LoRA rank r.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha (scaling = lora_alpha / lora_rank).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get adapters.")
    lora_push: Literal["merged", "adapter"] = Field(
        "merged", description="What weight updates send to servers: merged dense weights or adapters only.")
    # PPO / GRPO objective
    eps_clip: float = Field(0.2, gt=0, description="PPO ratio clip epsilon.")
    c_clip: float | None = Field(
        None, description="Dual-clip bound for negative advantages (must be > 1.0); null disables.")
    ppo_n_minibatches: int = Field(1, ge=1, description="PPO minibatches per training step.")
    reward_scaling: float = Field(1.0, description="Rewards are (r + reward_bias) * reward_scaling, then clipped.")
    reward_bias: float = Field(0.0, description="Added to rewards before scaling.")
    reward_clip: float = Field(20.0, gt=0, description="Rewards are clipped to [-reward_clip, reward_clip].")
    kl_ctl: float = Field(0.0, ge=0, description="KL penalty coefficient to the reference model; 0 disables.")
    recompute_logprob: bool = Field(
        True, description="Recompute logprobs with the current trainer weights before the update (proximal policy).")
    use_decoupled_loss: bool = Field(
        True, description="Decoupled PPO loss: clip against recomputed proximal logprobs, importance-weight by "
        "behaviour logprobs (needs recompute_logprob).")
    behav_imp_weight_cap: float | None = Field(
        None, gt=0, description="Cap on behaviour importance weights in the decoupled loss; tokens above are masked.")
    adv_norm: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage normalisation: per prompt group (GRPO), over the batch, or none.")
    adv_norm_std: bool = Field(True, description="Divide by the std as well as subtracting the mean.")
    token_aggregation: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="Loss aggregation: mean over all tokens, or mean of per-sequence means.")
    weight_update: Literal["disk", "distributed"] = Field(
        "disk", description="How new weights reach servers: save + reload from disk, or broadcast "
        "over a process group (NCCL on GPU, gloo on CPU).")
    weight_update_bucket_mb: int = Field(256, ge=1, description="Bucket size of distributed weight broadcasts.")


class RefConfig(Section):
    path: str | None = Field(
        None, description="Reference model for the KL penalty; null uses actor.path (the initial policy). "
        "Loaded only when actor.kl_ctl > 0.")
    dtype: DType | None = Field(None, description="Reference dtype; null follows actor.dtype.")
