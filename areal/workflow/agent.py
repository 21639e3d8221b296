"""Agents written against the OpenAI API, trained as they are.

    async def run(client, data) -> float:           # workflow.agent.run: my_pkg.agents:run
        reply = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
        ...
        return reward

`client` is an `openai.AsyncOpenAI` pointed at the rollout proxy (areal/rollout/openai_proxy.py),
which generates through the rollout engine and records each call in tokens; `data` is the dataset
record. The episode's reward is what `run` returns: a number, or a dict with "reward" and other
numbers (the same names every episode), logged per step as rollout/agent/<name> beside the
workflow's own figures: calls, tool_calls, tool_call_rate (episodes with at least one parsed tool
call), malformed_tool_calls and untrained_calls.

An episode runs `run` gconfig.n_samples times concurrently (the GRPO group) and becomes training
rows, by workflow.agent.samples:

- conversation: one row per run. The calls form chains (a call whose prompt extends an earlier
  call's prompt + output exactly is its child; the proxy builds follow-up prompts so that this
  holds for an agent that resends the conversation); the row is the longest chain, the last
  call's prompt + output, with loss_mask 1 on every chain call's output and 0 on prompts, tool
  results and user turns. Calls off that chain (an agent that rewrote its history) are not
  trained: untrained_calls counts them.
- call: one row per call, the call's prompt + output. Every run gets exactly max_calls rows
  (unused ones are one padding token with no loss) and rows go call by call across the group:
  row j * n + i is call j of run i. So each n consecutive rows are one GRPO group of the n runs'
  rewards, as the trainer's group normalisation expects, and every call of a run gets its run's
  advantage.

Rows carry input_ids, attention_mask, loss_mask, logprobs, versions (per-token weight versions,
-1 where nothing was generated) and rewards, as the other workflows' rows do.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import math
from collections.abc import Mapping
from typing import Any

from areal.api.inference import InferenceEngine
from areal.api.workflow import RolloutWorkflow
from areal.workflow.common import load_tokenizer, stack_samples, trajectory

STAT_PREFIX = "stat/agent/"  # per-row figures the trainer logs as rollout/agent/<name>
SAMPLE_MODES = ("conversation", "call")
SOCKETS_PER_CALL = 3  # the agent's connection, the proxy's end of it, the request to a server
KEEPALIVE_S = 600.0  # an idle connection of the agents' pool is kept this long (between turns, steps)
POOL_SHARD = 64  # connections per openai client: larger pools scale badly (openai_clients)

logger = logging.getLogger(__name__)


class AgentWorkflow(RolloutWorkflow):
    def __init__(
        self,
        run,
        gconfig,
        tokenizer,
        *,
        samples: str = "conversation",
        max_calls: int = 8,
        chat_template: str | None = None,
        context_length: int | None = None,
        request_timeout_s: float = 3600.0,
        concurrency: int = 128,
        workers: int = 1,
    ):
        """`run`: the agent function or its import path; `gconfig`: the run's GenerationConfig;
        `tokenizer`: the policy's tokenizer or its path; `chat_template`: a built-in name or a
        Jinja file replacing the tokenizer's template (see workflow.agent.chat_template);
        `concurrency`: agent runs in flight at once (episodes x n_samples), which sizes the proxy's
        listen queue and the client's connection pool; `workers`: processes that run the episodes
        (workflow.agent.workers), 0 runs them on the caller's event loop."""
        if samples not in SAMPLE_MODES:
            raise ValueError(f"workflow.agent.samples={samples!r} is not one of {SAMPLE_MODES}")
        if workers < 0:
            raise ValueError(f"workflow.agent.workers={workers} must be 0 (in this process) or more")
        self.run = resolve_agent(run) if isinstance(run, str) else run
        self.gconfig = gconfig
        self.tokenizer = load_tokenizer(tokenizer)
        self.samples, self.max_calls = samples, max_calls
        self.chat_template = None
        if chat_template is not None:
            from areal.chat.template import resolve_chat_template

            self.chat_template = resolve_chat_template(chat_template)
        self.context_length, self.request_timeout_s = context_length, request_timeout_s
        self.concurrency, self.workers = concurrency, workers
        # what a worker process builds its own copy from (names and paths, not live objects)
        self._recipe = functools.partial(
            AgentWorkflow,
            run,
            gconfig,
            tokenizer,
            samples=samples,
            max_calls=max_calls,
            chat_template=chat_template,
            context_length=context_length,
            request_timeout_s=request_timeout_s,
            concurrency=concurrency,
            workers=0,
        )
        self._proxy = self._clients = self._started = None
        self._turn = itertools.count()  # which client (pool shard) the next run uses
        self._in_workers = self._worker_processes() if workers else None
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.tokenizer.eos_token_id or 0)

    @classmethod
    def from_config(cls, cfg, tokenizer, **kwargs) -> "AgentWorkflow":
        a = cfg.workflow.agent
        if not a.run:
            raise ValueError(
                "workflow.type=agent needs workflow.agent.run, the import path of `async def run(client, data)`"
            )
        return cls(
            a.run,
            cfg.gconfig,
            tokenizer,
            samples=a.samples,
            max_calls=a.max_calls,
            chat_template=a.chat_template,
            context_length=cfg.sglang.context_length,
            request_timeout_s=cfg.rollout.request_timeout_s,
            concurrency=agent_concurrency(cfg),
            workers=a.workers,
            **kwargs,
        )

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any]:
        if self._in_workers is not None:
            return await self._in_workers.arun_episode(engine, data)
        proxy, clients = await self._proxy_for(engine)
        runs = await asyncio.gather(
            *(
                self._run_once(proxy, clients[next(self._turn) % len(clients)], data)
                for _ in range(self.gconfig.n_samples)
            )
        )
        _check_same_figures([figures for _, _, figures in runs], self.run)
        if self.samples == "conversation":
            built = [conversation_row(calls, self.pad_id) for calls, _, _ in runs]
            rows, order = [row for row, _ in built], list(range(len(runs)))
            untrained = [len(calls) - trained for (calls, _, _), (_, trained) in zip(runs, built)]
        else:
            per_run = [call_rows(calls, self.max_calls, self.pad_id) for calls, _, _ in runs]
            rows = [per_run[i][j] for j in range(self.max_calls) for i in range(len(runs))]
            order = [i for _ in range(self.max_calls) for i in range(len(runs))]
            untrained = [0] * len(runs)
        out = stack_samples(rows, [runs[i][1] for i in order])
        figures = [
            {**episode_figures(calls), "untrained_calls": float(u), **user}
            for (calls, _, user), u in zip(runs, untrained)
        ]
        return {**out, **stat_tensors([figures[i] for i in order])}

    async def _run_once(self, proxy, client, data: dict) -> tuple[list, float, dict]:
        episode = proxy.open_episode()
        try:
            value = await self.run(client.with_options(api_key=episode.key), dict(data))
        finally:
            calls = proxy.close_episode(episode)
        reward, figures = episode_result(value, self.run)
        return calls, reward, figures

    async def _proxy_for(self, engine):
        """The proxy and client of the running event loop (the executor's), started once."""
        loop = asyncio.get_running_loop()
        if self._proxy is None or self._proxy.loop not in (None, loop) or self._proxy.engine is not engine:
            from areal.rollout.openai_proxy import OpenAIProxy

            self._proxy = OpenAIProxy(
                engine,
                self.tokenizer,
                self.gconfig,
                chat_template=self.chat_template,
                context_length=self.context_length,
                max_calls=self.max_calls,
                concurrency=self.concurrency,
            )
            self._started = loop.create_task(self._proxy.start())
            self._clients = None
        await asyncio.shield(self._started)
        if self._clients is None:
            self._clients = openai_clients(self._proxy.base_url, self.request_timeout_s, self.concurrency)
        return self._proxy, self._clients

    def _worker_processes(self):
        """The processes that run this workflow's episodes (workflow.agent.workers), each building it
        from the recipe."""
        from areal.infra.sockets import open_files_needed
        from areal.workflow.in_workers import WorkflowInWorkers

        return WorkflowInWorkers(
            self._recipe,
            self.workers,
            key="workflow.agent.workers",
            name="agent-worker",
            open_files=open_files_needed(SOCKETS_PER_CALL * self.concurrency),
            open_files_keys="rollout.max_concurrent_rollouts x gconfig.n_samples",
            unpicklable_hint=f"make the agent {getattr(self.run, '__qualname__', self.run)!r} a module-level "
            "async function (or pass its import path)",
        )

    @property
    def pool(self):
        """The worker processes (an EpisodeWorkers) once the first episode started them, else None."""
        return None if self._in_workers is None else self._in_workers.pool

    async def aclose(self) -> None:
        """Close the clients and the proxy of this process (on the loop they run on)."""
        proxy, clients = self._proxy, self._clients
        self._proxy = self._clients = None
        for client in clients or ():
            await client.close()
        if proxy is not None:
            await proxy.stop()

    def close(self) -> None:
        """Stop the worker processes (each closes its proxy and client), or this process's proxy and
        client if their event loop still runs: call it before the executor stops."""
        if self._in_workers is not None:
            self._in_workers.close()
        loop = getattr(self._proxy, "loop", None)
        if loop is None or loop.is_closed() or not loop.is_running():
            if self._proxy is not None:
                logger.warning("the agents' OpenAI proxy could not be closed: its event loop has stopped")
            self._proxy = self._clients = None
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(self.aclose())
        else:
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=30)


