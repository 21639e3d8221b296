"""A GRPO rollout's waves against one inference server per setting: which server settings make
generation fast for RL (issue 39, "choose the SGLang settings for RL and measure each one").

Each variant starts its own server with the command the launcher builds (`server_command`, so a
setting that the launcher would refuse is refused here too), sends one warm-up wave, then
`--waves` timed waves of GROUPS prompts x GROUP_SIZE answers (the answers of a group share their
prompt, as GRPO's do; the server's prefix cache sees that), at most `--concurrency` requests open at
once (the recipe's rollout.max_concurrent_rollouts). Requests are the rollout client's
(`generate_payload`: logprobs returned, a sampling seed each as the rollout executor gives them,
sampling at `--temperature`), with ignore_eos so that every variant decodes the same number of tokens
(`--min-new-tokens` gives the answers lengths drawn between it and `--new-tokens`, the same in
every variant).

    # SGLang (GPU, the device kit), the SmolLM2 recipe's shape and settings, one variant per flag:
    python scripts/bench_sglang_settings.py --server sglang --model-path smollm2:135m-instruct \
        --set attention_backend=triton mem_fraction_static=0.3 max_running_requests=256 \
        --variant base --variant "no_tokenizer skip_tokenizer_init=true" \
        --variant "torch_sampler sampling_backend=pytorch" --variant "lpm --schedule-policy lpm" \
        --out settings.json
    # CPU, the built-in server and a tiny model (what the test runs)
    .venv/bin/python scripts/bench_sglang_settings.py --server builtin --groups 4 --group-size 2 \
        --new-tokens 8 --variant base --variant "running2 max_running_requests=2" --out /tmp/s.json

A variant is "NAME WORD...": `key=value` sets that field of the `sglang` config section, `--flag
[value]` is passed to the server as it is (SGLang flags the project has no field for), and
`logprobs=false` leaves return_logprob out of the requests (what the logprobs cost; the trainer
needs them), `seeds=false` their sampling seeds (SGLang then samples from its own generator),
`concurrency=N` another number of open requests (with max_running_requests=N: a wave's requests
admitted together instead of one as each answer ends).
`--set` applies to every variant. Each variant reports the waves' wall seconds and generated
tokens/s; `x first` compares the median with the first variant's. With `log_level=info` SGLang logs
its decode rate every 40 steps; the report keeps those windows' rates at a full batch (at least 90%
of the open requests running), their median and the decode step's milliseconds it implies (no
HTTP round trips or wave tails in it, but a window's time includes the prefill passes between its
steps: windows right after a batch was admitted at once run several times faster than windows
while requests are admitted one by one), and the count of prefill passes. The report is written
after every variant, so a run cut short keeps the variants it finished. Compare variants of one
call only: machines differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Where to write the JSON result.")
    p.add_argument("--server", choices=("builtin", "sglang"), default="builtin")
    p.add_argument("--model-path", default=None, help="Model (a folder or a project name); default: a tiny model.")
    p.add_argument("--groups", type=int, default=64, help="Prompts a wave (train_dataset.batch_size).")
    p.add_argument("--group-size", type=int, default=8, help="Answers a prompt (gconfig.n_samples).")
    p.add_argument("--prompt-len", type=int, default=120)
    p.add_argument("--new-tokens", type=int, default=192, help="The longest answer's tokens.")
    p.add_argument(
        "--min-new-tokens",
        type=int,
        default=None,
        help="Answers of a random length from this to --new-tokens (the same lengths in every variant), "
        "so that they end at different steps and new requests join a running batch, as a rollout's do; "
        "default: all of --new-tokens.",
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--concurrency", type=int, default=256, help="Requests open at once.")
    p.add_argument("--waves", type=int, default=3, help="Timed waves a variant.")
    p.add_argument("--set", nargs="*", default=[], help="key=value settings of every variant.")
    p.add_argument("--variant", action="append", default=[], help='"NAME WORD...", in order; default: "base".')
    p.add_argument("--start-timeout", type=float, default=900.0, help="Seconds a server may take to answer /health.")
    p.add_argument("--log-dir", default=None, help="Where the servers' logs go; default: a new temporary folder.")
    return p.parse_args(argv)


def parse_variant(spec: str, common: list[str]) -> dict:
    """{"name", "fields", "flags", "logprobs", "seeds", "concurrency"} of one --variant (after --set's
    words; concurrency None: --concurrency)."""
    words = shlex.split(spec)
    if not words:
        raise SystemExit("--variant: empty; give a name, then key=value or --flag words")
    name, fields, flags, request = words[0], {}, [], {"logprobs": True, "seeds": True, "concurrency": None}
    for word in [*common, *words[1:]]:
        if word.startswith("--"):
            flags.append(word)
        elif flags and flags[-1].startswith("--") and "=" not in word:
            flags.append(word)  # the value of the flag before
        elif word.startswith("concurrency="):
            request["concurrency"] = _positive_int(word.split("=", 1)[1], f"--variant {spec!r}: concurrency")
        elif word.split("=", 1)[0] in request:
            key, value = word.split("=", 1)
            request[key] = value.lower() not in ("false", "0", "no")
        elif "=" in word:
            key, value = word.split("=", 1)
            fields[key] = value
        else:
            raise SystemExit(f"--variant {spec!r}: {word!r} is neither key=value nor a --flag")
    return {"name": name, "fields": fields, "flags": flags, **request}


def _positive_int(text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"{what}={text!r}: give a whole number of requests, 1 or more")
    return int(text)


def server_config(model_path: str, fields: dict):
    """The `sglang` section of a variant, validated as the launcher validates it."""
    from pydantic import ValidationError

    from areal.config.sglang import SGLangConfig

    try:
        return SGLangConfig(model_path=model_path, **fields)
    except ValidationError as e:
        raise SystemExit(f"--set/--variant: sglang settings {fields} are invalid:\n{e}") from None


def start(kind: str, cfg, flags: list[str], log_dir: Path, timeout_s: float, facts):
    """The server of one variant, started with the launcher's command line (`facts`: HostFacts)."""
    from areal.infra.ports import free_port
    from areal.infra.server_process import start_server_process, wait_until_serving
    from areal.infra.servers import server_command

    port = free_port()
    command = server_command(
        cfg,
        port=port,
        kind=kind,
        python=sys.executable,
        sglang_version=facts.sglang_version,
        sglang_flags=facts.sglang_flags,
        extra_flags=flags,
    )
    log = log_dir / f"{kind}-{port}.log"
    server = start_server_process(command, addr=f"127.0.0.1:{port}", log_path=log, name=f"{kind} server")
    try:
        wait_until_serving([server], timeout_s, timeout_key="--start-timeout", kind="bench")
    except BaseException:
        server.stop()
        raise
    return server, command


