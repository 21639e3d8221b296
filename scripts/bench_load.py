"""Load test of the built-in server: many concurrent /generate clients on loopback for a while.

Run (CPU, the tiny:arith model unless --model-path is given):

    .venv/bin/python scripts/bench_load.py --out /tmp/bench_load.json                  # 1,000 for 60 s
    .venv/bin/python scripts/bench_load.py --concurrency 1000 --duration 15 \\
        --server-args "--max-queued-requests 256" --out /tmp/bench_load_small_queue.json

`--concurrency` clients each send one request at a time, back to back, until `--duration` seconds
have passed (then the requests in flight finish). A client answered with a rejection (4xx/5xx
with a JSON error message, e.g. 503 when the server's queue is full) waits `--reject-backoff`
seconds before its next request, as RemoteSGLangEngine does. Every answer is classified:

    answered_200   a generation came back
    rejected       an HTTP error status with a JSON {"error": {"message": ...}} body (by status)
    errors         anything else: connection reset or refused, client timeout, an error status
                   without a JSON message (by kind)

The server's resident memory (VmRSS from /proc/<pid>/status) is sampled every 0.25 s: at start
(after a warm-up request), its peak during the load, and at the end (after the load stops). The
JSON result (--out) holds the counts, latency percentiles (p50/p99/max, seconds) of 200s and of
rejections, throughput, and the RSS figures in MiB. The open-file limit is raised to fit the
connections (client and server each hold one socket per client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shlex
import threading
import time
from collections import Counter
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Where to write the JSON result.")
    p.add_argument("--model-path", default="tiny:arith", help="Model to serve (default: tiny:arith).")
    p.add_argument("--concurrency", type=int, default=1000, help="Concurrent clients.")
    p.add_argument("--duration", type=float, default=60.0, help="Seconds of load.")
    p.add_argument("--max-new-tokens", type=int, default=8, help="Tokens per request (ignore_eos).")
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--request-timeout", type=float, default=300.0, help="Client timeout per request.")
    p.add_argument("--reject-backoff", type=float, default=0.5, help="Wait after a rejection.")
    p.add_argument("--server-args", default="", help="Extra server flags, one string.")
    p.add_argument("--server-url", default=None, help="Load a server already running (no RSS then).")
    return p.parse_args(argv)


def raise_fd_limit(needed: int) -> int:
    """Soft RLIMIT_NOFILE up to the hard limit when `needed` descriptors do not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise SystemExit(
            f"the open-file limit ({soft}, hard {hard}) is below the {needed} this load needs; "
            "raise it (ulimit -n) or lower --concurrency"
        )
    return soft


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RssSampler:
    """Peak and latest RSS of a process, sampled on a thread."""

    def __init__(self, pid: int, every_s: float = 0.25):
        self.pid, self.every_s = pid, every_s
        self.peak = self.last = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.every_s):
            try:
                self.last = rss_mib(self.pid)
            except (OSError, RuntimeError):  # the process ended
                return
            self.peak = max(self.peak, self.last)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"p50": round(pick(0.50), 4), "p99": round(pick(0.99), 4), "max": round(v[-1], 4)}


async def load(url: str, args) -> dict:
    """Run the clients; returns the counts and latencies."""
    import aiohttp

    statuses: Counter = Counter()
    errors: Counter = Counter()
    ok_lat: list[float] = []
    reject_lat: list[float] = []
    examples: dict[str, str] = {}
    body = {
        "input_ids": [1] + [3 + i % 10 for i in range(args.prompt_len - 1)],
        "sampling_params": {"max_new_tokens": args.max_new_tokens, "ignore_eos": True, "temperature": 1.0},
    }
    deadline = time.monotonic() + args.duration
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    connector = aiohttp.TCPConnector(limit=args.concurrency)

    async def client(session):
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                async with session.post(url + "/generate", json=body) as resp:
                    raw = await resp.read()
                    latency = time.monotonic() - t0
                    if resp.status == 200:
                        statuses[200] += 1
                        ok_lat.append(latency)
                        continue
                    try:
                        message = json.loads(raw)["error"]["message"]
                    except (ValueError, KeyError, TypeError):
                        message = None
                    if isinstance(message, str) and message:
                        statuses[resp.status] += 1
                        reject_lat.append(latency)
                        examples.setdefault(str(resp.status), message)
                    else:
                        kind = f"HTTP {resp.status} without a JSON message"
                        errors[kind] += 1
                        examples.setdefault(kind, raw[:300].decode(errors="replace"))
            except asyncio.TimeoutError:
                errors["client timeout"] += 1
            except aiohttp.ClientError as e:
                kind = type(e).__name__
                errors[kind] += 1
                examples.setdefault(kind, str(e)[:300])
            await asyncio.sleep(args.reject_backoff)

    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(args.concurrency)))
    wall = time.monotonic() - t0
    sent = sum(statuses.values()) + sum(errors.values())
    return {
        "requests_sent": sent,
        "answered_200": statuses[200],
        "rejected": {str(s): n for s, n in sorted(statuses.items()) if s != 200},
        "errors": dict(errors),
        "examples": examples,
        "wall_s": round(wall, 2),
        "answered_per_s": round(statuses[200] / wall, 1),
        "latency_200_s": percentiles(ok_lat),
        "latency_rejected_s": percentiles(reject_lat),
    }


def run(args) -> dict:
    from areal.infra.server_process import start_builtin_server as start_server
    from areal.models.resolve import resolve_model_path

    fd_limit = raise_fd_limit(args.concurrency + 256)  # before the server starts: it inherits it
    server = None
    url = args.server_url
    if url is None:
        server = start_server(
            resolve_model_path(args.model_path),
            timeout=300,
            extra_args=["--log-level", "warning", *shlex.split(args.server_args)],
        )
        url = server.url
    try:
        import requests

        warm = requests.post(
            url + "/generate", json={"input_ids": [1, 3], "sampling_params": {"max_new_tokens": 2}}, timeout=60
        )
        warm.raise_for_status()
        if server is None:
            result = asyncio.run(load(url, args))
            rss = None
        else:
            start = rss_mib(server.proc.pid)
            with RssSampler(server.proc.pid) as sampler:
                result = asyncio.run(load(url, args))
            time.sleep(1.0)  # let the server settle after the last answers
            end = rss_mib(server.proc.pid)
            rss = {
                "start_mib": round(start, 1),
                "peak_mib": round(sampler.peak, 1),
                "end_mib": round(end, 1),
                "growth_peak_mib": round(sampler.peak - start, 1),
            }
        health = requests.get(url + "/health", timeout=30).status_code
        info = requests.get(url + "/get_server_info", timeout=30).json()
    finally:
        if server is not None:
            server.stop()
    return {
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "max_new_tokens": args.max_new_tokens,
        "model": args.model_path,
        "server_args": args.server_args,
        "fd_limit": fd_limit,
        **result,
        "server_rss": rss,
        "health_after": health,
        "server_capacity": info.get("load", {}).get("capacity"),
        "server_accepted_after": info.get("load", {}).get("accepted"),  # 0: no request slot leaked
        "server_batching": info.get("batching"),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("examples", "server_batching")}, indent=2))
    return result


if __name__ == "__main__":
    main()
