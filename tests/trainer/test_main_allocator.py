"""The colocated trainer's CUDA allocator setting (areal.trainer.main.colocated_allocator)."""

from areal.config import validate_config
from areal.trainer.main import ALLOC_CONF, colocated_allocator
from launcher.compose import compose


def config(colocate: bool):
    return validate_config(compose("gsm8k_grpo", ["cluster.device=cpu", f"launcher.colocate={str(colocate).lower()}"]))


def test_a_colocated_trainer_gets_expandable_segments():
    env: dict[str, str] = {}
    assert colocated_allocator(config(True), env) == "expandable_segments:True"
    assert env == {ALLOC_CONF: "expandable_segments:True"}


def test_the_users_setting_and_a_trainer_of_its_own_are_left_alone():
    env = {ALLOC_CONF: "max_split_size_mb:512"}  # launcher.trainer_env or the launcher's shell
    assert colocated_allocator(config(True), env) is None
    assert env == {ALLOC_CONF: "max_split_size_mb:512"}
    env = {}
    assert colocated_allocator(config(False), env) is None and env == {}
