"""Cross-field rules of the experiment config, checked after the merge in one pass.

Each rule is a function of the validated config returning ConfigIssues; `RULES` lists them.
A rule may only read sections that validated, so `check_rules` is also run on a config whose
broken sections were replaced by defaults, and issues touching those sections are dropped.
"""

from __future__ import annotations

from .data import BUILTIN_DATASETS, GENERATED_DATASETS
from .errors import ConfigIssue
from .experiment import ExperimentConfig, trainer_memory_share
from .parallel import ParallelStrategy, ParallelStrategyError, parse_parallel


def trainer_runs(cfg: ExperimentConfig) -> bool:
    return cfg.launcher.trainer_n_nodes > 0


def servers_run(cfg: ExperimentConfig) -> bool:
    return cfg.launcher.rollout_n_nodes > 0


def actor_strategy(cfg: ExperimentConfig) -> ParallelStrategy | None:
    try:
        return parse_parallel(cfg.actor.backend, allowed_backends=("fsdp",))
    except ParallelStrategyError:
        return None


def rollout_strategy(cfg: ExperimentConfig) -> ParallelStrategy | None:
    try:
        return parse_parallel(cfg.rollout.backend, allowed_backends=("sglang",))
    except ParallelStrategyError:
        return None


def _backend_strings(cfg):
    for key, value, backend in (
        ("actor.backend", cfg.actor.backend, "fsdp"),
        ("rollout.backend", cfg.rollout.backend, "sglang"),
    ):
        try:
            parse_parallel(value, allowed_backends=(backend,))
        except ParallelStrategyError as e:
            example = (
                "'fsdp:d4' (FSDP), 'fsdp:d4r2' (HSDP: 2 replicas of 2 shards) or 'fsdp:d2t2' (TP)"
                if backend == "fsdp"
                else "'sglang:d2' (2 servers) or 'sglang:d2t2' (2 servers of TP 2)"
            )
            yield ConfigIssue(
                key,
                value,
                str(e),
                f"write it like {example}: d is the data-parallel "
                "size, r (HSDP replicas) divides d, t is the tensor-parallel size",
            )


def _c_clip(cfg):
    c = cfg.actor.c_clip
    if c is not None and c <= 1.0:
        yield ConfigIssue(
            "actor.c_clip",
            c,
            "dual clip must be > 1.0 when set",
            "set actor.c_clip to a value above 1 (3.0 is common) or null to disable it",
        )


def _decoupled_needs_recompute(cfg):
    if cfg.actor.use_decoupled_loss and not cfg.actor.recompute_logprob:
        yield ConfigIssue(
            "actor.use_decoupled_loss",
            True,
            "the decoupled loss needs proximal logprobs recomputed by the trainer",
            "set actor.recompute_logprob=true, or actor.use_decoupled_loss=false",
        )


def _prox_logp_method(cfg):
    a = cfg.actor
    if a.prox_logp_method == "recompute":
        return
    if not a.recompute_logprob:
        yield ConfigIssue(
            "actor.prox_logp_method",
            a.prox_logp_method,
            "it says where the proximal logprobs come from, and with actor.recompute_logprob=false "
            "the loss uses the servers' logprobs instead",
            "set actor.recompute_logprob=true, or actor.prox_logp_method=recompute",
        )
    elif a.prox_logp_method == "loglinear" and a.rollout_is != "none":
        yield ConfigIssue(
            "actor.prox_logp_method",
            a.prox_logp_method,
            f"actor.rollout_is={a.rollout_is} weights by the trainer's proximal logprob over the server's; "
            "interpolated from the server's own logprob, that weight is 1 on every token of the current version",
            "set actor.prox_logp_method=recompute (or metrics), or actor.rollout_is=none",
        )


def _group_norm_needs_samples(cfg):
    if cfg.actor.adv_norm == "group" and cfg.gconfig.n_samples < 2:
        yield ConfigIssue(
            "gconfig.n_samples",
            cfg.gconfig.n_samples,
            "group-normalised advantages need at least 2 samples per prompt",
            "set gconfig.n_samples>=2, or actor.adv_norm=batch",
        )