def agent_concurrency(cfg) -> int:
    """Agent runs in flight at once: episodes the executor runs together, n_samples runs each."""
    r = cfg.rollout
    return (r.max_concurrent_rollouts or r.consumer_batch_size or 1) * cfg.gconfig.n_samples


def openai_clients(base_url: str, timeout_s: float, concurrency: int) -> list:
    """Clients for `concurrency` runs at once, each pooling at most POOL_SHARD connections.

    One pool of thousands does not scale: httpcore 1.x (openai < 3) scans every connection of its
    pool for each idle one on every request and release, quadratic in the pool, and httpcore2
    (openai 3) slowed too: a second batch of 2,048 runs against an instant server took 37 s and
    100 s with one pool (CPU, 2026-12-03). Runs are dealt round the shards; each run keeps its."""
    sizes = [POOL_SHARD] * (concurrency // POOL_SHARD) + (
        [concurrency % POOL_SHARD] if concurrency % POOL_SHARD else []
    )
    return [openai_client(base_url, timeout_s, size) for size in sizes or [1]]


def openai_client(base_url: str, timeout_s: float, concurrency: int = 128):
    """An AsyncOpenAI for the proxy: no retries (a failed call is the agent's to see, and the
    engine already retried the servers), the rollout request timeout, and a connection pool as large
    as the runs in flight that keeps every connection between turns (openai's default keeps 100
    of 1,000: after each turn the others closed, and the next turn reconnected in a burst).
    A run past the pool waits for a connection (back-pressure) within the request timeout."""
    try:
        import openai
    except ImportError as exc:
        raise ImportError(
            "workflow.type=agent needs the openai package: pip install openai (or the project's 'agent' extra)"
        ) from exc
    for name in ("httpx", "httpx2"):  # the client logs every request at INFO: one line per call
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key="per-episode",
        max_retries=0,
        timeout=timeout_s,
        http_client=_pooled_http_client(openai, concurrency, timeout_s),
    )


