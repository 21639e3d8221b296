"""The project's own model names, told apart from folders and hub ids without the training stack."""

from areal.infra.model_names import SMOLLM2, is_project_model


def test_project_names_are_not_folders_or_hub_ids():
    assert is_project_model(SMOLLM2) and is_project_model("tiny:arith")
    assert not is_project_model("/models/tiny") and not is_project_model("Qwen/Qwen2.5-0.5B")