def _batch_divisible(cfg):
    st = actor_strategy(cfg)
    if st is None or not trainer_runs(cfg):
        return
    n = cfg.train_dataset.batch_size * cfg.gconfig.n_samples
    if n % st.dp:
        yield ConfigIssue(
            "train_dataset.batch_size",
            cfg.train_dataset.batch_size,
            f"batch_size x gconfig.n_samples = {n} sequences do not split evenly over "
            f"the {st.dp} data-parallel ranks of actor.backend={cfg.actor.backend}",
            f"make batch_size x n_samples a multiple of {st.dp}",
        )
    elif n % (st.dp * cfg.actor.ppo_n_minibatches):
        yield ConfigIssue(
            "actor.ppo_n_minibatches",
            cfg.actor.ppo_n_minibatches,
            f"{n} sequences per step do not split into {cfg.actor.ppo_n_minibatches} "
            f"minibatches on each of {st.dp} ranks",
            "choose ppo_n_minibatches dividing batch_size x n_samples / dp",
        )


def _pause_ahead(cfg):
    ahead, n = cfg.rollout.pause_ahead_minibatches, cfg.actor.ppo_n_minibatches
    if ahead > n:
        yield ConfigIssue(
            "rollout.pause_ahead_minibatches",
            ahead,
            f"a step trains {n} PPO minibatches (actor.ppo_n_minibatches), so the servers cannot pause "
            f"{ahead} minibatches before its end",
            f"set rollout.pause_ahead_minibatches to at most {n} ({n}: pause as training starts), or 0",
        )


def _shared_prompts(cfg):
    if cfg.actor.share_prompts is True and cfg.actor.logprobs_on_every_token:
        yield ConfigIssue(
            "actor.share_prompts",
            True,
            "a shared prompt's tokens get no logprobs of their own, and actor.logprobs_on_every_token=true "
            "asks for every token's",
            "set actor.logprobs_on_every_token=false, or actor.share_prompts to auto or false",
        )


def _node_counts(cfg):
    la, cl = cfg.launcher, cfg.cluster
    if la.trainer_n_nodes == 0 and la.rollout_n_nodes == 0:
        yield ConfigIssue(
            "launcher.trainer_n_nodes",
            0,
            "trainer_n_nodes and rollout_n_nodes are both 0: nothing would run",
            "keep at least one side: trainer_n_nodes=0 is inference-only, rollout_n_nodes=0 is trainer-only",
        )
    for key, n in (("launcher.trainer_n_nodes", la.trainer_n_nodes), ("launcher.rollout_n_nodes", la.rollout_n_nodes)):
        if n > cl.n_nodes:
            yield ConfigIssue(
                key, n, f"more nodes than cluster.n_nodes={cl.n_nodes}", f"lower {key} or raise cluster.n_nodes"
            )
    if cl.n_nodes > 1 and la.trainer_n_nodes + la.rollout_n_nodes > cl.n_nodes:
        yield ConfigIssue(
            "launcher.trainer_n_nodes",
            la.trainer_n_nodes,
            f"trainer_n_nodes + rollout_n_nodes = {la.trainer_n_nodes + la.rollout_n_nodes} "
            f"exceeds cluster.n_nodes={cl.n_nodes} (multi-node runs give each side its own nodes)",
            "lower one of the node counts or raise cluster.n_nodes",
        )


def _devices_fit(cfg):
    """Parallel sizes against the devices the cluster has (single node: both sides share it)."""
    la, cl = cfg.launcher, cfg.cluster
    per_node = cl.n_gpus_per_node
    sides = []
    st = rollout_strategy(cfg)
    if st is not None and servers_run(cfg):
        sides.append(("rollout.backend", cfg.rollout.backend, st.world_size, la.rollout_n_nodes))
    st = actor_strategy(cfg)
    if st is not None and trainer_runs(cfg):
        sides.append(("actor.backend", cfg.actor.backend, st.world_size, la.trainer_n_nodes))
    if cl.n_nodes == 1:
        # colocated sides share devices: the larger side counts, not the sum
        total = max(s[2] for s in sides) if la.colocate and sides else sum(s[2] for s in sides)
        if total > per_node:
            key, value = sides[-1][0], sides[-1][1]
            joined = (" | " if la.colocate else " + ").join(f"{s[1]}={s[2]}" for s in sides)
            fix = "shrink the backends or raise cluster.n_gpus_per_node / n_nodes"
            if not la.colocate and max(s[2] for s in sides) <= per_node:
                fix += ", or share the devices with launcher.colocate=true"
            yield ConfigIssue(
                key,
                value,
                f"the plan needs {total} devices on one node ({joined}) but cluster.n_gpus_per_node={per_node}",
                fix,
            )
        return
    for key, value, need, nodes in sides:
        if need > nodes * per_node:
            yield ConfigIssue(
                key,
                value,
                f"needs {need} devices but its {nodes} node(s) have {nodes * per_node}",
                "shrink the backend or give that side more nodes",
            )
        elif nodes > 1 and need % nodes:
            yield ConfigIssue(
                key,
                value,
                f"{need} devices do not spread evenly over {nodes} nodes",
                "use a size divisible by the side's node count",
            )


