"""A corpus of bad configs and overrides (bad_inputs/cases.yaml), each rejected before anything starts.

Every case runs in-process through `launcher.cli.main` (as `areal-launch` would, minus the
interpreter start-up) and must: return 2, name its key as the key of a reported problem, print no
traceback and nothing on stdout, and leave the run directory uncreated. A few cases also run as a
real `python -m launcher.cli` subprocess to prove the exit code at process level.

    pytest tests/config/test_bad_inputs.py -q
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import launcher.cli as cli

REPO = Path(__file__).resolve().parents[2]
CASES = yaml.safe_load((Path(__file__).parent / "bad_inputs" / "cases.yaml").read_text())
FIELDS = {"id", "config", "yaml", "overrides", "key", "why", "expect", "dry_run"}
SUBPROCESS_CASES = ["yaml_syntax_unclosed_bracket", "override_no_key", "path_actor_model_missing"]


def argv_for(case: dict, tmp_path: Path) -> list[str]:
    """The command line of a case; the run directory goes under tmp_path/runs."""
    config = case["config"]
    if config == "inline":
        config = str(tmp_path / "experiment.yaml")
        Path(config).write_text(case["yaml"])
    argv = ["--config", config, *case["overrides"], f"cluster.fileroot={tmp_path / 'runs'}"]
    return argv + (["--dry-run"] if case.get("dry_run", True) else [])


def check_rejected(case: dict, rc: int, out: str, err: str, tmp_path: Path) -> None:
    assert rc == 2, f"exit code {rc}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    assert out == "", f"stdout should be empty:\n{out}"
    # the key is the key of a reported problem (ConfigIssue.format: "  <key> = <value>: <rule>"),
    # not just an echo of the override
    assert f"\n  {case['key']} = " in err, f"no problem names {case['key']!r}:\n{err}"
    for text in case.get("expect", []):
        assert text in err, f"{text!r} missing from:\n{err}"
    assert not (tmp_path / "runs").exists(), "the run directory was created"


def test_corpus_is_well_formed():
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 55 and len(set(ids)) == len(ids)
    for c in CASES:
        assert {"id", "config", "overrides", "key", "why"} <= set(c) <= FIELDS, c["id"]
        assert isinstance(c["overrides"], list) and c["why"].strip(), c["id"]
        assert (c["config"] == "inline") == ("yaml" in c), c["id"]
        if not c.get("dry_run", True):  # a real run: it must not ask for a GPU
            assert "cluster.device=cpu" in c["overrides"], c["id"]


def test_base_configs_are_valid():
    """The corpus breaks good configs: the bases themselves validate."""
    from areal.config import validate_config
    from launcher.compose import compose

    for name in sorted({c["config"] for c in CASES} & {"gsm8k_grpo", "tiny_arith_cpu"}):
        validate_config(compose(name))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_is_rejected_before_anything_starts(case, tmp_path, capsys, monkeypatch):
    def must_not_start(*_a, **_k):
        raise AssertionError("a process backend was reached")

    monkeypatch.setattr(cli, "_backend", lambda name: must_not_start)
    monkeypatch.setattr(cli, "write_run_dir", must_not_start)
    rc = cli.main(argv_for(case, tmp_path))
    out, err = capsys.readouterr()
    check_rejected(case, rc, out, err, tmp_path)


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_input_exits_2_as_a_process(case_id, tmp_path):
    case = next(c for c in CASES if c["id"] == case_id)
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", *argv_for(case, tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    check_rejected(case, r.returncode, r.stdout, r.stderr, tmp_path)
