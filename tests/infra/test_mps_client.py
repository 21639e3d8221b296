"""areal.infra.mps: a trainer asks the run's MPS daemon whether it is one of its clients. Runs the
stand-in control program (tests/launcher/mps_control_standin) on CPU; the GPU test runs NVIDIA's."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from areal.infra import mps
from launcher.mps import MpsDaemon
from launcher.plan import MpsPlan, mps_pipe_dir

STANDIN = Path(__file__).resolve().parents[1] / "launcher" / "mps_control_standin"


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    plan = MpsPlan(devices=[0], pipe_dir=mps_pipe_dir(str(tmp_path)), log_dir=str(tmp_path / "mps"))
    running = MpsDaemon(plan, dict(os.environ))
    running.start()
    for key, value in plan.env().items():
        monkeypatch.setenv(key, value)
    yield running
    running.stop(grace_s=5)


def test_a_client_says_so(daemon, caplog):
    Path(daemon.plan.pipe_dir, "clients").write_text(f"{os.getpid()}\n")
    with caplog.at_level(logging.INFO, logger="areal.trainer"):
        assert mps.report_attachment(logging.getLogger("areal.trainer"), "trainer rank 0") is True
    assert f"trainer rank 0 (pid {os.getpid()}) is a client of MPS server [" in caplog.text


def test_a_process_the_daemon_does_not_serve_warns(daemon, caplog):
    with caplog.at_level(logging.INFO, logger="areal.trainer"):
        assert mps.report_attachment(logging.getLogger("areal.trainer"), "trainer rank 0") is False
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "runs time-sliced, as without launcher.mps" in record.message


def test_without_launcher_mps_nothing_is_asked(monkeypatch, caplog):
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    assert mps.report_attachment(logging.getLogger("areal.trainer"), "trainer rank 0") is None
    assert caplog.records == []
