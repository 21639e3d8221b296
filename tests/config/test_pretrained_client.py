"""The config RemoteSGLangEngine.from_pretrained builds is the one the YAML path builds (no servers here)."""

import pytest

from areal.config import ConfigError, validate_config
from areal.config.pretrained_client import overrides_to_raw, pretrained_client_config


def test_same_config_as_validate_config():
    cfg = pretrained_client_config(
        "/models/m",
        tokenizer_path="/tok",
        dp_size=2,
        server_addrs=["a:1", "b:2"],
        max_concurrent_rollouts=6,
        gconfig={"max_new_tokens": 32, "n_samples": 2},
        train_dataset={"path": "synthetic:arith"},
        **{"rollout.request_timeout_s": 30.0, "sglang.api_key": "k"},
    )
    expected = validate_config(
        {
            "actor": {"path": "/models/m", "tokenizer_path": "/tok"},
            "rollout": {
                "backend": "sglang:d2t1",
                "server_addrs": ["a:1", "b:2"],
                "max_concurrent_rollouts": 6,
                "request_timeout_s": 30.0,
            },
            "gconfig": {"max_new_tokens": 32, "n_samples": 2},
            "sglang": {"api_key": "k"},
            "train_dataset": {"path": "synthetic:arith"},
        }
    )
    assert cfg == expected
    assert cfg.sglang.model_path == "/models/m" and cfg.sglang.tokenizer_path == "/tok"


def test_no_dataset_needed_for_a_client():
    cfg = pretrained_client_config("/m", server_addrs=["a:1"])
    assert cfg.train_dataset.path is None
    assert cfg.rollout.backend == "sglang:d1t1" and cfg.rollout.consumer_batch_size == 8


def test_dotted_and_nested_overrides_merge():
    raw = overrides_to_raw({"rollout": {"request_retries": 1}, "rollout.pause_mode": "retract", "seed": 3})
    assert raw == {"rollout": {"request_retries": 1, "pause_mode": "retract"}, "seed": 3}


def test_conflicting_values_name_both():
    with pytest.raises(ValueError, match="actor.path is given twice"):
        pretrained_client_config("/m", actor={"path": "/other"})
    pretrained_client_config("/m", actor={"path": "/m"}, server_addrs=["a:1"])  # same value: fine
    with pytest.raises(ValueError, match="rollout.backend is given twice"):
        pretrained_client_config("/m", dp_size=2, server_addrs=["a:1", "b:1"], rollout={"backend": "sglang:d1t1"})


def test_dp_must_match_server_addrs():
    with pytest.raises(ValueError, match="dp_size=3 but 2 server_addrs"):
        pretrained_client_config("/m", dp_size=3, server_addrs=["a:1", "b:1"])
    assert pretrained_client_config("/m", server_addrs=["a:1", "b:1"]).rollout.backend == "sglang:d2t1"


def test_client_relevant_errors_are_raised_with_keys():
    with pytest.raises(ConfigError) as e:
        pretrained_client_config("/m", server_addrs=["a:1"], gconfig={"temperature": -1}, rollout={"bogus": 1})
    keys = {i.key for i in e.value.issues}
    assert {"gconfig.temperature", "rollout.bogus"} <= keys
