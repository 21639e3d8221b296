"""scripts/bench_sglang_settings.py against real built-in servers, one per variant: each variant's
settings reach its server's command line, every wave decodes the whole fixed-length budget, and
the requests are the rollout client's (grouped prompts, seeds, logprobs). No timing asserts."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_sglang_settings.py"


def load():
    return load_script("bench_sglang_settings")


def test_variants_parse_into_fields_flags_and_request_options():
    bench = load()
    v = bench.parse_variant("lpm --schedule-policy lpm max_running_requests=512 seeds=false", ["log_level=info"])
    assert v == {
        "name": "lpm",
        "fields": {"log_level": "info", "max_running_requests": "512"},
        "flags": ["--schedule-policy", "lpm"],
        "logprobs": True,
        "seeds": False,
        "concurrency": None,
    }
    assert bench.parse_variant("all512 concurrency=512", [])["concurrency"] == 512
    with pytest.raises(SystemExit, match="whole number"):
        bench.parse_variant("bad concurrency=0", [])
    with pytest.raises(SystemExit, match="neither key=value nor a --flag"):
        bench.parse_variant("bad word", [])
    with pytest.raises(SystemExit, match="max_running_requests"):
        bench.server_config("m", {"max_running_requests": "zero"})


def test_wave_bodies_group_answers_by_prompt_with_distinct_seeds():
    bench = load()
    args = Namespace(groups=3, group_size=4, prompt_len=5, temperature=0.7, min_new_tokens=None)
    variant = {"logprobs": True, "seeds": True}
    bodies = bench.wave_bodies(args, 50, 1, 8, variant)
    assert len(bodies) == 12 and len({b["rid"] for b in bodies}) == 12
    prompts = [tuple(b["input_ids"]) for b in bodies]
    assert len(set(prompts[:4])) == 1 and len(set(prompts)) == 3
    seeds = [b["sampling_params"]["sampling_seed"] for b in bodies]
    assert len(set(seeds)) == 12
    assert all(b["return_logprob"] and b["sampling_params"]["ignore_eos"] for b in bodies)
    assert {b["sampling_params"]["max_new_tokens"] for b in bodies} == {8}
    plain = bench.wave_bodies(args, 50, 1, 8, {"logprobs": False, "seeds": False})
    assert all("return_logprob" not in b and "sampling_seed" not in b["sampling_params"] for b in plain)
    args.min_new_tokens = 2
    varied = [b["sampling_params"]["max_new_tokens"] for b in bench.wave_bodies(args, 50, 1, 8, variant)]
    assert min(varied) >= 2 and max(varied) <= 8 and len(set(varied)) > 1
    other = bench.wave_bodies(args, 50, 1, 8, {"logprobs": False, "seeds": False})  # another variant's wave
    assert varied == [b["sampling_params"]["max_new_tokens"] for b in other]


def test_each_variant_runs_its_own_server_with_its_settings(tmp_path):
    bench = load()
    out = tmp_path / "settings.json"
    r = bench.main(
        [
            "--server",
            "builtin",
            "--groups",
            "3",
            "--group-size",
            "2",
            "--prompt-len",
            "12",
            "--new-tokens",
            "6",
            "--min-new-tokens",
            "2",
            "--waves",
            "2",
            "--set",
            "max_queued_requests=32",
            "--variant",
            "base",
            "--variant",
            "running2 max_running_requests=2 logprobs=false",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == r
    base, running2 = r["variants"]
    assert [w["tokens"] for w in base["waves"]] == [w["tokens"] for w in running2["waves"]]
    for v in (base, running2):
        assert all(3 * 2 * 2 <= w["tokens"] < 3 * 2 * 6 for w in v["waves"])  # lengths of 2..6, not all 6
        assert "--max-queued-requests" in v["command"]
    flag = running2["command"].index("--max-running-requests")
    assert running2["command"][flag + 1] == "2" and "--max-running-requests" not in base["command"]
    assert base["x_first"] == 1.0 and running2["x_first"] > 0
    assert base["prefill_passes"] == 0  # the built-in server logs no prefill lines


def test_a_terminated_bench_stops_its_server(tmp_path):
    """`timeout` around the bench (the GPU stage) sends SIGTERM; the variant's server, in its own
    process group, must not outlive it holding the device."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import requests

    logs = tmp_path / "logs"
    argv = [sys.executable, str(SCRIPT), "--server", "builtin", "--groups", "2", "--group-size", "2"]
    argv += ["--prompt-len", "8", "--new-tokens", "4", "--waves", "100000", "--log-dir", str(logs)]
    bench = subprocess.Popen([*argv, "--out", str(tmp_path / "s.json")], cwd=SCRIPT.parents[1])
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None:  # the server's log is named after its port; wait until it answers
            assert time.monotonic() < deadline, "no server answered /health within 120 s"
            assert bench.poll() is None, f"the bench exited early ({bench.returncode})"
            for log in logs.glob("builtin-*.log"):
                try:
                    if requests.get(f"http://127.0.0.1:{log.stem.split('-')[1]}/health", timeout=2).ok:
                        port = int(log.stem.split("-")[1])
                except requests.ConnectionError:
                    pass
            time.sleep(0.2)
        os.kill(bench.pid, signal.SIGTERM)
        assert bench.wait(timeout=90) == 143
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if bench.poll() is None:
            bench.kill()


def test_decode_rate_is_read_from_full_batches_of_sglang_s_log():
    bench = load()
    line = (
        "[2026-12-07 23:10:01] Decode batch, #running-req: {n}, #token: 30000, token usage: 0.10, "
        "cuda graph: True, gen throughput (token/s): {r}, #queue-req: 0, "
    )
    log = "\n".join(line.format(n=n, r=r) for n, r in [(256, 25600.0), (250, 20000.0), (12, 900.0), (256, 0.0)])
    got = bench.full_batch_decode_rate(log, 256)
    assert got == {  # 253 running
        "decode_tokens_per_s": 22800.0,
        "decode_step_ms": 11.096,
        "decode_lines": 2,
        "decode_window_rates": [25600, 20000],
    }
    assert bench.full_batch_decode_rate("no such lines", 256)["decode_step_ms"] is None


def test_the_report_keeps_the_variants_finished_before_one_fails(tmp_path):
    from areal.infra.health import ServerStartupError

    bench = load()
    out = tmp_path / "settings.json"
    argv = ["--server", "builtin", "--groups", "2", "--group-size", "2", "--prompt-len", "8"]
    argv += ["--new-tokens", "4", "--waves", "1", "--out", str(out)]
    with pytest.raises(ServerStartupError):
        bench.main([*argv, "--variant", "base", "--variant", "broken --no-such-flag"])
    assert [v["name"] for v in json.loads(out.read_text())["variants"]] == ["base"]


def test_the_tiny_model_fits_each_runs_prompt_and_answers():
    """The tiny model's folder is reused when it exists: a longer prompt must get its own."""
    from transformers import AutoConfig

    bench = load()
    for prompt_len in (8, 40):
        args = Namespace(model_path=None, prompt_len=prompt_len, new_tokens=4)
        path, _ = bench.model_and_vocab(args)
        assert AutoConfig.from_pretrained(path).max_position_embeddings >= prompt_len + 4