def _pooled_http_client(openai, concurrency: int, timeout_s: float):
    """openai's own async HTTP client class (httpx2 from openai 3, httpx before) with the pool sized."""
    if hasattr(openai, "DefaultAsyncHttpx2Client"):
        import httpx2 as httpx_module

        cls = openai.DefaultAsyncHttpx2Client
    else:
        import httpx as httpx_module

        cls = openai.DefaultAsyncHttpxClient
    limits = httpx_module.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=KEEPALIVE_S
    )
    return cls(limits=limits, timeout=timeout_s)


def resolve_agent(spec: str):
    from areal.reward.registry import import_object

    fn = import_object(spec, kind="agent (workflow.agent.run)")
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))):
        raise TypeError(
            f"workflow.agent.run={spec!r} is {fn!r}, not an async function; write the "
            "agent as `async def run(client, data) -> float`"
        )
    return fn


def episode_result(value, run) -> tuple[float, dict[str, float]]:
    """(reward, figures) from what the agent returned: a number, or {"reward": ..., name: number}."""
    name = getattr(run, "__qualname__", repr(run))
    figures = {}
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise TypeError(
                f"agent {name} returned a dict without 'reward' (keys {sorted(value)}); "
                "put the episode's reward under 'reward'"
            )
        figures = {k: v for k, v in value.items() if k != "reward"}
        value = value["reward"]
    bad = {
        k: v
        for k, v in {"reward": value, **figures}.items()
        if not isinstance(v, (int, float)) or not math.isfinite(float(v))
    }
    if bad:
        raise TypeError(
            f"agent {name} returned {bad}: the reward and every figure must be finite "
            "numbers (return a float, or a dict of them with 'reward')"
        )
    return float(value), {k: float(v) for k, v in figures.items()}


