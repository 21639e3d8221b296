"""Pause modes: what a server does with requests in flight while the trainer's weights land.

SGLang's three modes (`/pause_generation {"mode": ...}`, scheduler.pause_generation in 0.5.16):

    abort     the running and queued requests end with finish_reason abort; the client resubmits
              prompt + tokens so far once generation continues.
    retract   they go back to the waiting queue without their KV cache and are prefilled again
              after the update, under the new weights.
    in_place  they keep running state and KV cache; tokens after the update attend to keys and
              values computed by the old weights.

What each mode asks of the prefix cache. SGLang flushes its cache only when no request waits or
runs (Scheduler.flush_cache checks is_fully_idle), and a weight update asked to flush asserts on
the refusal, which kills the scheduler (`weight_updater.flush_cache_after_weight_update`). So a
weight update never asks for the flush itself; instead:

    abort     nothing is held once the pause returns (the tokenizer manager aborts until no
              request holds the model lock), so the client flushes through /flush_cache after the
              update and before continue: the resubmitted remainders are prefilled afresh. This is
              the order slime (abort until idle, then update) and AReaL (pause, update, continue)
              use. The tokenizer manager checks the lock once a second, so the client first aborts
              through /abort_request and waits for its own requests' answers (ServerControl.drain),
              then, for a weight update, asks for retract, which finds nothing to hold, and aborts
              once more (ServerControl._server_pause_mode says why).
    retract   retracted requests free their own KV without inserting it into the radix tree
              (`release_kv_cache(is_insert=False)`), but their prompts were inserted at prefill;
              re-prefilled after the update they would match those old-weight entries. The
              per-version namespace of in_place does not help: a request keeps the extra_key it was
              sent with (Req.extra_key; reset_for_retract leaves it), so its re-prefill looks in
              the old version's namespace, and no flush can empty it while requests are held.
              SGLang servers in retract mode therefore run with --disable-radix-cache.
    in_place  held requests keep their old KV by definition; requests sent after the update must
              not reuse it, so every /generate names its weight version in `extra_key`, which
              SGLang's radix cache uses as a namespace (RadixKey.extra_key): a new version starts
              an empty namespace, the old one ages out.

The built-in server has no prefix cache; it answers as SGLang does (a flush, or an update asking
for one, while requests are held is refused), so CPU tests see the same contract.

`auto` picks per server program the mode measured to learn best among those that work on it
(docs/benchmarks.md, sections 5 and 9). This module is torch-free: the launcher resolves the mode once
in its plan and writes it to the run's config.yaml.
"""

from __future__ import annotations

PAUSE_MODES = ("abort", "retract", "in_place")

# rollout.pause_mode=auto, per server program, the mode with the highest mean of the last 3
# evaluations over 3 seeds of the one-GPU recipe (the rule of issue 37): retract on the built-in
# server (docs/benchmarks.md section 5), abort on SGLang 0.5.16. There, abort and retract tie:
# 0.791 and 0.774 on 2026-12-05 (section 9), 0.782 and 0.795 in one call on 2026-12-07 with
# retract streamed (section 10), two-day means 0.787 and 0.785, seed-to-seed sd 0.025-0.031.
# abort wins the tie: it is 4-9% faster on the recipe and holds nothing over an update. in_place is
# the fastest in the 0.5B pipeline (214-218 samples/s whole, 198-209 streamed every 16 tokens,
# against abort's 176.62; abort's pause drains ~470 aborted answers, 0.36 s), but on the recipe
# it scored 0.733 in that call (one seed of three stalled at 0.63).
AUTO_PAUSE_MODE = {"builtin": "retract", "sglang": "abort"}

# rollout.stream_interval=auto: tokens per streamed chunk where a pause holds requests through an
# update on a server that reports one weight version per answer (SGLang). 16 cost 4-9% of the 0.5B
# pipeline's samples/s against whole answers; 64 was no faster, a chunk a token halved it.
AUTO_STREAM_INTERVAL = 16


def resolve_pause_mode(configured: str, server_kind: str | None) -> str:
    """rollout.pause_mode with `auto` resolved for the server program (sglang or builtin).

    server_kind None (external servers of unknown program) resolves auto to abort, the mode that
    is safe on every server: it holds no request over the update."""
    if configured != "auto":
        if configured not in PAUSE_MODES:
            raise ValueError(f"rollout.pause_mode={configured!r} is not one of {('auto', *PAUSE_MODES)}")
        return configured
    return AUTO_PAUSE_MODE.get(server_kind or "", "abort")


def resolve_stream_interval(configured: int | str | None, pause_mode: str, server_kind: str | None) -> int | None:
    """rollout.stream_interval with `auto` resolved for the (resolved) pause mode and server program.

    auto streams every AUTO_STREAM_INTERVAL tokens where the pause holds requests through an update
    (retract, in_place) and the servers may be SGLang, which names one weight version per answer:
    each chunk then names the version it was sent under. Whole answers elsewhere: abort resubmits
    each answer's remainder after the update, so its tokens are labelled anyway, and the built-in
    server reports every token's version."""
    if configured != "auto":
        return configured
    return AUTO_STREAM_INTERVAL if holds_requests(pause_mode) and server_kind != "builtin" else None


def streams_from_sglang(stream_interval: int | str | None, pause_mode: str) -> bool:
    """Whether SGLang servers would be asked for streamed answers under these rollout settings (the
    config resolves sglang.incremental_streaming_output from it: the flag only acts on streams)."""
    return resolve_stream_interval(stream_interval, resolve_pause_mode(pause_mode, "sglang"), "sglang") is not None


def holds_requests(mode: str) -> bool:
    """Whether a pause in this mode keeps the requests in flight inside the servers through the
    update (retract, in_place); abort answers them and the client resubmits what is left."""
    return mode != "abort"


def flushes_after_update(mode: str) -> bool:
    """Whether the client flushes the servers' prefix cache after a weight update (only when the
    pause held nothing: abort)."""
    return not holds_requests(mode)


def server_flags_for(mode: str, server_kind: str) -> list[str]:
    """Server flags a pause mode needs: SGLang in retract mode runs without its radix cache (see
    the module docstring)."""
    return ["--disable-radix-cache"] if (server_kind == "sglang" and mode == "retract") else []


def cache_namespace(version: int) -> str:
    """The /generate extra_key of requests sent at weight version `version`."""
    return f"weights-v{int(version)}"