def wave_bodies(args, vocab: int, seed: int, new_tokens: int, variant: dict) -> list[dict]:
    """The rollout client's /generate bodies for GROUPS x GROUP_SIZE answers, grouped by prompt."""
    from areal.api.inference import ModelRequest
    from areal.engine.sglang.protocol import generate_payload
    from areal.rollout.seeds import mix

    rng = random.Random(seed)
    shortest = min(new_tokens, args.min_new_tokens or new_tokens)
    bodies = []
    for g in range(args.groups):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        req = ModelRequest(input_ids=prompt, temperature=args.temperature, ignore_eos=True)
        for k in range(args.group_size):
            answer = req.copy(sampling_seed=mix(seed, g, k) if variant["seeds"] else None)
            length = rng.randint(shortest, new_tokens)
            body = generate_payload(
                answer, rid=f"w{seed}-g{g}-{k}", input_ids=prompt, max_new_tokens=length, min_new_tokens=0
            )
            if not variant["logprobs"]:
                body.pop("return_logprob")
            bodies.append(body)
    return bodies


async def run_wave(url: str, bodies: list[dict], concurrency: int, timeout_s: float) -> dict:
    """All bodies, at most `concurrency` open; wall seconds until the last answer."""
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(body):
            async with gate, session.post(url + "/generate", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"/generate answered {r.status}: {(await r.text())[:300]}")
                return len((await r.json())["output_ids"])

        begin = time.perf_counter()
        counts = await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - begin
    return {"wall_s": round(wall, 3), "tokens": sum(counts), "tokens_per_s": round(sum(counts) / wall, 1)}


