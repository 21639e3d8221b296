"""Fixtures for the built-in server tests: a tiny model with varied outputs, reference helpers."""

import pytest


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory):
    from areal.server.testing import make_varied_model_dir

    return str(make_varied_model_dir(tmp_path_factory.mktemp("varied") / "model"))


@pytest.fixture(scope="session")
def ref_model(varied_model_dir):
    """The same model in the test process, float32, for reference outputs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype="float32").eval()

