"""Client CPU per answer for streamed /generate (rollout.stream_interval) against a whole answer.

The rollout client shares the trainer's process, so what it spends reading an answer is taken from
the training thread's GIL. A streamed answer arrives as server-sent events; by default SGLang puts
the whole output so far in each chunk (every token id and logprob again), with
--incremental-streaming-output (sglang.incremental_streaming_output) only the chunk's new ones. This
builds the bytes SGLang 0.5.16 sends for one answer in each form and times the client's path over
them (areal.engine.sglang.http.read_events, protocol.parse_generate_stream), against one whole
answer (json.loads, protocol.parse_generate). No server: it measures the client's parsing only.

    python scripts/bench_stream_parse.py --tokens 192 --intervals 1 4 16 --out /tmp/stream_parse.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=192, help="answer length (x1_sglang_perf: 192 new tokens)")
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--repeats", type=int, default=200, help="answers timed per form")
    p.add_argument("--piece-bytes", type=int, default=16384, help="bytes per read from the socket")
    return p.parse_args(argv)


def _meta(ids: list[int], total: int, finished: bool, version: int, first: int = 0) -> dict:
    return {
        "id": "r",
        "finish_reason": {"type": "length", "length": total} if finished else None,
        "prompt_tokens": 128,
        "weight_version": str(version),
        "completion_tokens": total,
        "cached_tokens": 0,
        "output_token_logprobs": [[-0.123456789 - i * 1e-6, t, None] for i, t in enumerate(ids, first)],
        "e2e_latency": 1.0,
    }


def sse_body(n_tokens: int, interval: int | None, incremental: bool) -> bytes:
    """The bytes of one answer: a whole JSON body (interval None), or SSE chunks every `interval`
    tokens and at the end, each the output so far or (incremental) only its new tokens."""
    ids = [1000 + (i * 7919) % 150000 for i in range(n_tokens)]
    if interval is None:
        return json.dumps({"text": "", "output_ids": ids, "meta_info": _meta(ids, n_tokens, True, 0)}).encode()
    ends = list(range(interval, n_tokens, interval)) + [n_tokens]
    events, start = [], 0
    for end in ends:
        first = start if incremental else 0
        part = ids[first:end]
        chunk = {"text": "", "output_ids": part, "meta_info": _meta(part, end, end == n_tokens, 0, first)}
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        start = end
    return b"".join(events) + b"data: [DONE]\n\n"


class _Content:
    """What aiohttp's response.content gives read_events: the body in pieces."""

    def __init__(self, body: bytes, piece: int):
        self._pieces = [body[i : i + piece] for i in range(0, len(body), piece)]

    async def iter_any(self):
        for p in self._pieces:
            yield p


def time_form(body: bytes, streamed: bool, repeats: int, piece: int) -> tuple[float, int]:
    """Seconds of CPU per answer for the client's parse of `body`, and the tokens it parsed to."""
    from areal.engine.sglang.http import read_events
    from areal.engine.sglang.protocol import parse_generate, parse_generate_stream

    async def once():
        if streamed:
            return parse_generate_stream(await read_events(_Content(body, piece)))
        return parse_generate(json.loads(body))

    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(once())  # warm-up, and the check that the form parses
        t0 = time.process_time()
        for _ in range(repeats):
            loop.run_until_complete(once())
        return (time.process_time() - t0) / repeats, len(result.output_ids)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())  # read_events leaves at [DONE]
        loop.close()


def main(argv=None):
    args = parse_args(argv)
    rows = []
    forms = [("whole", None, False)]
    forms += [(f"stream{k}", k, False) for k in args.intervals]
    forms += [(f"stream{k}_incr", k, True) for k in args.intervals]
    for name, interval, incremental in forms:
        body = sse_body(args.tokens, interval, incremental)
        seconds, n = time_form(body, interval is not None, args.repeats, args.piece_bytes)
        assert n == args.tokens, (name, n)
        rows.append({"form": name, "bytes": len(body), "cpu_ms_per_answer": round(seconds * 1e3, 4)})
    base = rows[0]["cpu_ms_per_answer"]
    for r in rows:
        r["x_whole"] = round(r["cpu_ms_per_answer"] / base, 2)
        print(f"{r['form']:>14}  {r['bytes']:>9} bytes  {r['cpu_ms_per_answer']:8.3f} ms  {r['x_whole']:6.2f}x whole")
    report = {"tokens": args.tokens, "repeats": args.repeats, "piece_bytes": args.piece_bytes, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
