"""Options of the inference-server command line (SGLang's flags; the built-in server takes a subset).

Fields left null follow the rest of the config (model_path -> actor.path, dtype -> actor.dtype,
tp_size -> rollout backend tp, random_seed -> seed); the validation pass fills them in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import DType, Section


class SGLangConfig(Section):
    model_path: str | None = Field(None, description="Model the servers load; null follows actor.path.")
    tokenizer_path: str | None = Field(None, description="Tokenizer; null follows the model path.")
    dtype: DType | None = Field(None, description="Server dtype; null follows actor.dtype.")
    tp_size: int | None = Field(
        None, ge=1, description="Tensor parallel per server; null follows the rollout backend's t."
    )
    context_length: int | None = Field(None, ge=1, description="Max prompt + generation tokens; null uses the model's.")
    mem_fraction_static: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="Share of each device's memory a server may use for its weights and KV "
        "cache (the built-in server caps its allocator at it and admits requests while their KV cache fits). "
        "With launcher.colocate the rest is the trainer's.",
    )
    enable_memory_saver: bool | None = Field(
        None,
        description="Servers can release their KV cache and weights (/release_memory_occupation) and "
        "take them back (/resume_memory_occupation); with launcher.colocate the trainer then releases them "
        "for its training phase. SGLang's flag of the same name. Null: on for colocated synchronous runs "
        "(rollout.max_head_offpolicyness=0), off otherwise.",
    )
    random_seed: int | None = Field(None, description="Server sampling seed; null follows seed.")
    host: str = Field("127.0.0.1", description="Interface servers bind to (loopback for local runs).")
    api_key: str | None = Field(None, description="Require this bearer key on server routes; the client sends it.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("warning", description="Server log level.")
    max_running_requests: int | None = Field(None, ge=1, description="Batch bound per server.")
    max_queued_requests: int | None = Field(
        None,
        ge=0,
        description="Requests a server holds beyond its running batch; more are answered 503 "
        "(back-pressure: the client asks again, with backoff, within rollout.request_timeout_s). Null: the "
        "server's default (built-in 1024, SGLang unbounded).",
    )
    max_prefill_tokens: int | None = Field(
        None,
        ge=1,
        description="Most prompt tokens prefilled in one forward pass (the built-in server counts "
        "them padded to the longest prompt); null: the server's default, 16384 in both. Each prefill is a "
        "host-bound pass, so a larger value admits a batch of prompts in fewer of them.",
    )
    chunked_prefill_size: int | None = Field(None, description="SGLang chunked prefill size.")
    attention_backend: str | None = Field(None, description="SGLang attention backend (e.g. fa3, flashinfer).")
    disable_cuda_graph: bool = Field(False, description="Turn off SGLang CUDA graphs (faster start-up).")
    cuda_graph_max_bs: int | None = Field(
        None,
        ge=1,
        description="SGLang: the largest decode batch captured in a CUDA graph (larger batches run without "
        "one; --cuda-graph-max-bs-decode since 0.5.16). Null: sglang.max_running_requests, at most 512; "
        "with that null too, SGLang's choice from the GPU's memory (256 on an H100 or H200 at tp below 4 "
        "in 0.5.16).",
    )
    sampling_backend: Literal["flashinfer", "pytorch"] | None = Field(
        None, description="SGLang: the sampling kernels; null: SGLang's choice (flashinfer where it is installed)."
    )
    disable_radix_cache: bool = Field(
        False,
        description="SGLang: no prefix cache, also under rollout.pause_mode abort and in_place (retract always "
        "runs without it): to measure what the cache saves a run.",
    )
    enable_metrics: bool = Field(False, description="SGLang Prometheus metrics.")
    skip_tokenizer_init: bool = Field(False, description="Serve token ids only (the client sends input_ids).")
    incremental_streaming_output: bool | None = Field(
        None,
        description="SGLang: a streamed answer's chunks hold only their new tokens and logprobs, not the "
        "whole answer so far (the client reads both); null: on where SGLang streams the answers "
        "(rollout.stream_interval, its auto resolved for rollout.pause_mode), off otherwise: the whole "
        "answer in every chunk costs the client's parse O(n^2), scripts/bench_stream_parse.py, and a "
        "chunk a token so cut the 0.5B pipeline to 39.99 samples/s from 105.11 (docs/benchmarks.md section 10).",
    )
    enable_lora: bool | None = Field(
        None, description="SGLang: serve LoRA adapters; null follows actor.use_lora with actor.lora_push=adapter."
    )
    max_lora_rank: int | None = Field(
        None,
        ge=1,
        description="SGLang: largest adapter rank it can load; null follows actor.lora_rank when adapters are pushed.",
    )
    lora_target_modules: list[str] | None = Field(
        None,
        description="SGLang: modules adapters may target; null follows actor.target_modules when adapters are pushed.",
    )
    weight_dirs: list[str] = Field(
        default_factory=list,
        description="Built-in server: extra folders /update_weights_from_disk may load from. The run's "
        "weight_update/, checkpoints/ and models/ folders and the model's folder are always allowed; "
        "['/'] allows any path. SGLang servers load any path.",
    )
