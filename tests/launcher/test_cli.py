"""The areal-launch command line, run as users run it (a subprocess)."""

import json
import subprocess
import sys

import yaml

CLI = [sys.executable, "-m", "launcher.cli"]


def run(*args, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def test_dry_run_prints_the_plan_and_exits_0():
    r = run("--config", "gsm8k_grpo.yaml", "actor.optimizer.lr=1e-6", "rollout=sync", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "server-3" in r.stdout and "trainer-3" in r.stdout and "run directory:" in r.stdout


def test_dry_run_json_is_machine_readable():
    r = run("--config", "gsm8k_grpo", "launcher.trainer_n_nodes=0", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    roles = [p["role"] for p in json.loads(r.stdout)["processes"]]
    assert roles == ["server"] * 4 + ["driver"]


def test_trainer_only_dry_run():
    r = run("--config", "gsm8k_grpo", "launcher.rollout_n_nodes=0", "rollout.server_addrs=[h:1]", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    assert {p["role"] for p in json.loads(r.stdout)["processes"]} == {"trainer"}


def test_config_errors_exit_2_with_every_problem_and_no_traceback():
    r = run(
        "--config",
        "gsm8k_grpo",
        "actor.c_clip=0.5",
        "actor.use_decoupled_loss=true",
        "actor.recompute_logprob=false",
        "gconfig.n_samples=1",
        "--dry-run",
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    for key in ("actor.c_clip", "actor.use_decoupled_loss", "gconfig.n_samples"):
        assert key in r.stderr
    assert r.stdout == ""  # nothing planned, nothing started


def test_unknown_key_exit_2_names_closest():
    r = run("--config", "gsm8k_grpo", "actor.optimzer.lr=1e-6", "--dry-run")
    assert r.returncode == 2 and "did you mean actor.optimizer.lr?" in r.stderr


def test_cfg_job_prints_composed_config_and_resolve(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("defaults:\n  - rollout: sync\n  - _self_\nref:\n  dtype: ${actor.dtype}\n")
    raw = yaml.safe_load(run("--config", str(exp), "--cfg", "job").stdout)
    assert raw["ref"]["dtype"] == "${actor.dtype}"
    raw = yaml.safe_load(run("--config", str(exp), "actor.dtype=float16", "--cfg", "job", "--resolve").stdout)
    assert raw["ref"]["dtype"] == "float16" and raw["rollout"]["max_head_offpolicyness"] == 0


def test_cfg_all_prints_validated_config_with_followed_defaults():
    r = run("--config", "gsm8k_grpo", "actor.dtype=float16", "--cfg", "all")
    assert r.returncode == 0, r.stderr
    raw = yaml.safe_load(r.stdout)
    assert raw["sglang"]["dtype"] == "float16" and raw["sglang"]["model_path"] == raw["actor"]["path"]


def test_running_gpu_recipe_without_gpu_fails_early_and_clearly(tmp_path):
    r = run("--config", "gsm8k_grpo", f"cluster.fileroot={tmp_path}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cluster.device" in r.stderr and "no CUDA GPU" in r.stderr
    assert not any(tmp_path.iterdir())  # nothing written, nothing started


def test_help():
    r = run("--help")
    assert r.returncode == 0 and "--dry-run" in r.stdout and "overrides" in r.stdout.lower()