def _sglang_tp_matches(cfg):
    st = rollout_strategy(cfg)
    if st is not None and cfg.sglang.tp_size is not None and cfg.sglang.tp_size != st.tp:
        yield ConfigIssue(
            "sglang.tp_size",
            cfg.sglang.tp_size,
            f"differs from the tensor-parallel size t{st.tp} of rollout.backend={cfg.rollout.backend}",
            "leave sglang.tp_size null (it follows rollout.backend) or make them equal",
        )


def _context_fits(cfg):
    ctx = cfg.sglang.context_length
    if ctx is None:
        return
    prompt = cfg.train_dataset.max_prompt_len or 0
    need = prompt + cfg.gconfig.max_new_tokens
    if ctx < need:
        yield ConfigIssue(
            "sglang.context_length",
            ctx,
            f"shorter than train_dataset.max_prompt_len ({prompt}) + gconfig.max_new_tokens "
            f"({cfg.gconfig.max_new_tokens}) = {need}",
            f"raise sglang.context_length to at least {need} or lower the budgets",
        )


def _model_paths(cfg):
    if trainer_runs(cfg) and not cfg.actor.path:
        yield ConfigIssue(
            "actor.path",
            None,
            "required: trainer workers are launched",
            "set actor.path to a Hugging Face model folder or hub id",
        )
    if servers_run(cfg) and not cfg.sglang.model_path:
        yield ConfigIssue(
            "sglang.model_path",
            None,
            "required: inference servers are launched (it follows actor.path when null)",
            "set actor.path (or sglang.model_path)",
        )


def _trainer_only_source(cfg):
    r = cfg.rollout
    if trainer_runs(cfg) and not servers_run(cfg) and not r.server_addrs and not r.replay_path:
        yield ConfigIssue(
            "rollout.server_addrs",
            [],
            "a trainer-only run (launcher.rollout_n_nodes=0) needs rollouts from somewhere",
            "set rollout.server_addrs=[host:port,...] of running "
            "servers, or rollout.replay_path to a rollouts/ folder of an inference-only run",
        )
    if r.replay_path and servers_run(cfg):
        yield ConfigIssue(
            "rollout.replay_path",
            r.replay_path,
            "replay is for trainer-only runs",
            "add launcher.rollout_n_nodes=0, or drop rollout.replay_path",
        )


def _datasets(cfg):
    sides = [("train_dataset", cfg.train_dataset)]
    if cfg.evaluator.freq_steps:
        sides.append(("valid_dataset", cfg.valid_dataset))
    for name, d in sides:
        if d.type not in BUILTIN_DATASETS and ":" not in d.type:
            yield ConfigIssue(
                f"{name}.type",
                d.type,
                "not a built-in loader nor an import path",
                f"use one of {', '.join(BUILTIN_DATASETS)} or 'package.module:function'",
            )
        elif d.type == "files" and not d.path:
            yield ConfigIssue(
                f"{name}.path",
                None,
                "required by type=files",
                f"set {name}.path to a jsonl/json/parquet file or folder",
            )
        elif d.type in GENERATED_DATASETS:
            known = _loader_keywords(BUILTIN_DATASETS[d.type])
            for key in sorted(set(d.kwargs) - known):
                yield ConfigIssue(
                    f"{name}.kwargs.{key}",
                    d.kwargs[key],
                    f"not an argument of the {d.type} loader",
                    f"drop it, or use {', '.join(sorted(known))}",
                )


def _loader_keywords(target: str) -> set[str]:
    import importlib
    import inspect

    module, name = target.split(":")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    return {p for p, v in params.items() if p != "split" and v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)}


def _lora_push(cfg):
    a = cfg.actor
    if a.use_lora and a.lora_push == "adapter" and a.weight_update != "disk":
        yield ConfigIssue(
            "actor.lora_push",
            "adapter",
            "adapter pushes go through disk only",
            "set actor.weight_update=disk or actor.lora_push=merged",
        )


