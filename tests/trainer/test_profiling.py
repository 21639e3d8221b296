"""profiler.steps: torch.profiler traces of chosen steps, on the trainer and on the servers."""

import gzip
import json
import logging
from types import SimpleNamespace

import pytest

from areal.config import validate_config
from areal.config.errors import ConfigError
from areal.engine.sglang.control import ServerControl
from areal.trainer.profiling import STEP_ANNOTATION, StepProfiler, server_trace_dir, trainer_trace_path
from launcher.compose import compose
from tests.trainer.test_grpo_loop import arith_model, metrics, run_module, server, write_config  # noqa: F401


def _events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _cfg(tmp_path, steps, servers=False):
    profiler = SimpleNamespace(steps=steps, servers=servers, with_stack=False, record_shapes=False)
    return SimpleNamespace(profiler=profiler, run_dir=str(tmp_path))


def _work():
    import torch

    x = torch.randn(8, 8, requires_grad=True)
    (x @ x).sum().backward()


def test_only_listed_steps_are_traced(tmp_path):
    profiler = StepProfiler(_cfg(tmp_path, [2]), rank=0)
    for step in (1, 2):
        with profiler.step(step) as traced:
            assert traced == (step == 2)
            _work()
    assert not trainer_trace_path(tmp_path, 0, 1).exists()
    names = {e.get("name") for e in _events(trainer_trace_path(tmp_path, 0, 2))}
    assert STEP_ANNOTATION in names and "aten::mm" in names
    assert not list(trainer_trace_path(tmp_path, 0, 2).parent.glob("*.partial"))  # no half-written file left


def test_unreachable_servers_cost_a_warning_not_the_step(tmp_path, caplog):
    control = ServerControl(["127.0.0.1:9"], pause_mode="abort", control_timeout_s=5)  # nothing listens on 9
    profiler = StepProfiler(_cfg(tmp_path, [1], servers=True), rank=0, control=control)
    with caplog.at_level(logging.WARNING, logger="areal.trainer.profiling"):
        with profiler.step(1):
            _work()
    control.close()
    assert trainer_trace_path(tmp_path, 0, 1).exists()
    assert "profiler.servers: the servers do not trace step 1" in caplog.text
    assert "127.0.0.1:9" in caplog.text


def test_steps_after_the_last_step_are_refused():
    with pytest.raises(ConfigError) as e:
        validate_config(compose("tiny_arith_cpu", ["total_train_steps=3", "profiler.steps=[2,5]"]))
    assert "profiler.steps" in str(e.value) and "[5]" in str(e.value) and "between 1 and 3" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate_config(compose("tiny_arith_cpu", ["profiler.steps=[0]"]))
    assert "profiler.steps" in str(e.value)


@pytest.mark.slow
def test_a_traced_run_writes_the_trainer_and_server_traces(tmp_path, server, arith_model):  # noqa: F811
    from trace_summary import summarize

    addr = server.url.removeprefix("http://")
    cfg, path = write_config(
        tmp_path,
        arith_model,
        ["launcher.rollout_n_nodes=0", f"rollout.server_addrs=[{addr}]", "total_train_steps=2", "profiler.steps=[2]"],
    )
    run_module("areal.trainer.main", path)
    rows = metrics(cfg)
    assert [r.get("profiler/traced") for r in rows if r["step"] > 0] == [None, 1.0]
    trainer = trainer_trace_path(cfg.run_dir, 0, 2)
    names = {e.get("name") for e in _events(trainer)}
    assert {STEP_ANNOTATION, "areal/phase/rollout", "areal/phase/train", "areal/phase/weight_update"} <= names
    served = server_trace_dir(cfg.run_dir, 0) / "step2-TP-0.trace.json.gz"
    assert any(str(e.get("name", "")).startswith("aten::") for e in _events(served))  # the server's forward passes
    report = summarize(str(trainer))
    assert "areal/phase/train" in report
