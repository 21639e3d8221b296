"""Rollout side: inference servers, the async executor's limits, sampling and the workflow."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from .base import Section


class RolloutConfig(Section):
    backend: str = Field("sglang:d1t1", description="Inference layout: sglang:d<servers>t<tensor parallel per server>.")
    server: Literal["auto", "sglang", "builtin"] = Field(
        "auto",
        description="Server program: SGLang (python -m sglang.launch_server), the project's built-in "
        "transformers server (python -m areal.server, same HTTP API), or auto (SGLang where it is "
        "installed and CUDA is present, built-in otherwise).",
    )
    max_concurrent_rollouts: int | None = Field(
        None, ge=1, description="Most rollouts in flight at once; null uses consumer_batch_size."
    )
    consumer_batch_size: int | None = Field(
        None, ge=1, description="Prompts the trainer consumes per step; null uses train_dataset.batch_size."
    )
    max_head_offpolicyness: int = Field(
        0, ge=0, description="Bounded staleness: how many weight versions a sample may lag; 0 is synchronous."
    )
    dynamic_sampling: bool = Field(
        False,
        description="Dynamic sampling (DAPO): drop each group whose rewards are all equal (it has no "
        "learning signal under group-normalised advantages) and generate more prompts until the batch is "
        "full. Dropped groups count against no staleness bound; rollout.max_overgeneration bounds them.",
    )
    max_overgeneration: float = Field(
        4.0,
        ge=0,
        description="Most groups a filter (rollout.dynamic_sampling, or a should_accept given to "
        "prepare_batch) may drop between two batches, in multiples of consumer_batch_size. When reached, "
        "the next groups are kept whatever their rewards until the batch is handed out, with a warning "
        "naming this key; 0 keeps every group.",
    )
    request_timeout_s: float = Field(3600.0, gt=0, description="Timeout of one generation request.")
    weight_update_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Deadline of each weight load on the servers (a disk folder, a tensor bucket, a broadcast "
        "bucket) and of the weight-update group's collectives; a server that takes the request and never "
        "answers (stopped, hung) is named past it. Generous: a 1.5B model loads from disk in about 4 s on an "
        "H200 and in a few minutes from slow storage at 70B.",
    )
    control_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Deadline of the control calls that answer at once (pause, continue, server information, "
        "cache flush); a server silent past it is named. A pause in abort mode waits for the server to abort "
        "what runs, well under a second when healthy.",
    )
    request_retries: int = Field(3, ge=0, description="Retries of a request after a connection error.")
    setup_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Seconds the client waits for servers to become healthy. areal-launch starts trainers with "
        "the servers (unless colocated) and raises it to launcher.server_startup_timeout_s for them.",
    )
    server_addrs: list[str] = Field(
        default_factory=list,
        description="host:port of servers already running; empty means discover the run's own servers.",
    )
    replay_path: str | None = Field(
        None, description="Trainer-only runs: replay rollouts saved by an inference-only run (a rollouts/ folder)."
    )
    pause_mode: Literal["auto", "abort", "retract", "in_place"] = Field(
        "auto",
        description="How servers pause for a weight update. abort: the server answers the requests in "
        "flight, the client resubmits prompt + tokens so far after the update (the prefix cache is flushed "
        "in between). retract: they wait in the server without their KV cache and are prefilled again under "
        "the new weights (SGLang then runs with --disable-radix-cache). in_place: they keep the KV cache "
        "computed by the old weights (no re-prefill; later tokens attend to old keys and values). Every "
        "request's prefix-cache namespace is its weight version. auto: per server program, the mode "
        "measured to learn best among those that work on it: retract on the built-in server, abort "
        "on SGLang (areal/infra/pause.py; docs/benchmarks.md sections 5 and 9). Token versions: SGLang "
        "reports one weight version per answer, so under retract and in_place a request that lives through "
        "an update counts as wholly new (rollout/staleness_* are lower bounds, rollout/mixed_version_frac "
        "reads 0) unless rollout.stream_interval labels its chunks (auto does for these modes); abort and "
        "the built-in server label every token with its own version. "
        "weight_update/requests_in_flight counts the requests each pause met, on every server program.",
    )
    stream_interval: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto",
        description="Stream each answer from the servers in chunks of this many tokens and label each "
        "chunk's tokens with the weight version the server reports as it sends the chunk: under retract "
        "and in_place on SGLang (one version per answer otherwise) the tokens an answer made before an "
        "update keep the old version, within this many tokens of where the weights changed (on SGLang "
        "0.5.16 the label came about 7 tokens late at a chunk a token). null: answers come whole. auto: "
        "every 16 tokens where the resolved pause mode holds requests through an update (retract, "
        "in_place) on servers other than the built-in one, whole answers otherwise (areal/infra/pause.py; "
        "16 cost 4-9% of the 0.5B pipeline's samples/s, docs/benchmarks.md section 10). Costs a chunk per "
        "interval on the server and the client; the built-in server labels every token exactly either way.",
    )
    pause_ahead_minibatches: int = Field(
        0,
        ge=0,
        description="Pause the servers for the coming weight update when the step's last N PPO minibatches "
        "start training, instead of when the update begins. The pause (in abort mode it aborts the requests "
        "in flight and waits for their answers: 0.24-0.63 s at 512 requests on one H100) then overlaps "
        "training, and those minibatches train without generation beside them; the servers generate that "
        "much less per step. For asynchronous runs whose trainer sets the pace. 0: pause at the update. At "
        "most actor.ppo_n_minibatches. weight_update/pause_ahead_s is the pause's own time, "
        "weight_update/pause_s what the update still waited for it.",
    )
    server_warmup: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Before step 0 the trainer sends the servers short bursts of requests: at the run's "
        "generation concurrency with its sampling settings, at its evaluation batch (greedy), and both at "
        "once, so that the kernels SGLang compiles on first use (per batch shape, and for batches mixing "
        "greedy and sampled requests) are built before the first step and evaluation. auto: on for SGLang "
        "servers, off for the built-in server (nothing to compile).",
    )
    gil_switch_interval_ms: float | None = Field(
        0.2,
        gt=0,
        description="GIL switch interval (sys.setswitchinterval, in ms) that the processes running the "
        "rollout client thread set at start: the trainer's rank 0 and the rollout driver. A shorter "
        "interval hands the GIL back sooner to the training thread, which releases it at every torch "
        "op. Only lowers the interval; null keeps Python's (5 ms).",
    )


class GenerationConfig(Section):
    n_samples: int = Field(4, ge=1, description="Samples per prompt (the GRPO group size).")
    max_new_tokens: int = Field(1024, ge=1, description="Generation budget per sample.")
    min_new_tokens: int = Field(0, ge=0, description="Tokens generated before stop conditions apply.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(-1, description="Top-k sampling; -1 disables.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    stop_token_ids: list[int] = Field(default_factory=list, description="Extra stop token ids (eos always stops).")
    ignore_eos: bool = Field(False, description="Keep generating past eos (benchmarks with fixed lengths).")


class AgentConfig(Section):
    run: str | None = Field(
        None,
        description="The agent: import path 'package.module:function' of `async def run(client, data)`, "
        "where client is an openai.AsyncOpenAI pointed at the rollout proxy and data a dataset record. It "
        "returns the episode's reward, or a dict with 'reward' and other numbers, logged per step as "
        "rollout/agent/<name>. Required by workflow.type=agent.",
    )
    samples: Literal["conversation", "call"] = Field(
        "conversation",
        description="Training samples of an episode: 'conversation' is one sample, the longest "
        "chain of calls whose prompts extend each other, with the loss on the model's tokens; 'call' is one "
        "sample per call (max_calls rows per episode, unused ones empty). docs/customization.md weighs them.",
    )
    max_calls: int = Field(
        8,
        ge=1,
        description="Model calls one episode may make; past it the proxy answers HTTP 429 (code episode_call_limit).",
    )
    workers: int = Field(
        1,
        ge=0,
        description="Processes that run the agent episodes, each with its own event loop, OpenAI proxy and "
        "client of the servers, so that the agents' Python does not take the trainer's GIL; the trainer "
        "keeps admission (the staleness bound), pause and the batches. 0 runs them in the trainer's "
        "process. One process served 2,048 concurrent runs of the tiny CPU agent (docs/reliability.md).",
    )
    chat_template: str | None = Field(
        None,
        description="Chat template for agent traffic instead of the tokenizer's: 'chatml_tools' (ChatML "
        "with tools and <tool_call> blocks, built in) or a Jinja file. For models whose own template ignores "
        "tools, e.g. SmolLM2-135M-Instruct.",
    )


class WorkflowConfig(Section):
    type: str = Field(
        "rlvr",
        description="'rlvr' (one answer per sample), 'multi_turn' (feedback and retry), 'agent' (an "
        "OpenAI-API agent, workflow.agent), or an import path 'package.module:Class' of a RolloutWorkflow.",
    )
    reward_fn: str = Field(
        "gsm8k", description="Reward function: a registered name (gsm8k, arith_shaped) or 'package.module:function'."
    )
    reward_timeout_s: float = Field(15.0, gt=0, description="A reward call slower than this scores 0.")
    reward_workers: int = Field(2, ge=1, description="Processes that compute rewards.")
    max_turns: int = Field(2, ge=1, description="multi_turn: attempts per sample.")
    turn_discount: float = Field(
        1.0, gt=0, le=1, description="multi_turn: reward factor per retry (a first-turn answer gets the full reward)."
    )
    system_prompt: str | None = Field(None, description="System message prepended to each prompt.")
    workers: int = Field(
        0,
        ge=0,
        description="Processes that run the episodes of rlvr, multi_turn or a custom workflow, each building "
        "the workflow and a client of the servers of its own, so that the episodes' Python (HTTP client, chat "
        "template, tokenizer) does not take the trainer's GIL; the trainer keeps admission (the staleness "
        "bound), pauses and the batches. 0 runs them in the trainer's process, as evaluations always run. "
        "Agents have their own: workflow.agent.workers.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for a custom workflow.")
    agent: AgentConfig = Field(
        default_factory=AgentConfig, description="workflow.type=agent: an agent written against the OpenAI API."
    )