def _stop_strings_need_tokenizer(cfg):
    # both servers refuse each such request at run time (SGLang: sampling_params.py; built-in:
    # routes_generate.py); the workflows send gconfig.stop with every request
    if cfg.sglang.skip_tokenizer_init and cfg.gconfig.stop and servers_run(cfg):
        yield ConfigIssue(
            "gconfig.stop",
            cfg.gconfig.stop,
            "stop strings are matched on the servers' decoded text, and sglang.skip_tokenizer_init=true "
            "leaves them without a tokenizer",
            "list the stop tokens' ids in gconfig.stop_token_ids instead, or set sglang.skip_tokenizer_init=false",
        )


def _restart_needs_full_disk_updates(cfg):
    """A restarted server loads the folder of the last disk weight update (launcher/supervisor.py);
    a distributed broadcast group or a LoRA adapter cannot be given back to it."""
    a = cfg.actor
    if not (cfg.launcher.restart_failed_servers and trainer_runs(cfg) and servers_run(cfg)):
        return
    if a.weight_update != "disk":
        yield ConfigIssue(
            "launcher.restart_failed_servers",
            True,
            f"a restarted server cannot be given the {a.weight_update} weight updates it missed",
            "set actor.weight_update=disk, or launcher.restart_failed_servers=false",
        )
    elif a.use_lora and a.lora_push == "adapter":
        yield ConfigIssue(
            "launcher.restart_failed_servers",
            True,
            "a restarted server would serve the base model without the LoRA adapter",
            "set actor.lora_push=merged, or launcher.restart_failed_servers=false",
        )


def _profiled_steps(cfg):
    """A traced step that never runs would leave a user waiting for a trace that never comes."""
    steps, last = cfg.profiler.steps, cfg.total_train_steps
    if steps and not trainer_runs(cfg):
        yield ConfigIssue(
            "profiler.steps",
            steps,
            "nothing trains in an inference-only run",
            "set launcher.trainer_n_nodes or profiler.steps=[]",
        )
    elif last is not None and (late := [s for s in steps if s > last]):
        yield ConfigIssue(
            "profiler.steps",
            steps,
            f"step(s) {late} come after total_train_steps={last}",
            f"choose steps between 1 and {last}",
        )


def _clip_bounds(cfg):
    """actor.eps_clip is the symmetric shorthand that eps_clip_low / eps_clip_high follow when null
    (resolve_follow_defaults fills them in). With both set (an algo preset sets them), a changed
    eps_clip would do nothing: that is reported, not ignored. The lower bound 1 - eps must stay > 0."""
    a = cfg.actor
    low, high = a.eps_clip_low, a.eps_clip_high
    if (
        low is not None
        and high is not None
        and a.eps_clip != type(a).model_fields["eps_clip"].default
        and a.eps_clip not in (low, high)
    ):
        yield ConfigIssue(
            "actor.eps_clip",
            a.eps_clip,
            f"has no effect: actor.eps_clip_low={low} and actor.eps_clip_high={high} are both "
            "set (an algo preset sets them)",
            "set actor.eps_clip_low and actor.eps_clip_high instead, or null them to follow actor.eps_clip",
        )
    if low is not None and low >= 1:
        yield ConfigIssue(
            "actor.eps_clip_low",
            low,
            f"the ratio's lower clip bound 1 - {low} is not positive (eps_clip_low follows "
            "actor.eps_clip when not set)",
            "set actor.eps_clip_low (or actor.eps_clip) below 1, e.g. 0.2",
        )


def _rollout_correction(cfg):
    a = cfg.actor
    if a.rollout_is == "none":
        return
    if not a.recompute_logprob:
        yield ConfigIssue(
            "actor.rollout_is",
            a.rollout_is,
            "the correction compares the trainer's recomputed logprobs with the servers'; "
            "without actor.recompute_logprob both are the servers' and every weight is 1",
            "set actor.recompute_logprob=true, or actor.rollout_is=none",
        )
    if a.use_decoupled_loss and a.behav_imp_weight_cap is not None:
        yield ConfigIssue(
            "actor.behav_imp_weight_cap",
            a.behav_imp_weight_cap,
            f"two caps on one weight: actor.rollout_is={a.rollout_is} replaces the decoupled "
            "loss's behaviour weight, which this caps",
            f"set actor.behav_imp_weight_cap=null and cap with actor.rollout_is_cap (now "
            f"{a.rollout_is_cap}), or set actor.rollout_is=none",
        )


