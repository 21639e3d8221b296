"""Fixtures for the built-in server tests: a tiny model with varied outputs, reference helpers."""

import pytest


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory):
    from tests.serving import make_varied_model_dir

    return str(make_varied_model_dir(tmp_path_factory.mktemp("varied") / "model"))


@pytest.fixture(scope="session")
def ref_model(varied_model_dir):
    """The same model in the test process, float32, for reference outputs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype="float32").eval()


@pytest.fixture(scope="module")
def allowed_dir(tmp_path_factory):
    """A folder the `server` below may load weights and adapters from (--weight-dirs)."""
    return tmp_path_factory.mktemp("allowed")


@pytest.fixture(scope="module")
def server(varied_model_dir, allowed_dir):
    """The server of test_weights.py and test_lora.py, one per module; a module that needs another
    server defines its own `server` fixture, which overrides this one."""
    from tests.serving import start_server

    handle = start_server(varied_model_dir, extra_args=["--dtype", "float32", "--weight-dirs", allowed_dir])
    yield handle
    assert handle.stop() == 0, handle.log()