def measure(args, variant: dict, model_path: str, vocab: int, log_dir: Path, facts) -> dict:
    cfg = server_config(model_path, variant["fields"])
    concurrency = variant["concurrency"] or args.concurrency
    begin = time.perf_counter()
    server, command = start(args.server, cfg, variant["flags"], log_dir, args.start_timeout, facts)
    started = time.perf_counter() - begin
    try:
        wave_timeout = max(600.0, args.start_timeout)
        warm = wave_bodies(args, vocab, 0, min(16, args.new_tokens), variant)
        asyncio.run(run_wave(server.url, warm, concurrency, wave_timeout))
        waves = [
            asyncio.run(
                run_wave(
                    server.url,
                    wave_bodies(args, vocab, i + 1, args.new_tokens, variant),
                    concurrency,
                    wave_timeout,
                )
            )
            for i in range(args.waves)
        ]
    finally:
        server.stop()
    rates = [w["tokens_per_s"] for w in waves]
    log = Path(server.log_path).read_text(errors="replace")
    decode = full_batch_decode_rate(log, min(concurrency, int(cfg.max_running_requests or concurrency)))
    return {
        **variant,
        "command": command,
        "start_s": round(started, 1),
        "waves": waves,
        "median_tokens_per_s": statistics.median(rates),
        "median_wall_s": statistics.median(w["wall_s"] for w in waves),
        **decode,
        "prefill_passes": len(PREFILL_LINE.findall(log)),  # warm-up wave included
        "log": server.log_path,
    }


PREFILL_LINE = re.compile(r"Prefill batch")  # one a prefill forward pass (log_level=info)
DECODE_LINE = re.compile(r"Decode batch.*?#running-req:\s*(\d+),.*?gen throughput \(token/s\):\s*([0-9.]+)")


def full_batch_decode_rate(log: str, concurrency: int) -> dict:
    """SGLang's logged decode rate over batches of at least 90% of `concurrency` running: the
    median tokens/s and the decode step's ms it implies (None without such lines)."""
    full = [(int(n), float(r)) for n, r in DECODE_LINE.findall(log) if int(n) >= 0.9 * concurrency and float(r) > 0]
    if not full:
        return {"decode_tokens_per_s": None, "decode_step_ms": None, "decode_lines": 0, "decode_window_rates": []}
    rate = statistics.median(r for _, r in full)
    running = statistics.median(n for n, _ in full)
    return {
        "decode_tokens_per_s": rate,
        "decode_step_ms": round(1000 * running / rate, 3),
        "decode_lines": len(full),
        "decode_window_rates": [round(r) for _, r in full],  # each over 40 steps, prefills between included
    }


def model_and_vocab(args) -> tuple[str, int]:
    from transformers import AutoConfig

    from areal.models.resolve import resolve_model_path
    from areal.models.tiny import make_tiny_model_dir

    if args.model_path:
        path = resolve_model_path(args.model_path)
        name = args.model_path  # SGLang reaches a project name through areal.models.serve
    else:
        positions = args.prompt_len + args.new_tokens + 8
        # one folder per context length: an existing folder is reused as it is (make_tiny_model_dir)
        folder = Path(tempfile.gettempdir()) / f"bench-settings-tiny-p{positions}"
        path = name = str(make_tiny_model_dir(folder, max_position=positions))
    return name, AutoConfig.from_pretrained(path).vocab_size


def _exit_on_sigterm() -> None:
    """A `timeout` around this script sends SIGTERM: leave through the `finally` that stops the
    variant's server (its own process group), not past it with the server still holding the GPU."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv=None) -> dict:
    args = parse_args(argv)
    _exit_on_sigterm()
    variants = [parse_variant(v, args.set) for v in args.variant or ["base"]]
    if len({v["name"] for v in variants}) != len(variants):
        raise SystemExit("--variant: names must differ")
    model_path, vocab = model_and_vocab(args)
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="bench-settings-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "server": args.server,
        "model_path": model_path,
        "shape": {
            "groups": args.groups,
            "group_size": args.group_size,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "min_new_tokens": args.min_new_tokens,
            "temperature": args.temperature,
            "concurrency": args.concurrency,
        },
        "variants": [],
    }
    from areal.infra.host import detect_host_facts

    facts = detect_host_facts()  # the installed SGLang and its flags, read once for every variant
    for variant in variants:
        r = measure(args, variant, model_path, vocab, log_dir, facts)
        r["x_first"] = round(r["median_tokens_per_s"] / (report["variants"] or [r])[0]["median_tokens_per_s"], 3)
        report["variants"].append(r)
        Path(args.out).write_text(json.dumps(report, indent=2))
        walls = [w["wall_s"] for w in r["waves"]]
        print(
            f"{r['name']:>16}: {r['median_tokens_per_s']:>10.1f} tok/s  x{r['x_first']:.3f}  "
            f"wave {r['median_wall_s']:.3f} s  decode step {r['decode_step_ms']} ms  prefill passes "
            f"{r['prefill_passes']}  (waves {walls}, start {r['start_s']} s)",
            flush=True,
        )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