def _dynamic_sampling(cfg):
    r = cfg.rollout
    if not r.dynamic_sampling:
        return
    if cfg.gconfig.n_samples < 2:
        yield ConfigIssue(
            "rollout.dynamic_sampling",
            True,
            "a group of one answer always has equal rewards: every group would be dropped",
            "set gconfig.n_samples>=2, or rollout.dynamic_sampling=false",
        )
    if not trainer_runs(cfg) or r.replay_path:
        yield ConfigIssue(
            "rollout.dynamic_sampling",
            True,
            "it filters the live rollouts of a training run; an inference-only run "
            "(launcher.trainer_n_nodes=0) saves, and a replay (rollout.replay_path) trains, "
            "every group as generated",
            "set rollout.dynamic_sampling=false for this run",
        )


def _colocation(cfg):
    """launcher.colocate: one node, both sides running, and weight updates that work inside a device."""
    la, a = cfg.launcher, cfg.actor
    if not la.colocate:
        if a.weight_update == "tensor" and trainer_runs(cfg) and servers_run(cfg):
            yield ConfigIssue(
                "actor.weight_update",
                "tensor",
                "tensor updates hand CUDA IPC handles to a "
                "server on the trainer's own device, and the servers have devices of their own",
                "set launcher.colocate=true, or actor.weight_update=disk (or distributed)",
            )
        return
    if cfg.cluster.n_nodes != 1:
        yield ConfigIssue(
            "launcher.colocate",
            True,
            f"colocation runs on one node; cluster.n_nodes={cfg.cluster.n_nodes}",
            "set cluster.n_nodes=1, or launcher.colocate=false",
        )
    if not (trainer_runs(cfg) and servers_run(cfg)):
        yield ConfigIssue(
            "launcher.colocate",
            True,
            "colocation needs both servers and trainers, but launcher.trainer_n_nodes or launcher.rollout_n_nodes is 0",
            "drop launcher.colocate for inference-only or trainer-only runs",
        )
    if a.weight_update == "distributed" and cfg.cluster.device != "cpu":
        yield ConfigIssue(
            "actor.weight_update",
            "distributed",
            "NCCL refuses two ranks of one group on one GPU, which a colocated broadcast would need",
            "set actor.weight_update=tensor (through memory, CUDA IPC) or disk",
        )
    st = rollout_strategy(cfg)
    if a.weight_update == "tensor" and st is not None and st.dp > 1:
        yield ConfigIssue(
            "rollout.backend",
            cfg.rollout.backend,
            "tensor updates reach the one server on trainer rank 0's device; this backend runs several servers",
            "use one server (sglang:d1, or sglang:d1tN with SGLang) or actor.weight_update=disk",
        )


def _mps(cfg):
    """launcher.mps: a daemon for processes that share a GPU, started by the local backend."""
    la = cfg.launcher
    if not la.mps:
        if la.mps_server_sm_percent is not None:
            yield ConfigIssue(
                "launcher.mps_server_sm_percent",
                la.mps_server_sm_percent,
                "caps the servers' multiprocessors through MPS, which launcher.mps=false does not start",
                "set launcher.mps=true, or drop launcher.mps_server_sm_percent",
            )
        if la.mps_server_priority != "normal":
            yield ConfigIssue(
                "launcher.mps_server_priority",
                la.mps_server_priority,
                "sets the servers' priority among MPS clients, and launcher.mps=false starts no MPS",
                "set launcher.mps=true, or launcher.mps_server_priority=normal",
            )
        return
    if not la.colocate:
        yield ConfigIssue(
            "launcher.mps",
            True,
            "MPS lets processes that share a GPU run their kernels at once; without launcher.colocate "
            "the servers and the trainers have devices of their own",
            "set launcher.colocate=true, or launcher.mps=false",
        )
    if cfg.cluster.device == "cpu":
        yield ConfigIssue("launcher.mps", True, "MPS is CUDA's; this run is on CPU", "set launcher.mps=false")
    if la.backend != "local":
        yield ConfigIssue(
            "launcher.mps",
            True,
            f"launcher.backend={la.backend} does not start MPS daemons on its nodes",
            "use launcher.backend=local, or start nvidia-cuda-mps-control -d on each Ray node yourself "
            "(its processes then attach by default) and set launcher.mps=false",
        )


