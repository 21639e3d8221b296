"""Hints under a failed process's error, from SGLang's and torch's real lines (fixtures/)."""

from pathlib import Path

from launcher.diagnosis import hints
from launcher.supervisor import failure_report

FIXTURES = Path(__file__).parent / "fixtures"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_a_kv_cache_starved_at_start_names_the_share_and_concurrent_starts():
    # an H200, 2026-12-04: six runs started together, this server at sglang.mem_fraction_static=0.1
    (hint,) = hints(lines("sglang_0.5.16_kv_cache_start_failure.log"))
    assert "sglang.mem_fraction_static=0.1" in hint and "one at a time" in hint


def test_an_out_of_memory_server_names_what_to_shrink():
    # the 1.5B shape colocated at sglang.mem_fraction_static=0.5: SGLang's sampler, beside the trainer
    (hint,) = hints(lines("sglang_0.5.16_sampler_oom.log"))
    for key in ("actor.fused_logprobs=true", "actor.max_tokens_per_mb", "sglang.mem_fraction_static"):
        assert key in hint


def test_missing_fa3_names_the_attention_backends():
    (hint,) = hints(["Exception: Can not import FA3 in sgl_kernel. Please check your installation."])
    assert "sglang.attention_backend=triton" in hint


def test_a_normal_run_s_lines_give_no_hint():
    for name in ("sglang_0.5.16_run_warm.log", "sglang_0.5.16_run_cold_lora.log"):
        assert hints(lines(name)) == []


def test_the_failure_report_ends_with_the_hint(tmp_path):
    log = tmp_path / "server-0.log"
    log.write_text((FIXTURES / "sglang_0.5.16_kv_cache_start_failure.log").read_text())
    report = failure_report("server-0", str(log), "was killed by SIGKILL (exit code 137) before it was healthy")
    first, *_, last = report.splitlines()
    assert first.startswith("error: server-0 was killed by SIGKILL") and str(log) in first
    assert last.startswith("hint: SGLang found no room for its KV cache at sglang.mem_fraction_static=0.1")