def _check_same_figures(figures: list[dict], run) -> None:
    names = {tuple(sorted(f)) for f in figures}
    if len(names) > 1:
        raise ValueError(
            f"agent {getattr(run, '__qualname__', run)} returned different figure names "
            f"in one group: {sorted(names)}; return the same names every episode"
        )


def empty_row(pad_id: int) -> dict:
    """A row with nothing to train: one padding token (an episode without calls, or a padding
    row of per-call samples)."""
    return {"input_ids": [pad_id], "loss_mask": [0], "logprobs": [0.0], "versions": [-1]}


def conversation_row(calls: list, pad_id: int) -> tuple[dict, int]:
    """The row of the longest chain of calls and how many calls it trains (module docstring)."""
    if not calls:
        return empty_row(pad_id), 0
    chains = [_chain(calls, i) for i in range(len(calls))]
    chain = max(reversed(chains), key=len)  # the longest; among equals the latest
    last = calls[chain[-1]]
    ids = last.sequence
    loss, lps, vers = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids)
    for i in chain:
        call = calls[i]
        start, end = len(call.prompt_ids), len(call.sequence)
        assert ids[:end] == call.sequence, "a chain call's tokens must open its child's prompt"
        loss[start:end] = [1] * (end - start)
        lps[start:end], vers[start:end] = call.logprobs, call.versions
    return {"input_ids": ids, "loss_mask": loss, "logprobs": lps, "versions": vers}, len(chain)


def _chain(calls: list, last: int) -> list[int]:
    chain, i = [], last
    while i is not None:
        chain.append(i)
        i = calls[i].parent
    return chain[::-1]


def call_rows(calls: list, max_calls: int, pad_id: int) -> list[dict]:
    """One row per call (prompt, then the output with the loss), padded to max_calls rows."""
    rows = [trajectory(c.prompt_ids, [(c.output_ids, c.logprobs, c.versions, True)]) for c in calls]
    return rows[:max_calls] + [empty_row(pad_id) for _ in range(max_calls - len(rows))]


def episode_figures(calls: list) -> dict[str, float]:
    return {
        "calls": float(len(calls)),
        "tool_calls": float(sum(c.tool_calls for c in calls)),
        "tool_call_rate": float(any(c.tool_calls for c in calls)),
        "malformed_tool_calls": float(sum(c.malformed is not None for c in calls)),
    }


def stat_tensors(figures: list[dict[str, float]]) -> dict:
    """Per-row figures as [n] tensors under STAT_PREFIX (areal.rollout.batch.sample_stats logs them)."""
    import torch

    return {STAT_PREFIX + name: torch.tensor([f[name] for f in figures], dtype=torch.float32) for name in figures[0]}