def _memory_hand_off(cfg):
    """Releasing server memory stops generation: only a synchronous colocated run can afford it."""
    s, a, r = cfg.sglang, cfg.actor, cfg.rollout
    time_shared = cfg.launcher.colocate and bool(s.enable_memory_saver)
    if time_shared and r.max_head_offpolicyness > 0:
        yield ConfigIssue(
            "sglang.enable_memory_saver",
            True,
            "a colocated run with it releases the servers' "
            "memory while the trainer trains, but an asynchronous run "
            f"(rollout.max_head_offpolicyness={r.max_head_offpolicyness}) generates meanwhile",
            "set rollout.max_head_offpolicyness=0 (rollout=sync), or "
            "sglang.enable_memory_saver=false to split the memory statically",
        )
    if a.offload and not time_shared:
        yield ConfigIssue(
            "actor.offload",
            True,
            "the trainer offloads while the servers generate only in a "
            "time-shared run (launcher.colocate with sglang.enable_memory_saver)",
            "set launcher.colocate=true and rollout.max_head_offpolicyness=0, or actor.offload=false",
        )
    if cfg.launcher.colocate and not time_shared and s.mem_fraction_static > MAX_STATIC_SHARE:
        yield ConfigIssue(
            "sglang.mem_fraction_static",
            s.mem_fraction_static,
            "in a colocated run both "
            f"processes stay resident: the servers' share leaves the trainer less than "
            f"{1 - MAX_STATIC_SHARE:.0%} of each device",
            f"lower it to at most {MAX_STATIC_SHARE} (0.3-0.5 suits small models), or time-share "
            "the device: rollout.max_head_offpolicyness=0 with sglang.enable_memory_saver=true",
        )
    share = trainer_memory_share(cfg)
    if a.max_tokens_per_mb == "auto" and share is not None and share < MIN_AUTO_SHARE:
        yield ConfigIssue(
            "actor.mb_server_margin",
            a.mb_server_margin,
            f"with actor.max_tokens_per_mb=auto beside colocated servers the trainer counts on 1 - "
            f"sglang.mem_fraction_static ({s.mem_fraction_static}) - this = {share:.2f} of each device",
            f"leave it at least {MIN_AUTO_SHARE}: lower sglang.mem_fraction_static or this margin, or set "
            "actor.max_tokens_per_mb to a number of tokens",
        )


def _agent_workflow(cfg):
    run = cfg.workflow.agent.run
    if cfg.workflow.type == "agent" and not run:
        yield ConfigIssue(
            "workflow.agent.run",
            run,
            "required by workflow.type=agent",
            "set workflow.agent.run to your agent, 'package.module:function' of "
            "`async def run(client, data)` (e.g. examples.calculator_agent:run)",
        )
    elif cfg.workflow.type == "agent" and ":" not in run:
        yield ConfigIssue("workflow.agent.run", run, "not an import path", "write it as 'package.module:function'")
    if cfg.workflow.type == "agent" and cfg.workflow.workers:
        yield ConfigIssue(
            "workflow.workers",
            cfg.workflow.workers,
            "has no effect with workflow.type=agent, whose episodes run in workflow.agent.workers processes",
            "set workflow.agent.workers instead, and workflow.workers=0",
        )


MAX_STATIC_SHARE = 0.9
MIN_AUTO_SHARE = 0.1  # of each device, for the trainer's auto micro-batch budget beside servers

RULES = [
    _backend_strings,
    _c_clip,
    _decoupled_needs_recompute,
    _prox_logp_method,
    _group_norm_needs_samples,
    _batch_divisible,
    _pause_ahead,
    _shared_prompts,
    _node_counts,
    _devices_fit,
    _sglang_tp_matches,
    _context_fits,
    _model_paths,
    _trainer_only_source,
    _datasets,
    _lora_push,
    _stop_strings_need_tokenizer,
    _restart_needs_full_disk_updates,
    _colocation,
    _mps,
    _memory_hand_off,
    _agent_workflow,
    _profiled_steps,
]
RULES += [_clip_bounds, _rollout_correction, _dynamic_sampling]  # algorithm knobs


def check_rules(cfg: ExperimentConfig) -> list[ConfigIssue]:
    return [issue for rule in RULES for issue in rule(cfg)]
