"""Shared fixtures: a tiny model folder built once per session (no downloads)."""

import os

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from areal.models.tiny import make_tiny_model_dir

    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="session")
def scripted_chat_model_dir(tmp_path_factory):
    """A tiny chat model that answers tests/scripted_chat.py's conversations exactly."""
    from tests.scripted_chat import build_scripted_chat_model

    return str(build_scripted_chat_model(tmp_path_factory.mktemp("scripted_chat") / "model"))


@pytest.fixture(scope="module")
def scripted_chat_engine(scripted_chat_model_dir):
    """A RemoteSGLangEngine (consumer batch 2) of a built-in server serving the scripted chat model."""
    from tests.serving import served_engine

    with served_engine(scripted_chat_model_dir) as engine:
        yield engine


def pytest_configure(config):
    """Under --dist loadgroup an end-to-end test outside its group would run beside another and race
    it for machine-wide state (Ray's current cluster, crash tickets). pytest 9.2's node ids ignore
    the group suffix pytest-xdist 3.8 sets, and that happened in CI: refuse it up front."""
    if getattr(config.option, "dist", None) == "loadgroup" and not hasattr(config, "workerinput"):
        from packaging.version import Version

        if Version(pytest.__version__) >= Version("9.2"):
            raise pytest.UsageError(
                f"pytest {pytest.__version__} with --dist loadgroup: pytest-xdist cannot group the "
                "end-to-end tests; install pyproject.toml's dev pin (pytest<9.2) or run without -n"
            )


# first: pytest-xdist's own hook reads the xdist_group marks
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """gpu-marked tests skip themselves where CUDA is absent (CI, this machine); slow ones share a
    group, so that under `pytest -n 2 --dist loadgroup` (the README's command) one worker runs the
    end-to-end runs one after another while the other takes the rest beside them. That worker set
    the suite's length (it ran alone for the last 4 minutes, 2026-12-07), so the slow tests of the
    benchmark scripts and the load tools (marked second_lane) form a group of their own, which the
    other worker takes."""
    for item in items:
        if "slow" in item.keywords:
            lane = "end_to_end_tools" if "second_lane" in item.keywords else "end_to_end"
            item.add_marker(pytest.mark.xdist_group(lane))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing: the launcher-only install
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (run through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per process, in this one and in every server, trainer and launcher the tests
# start (they inherit it; the launcher keeps a value the user set): a test run starts several
# processes on a 2-core machine, and one thread per core each oversubscribes it. test_grpo_loop
# took 110 s with the default and 68 s with 1 on a busy 2-core machine. Tests of the launcher's own
# default drop it (tests/launcher/helpers.repo_env).
os.environ.setdefault("OMP_NUM_THREADS", "1")
