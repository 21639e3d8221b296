"""Colocated plans (launcher.colocate): servers and trainers share devices; validation of the layout."""

import pytest

from areal.config import ConfigError, validate_config
from areal.infra.host import HostFacts
from launcher.plan import make_plan

GPU = HostFacts(cuda_available=True, python="python")
CPU = HostFacts(cuda_available=False, python="python")


def raw(**dotted) -> dict:
    out = {
        "actor": {"path": "/m", "backend": "fsdp:d1", "weight_update": "tensor"},
        "rollout": {"backend": "sglang:d1", "max_head_offpolicyness": 1},
        "train_dataset": {"path": "/d", "batch_size": 8},
        "cluster": {"n_gpus_per_node": 1},
        "launcher": {"colocate": True},
    }
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def problems(**dotted) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        validate_config(raw(**dotted))
    return {i.key: f"{i.rule} | {i.fix}" for i in e.value.issues}


def test_one_gpu_gives_both_roles_device_0():
    plan = make_plan(validate_config(raw()), GPU)
    (server,), (trainer,) = plan.by_role("server"), plan.by_role("trainer")
    assert server.devices == trainer.devices == [0]
    assert server.env["CUDA_VISIBLE_DEVICES"] == trainer.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert plan.colocated and plan.to_dict()["colocated"] is True
    assert "colocated" in plan.describe()
    command = server.command
    assert command[command.index("--mem-fraction-static") + 1] == "0.8"


def test_colocated_node_counts_the_larger_side_not_the_sum():
    cfg = validate_config(
        raw(**{"actor.backend": "fsdp:d2", "cluster.n_gpus_per_node": 2, "actor.weight_update": "disk"})
    )
    plan = make_plan(cfg, GPU)
    assert [p.devices for p in plan.by_role("server")] == [[0]]
    assert [p.devices for p in plan.by_role("trainer")] == [[0], [1]]
    # the same layout without colocation needs 3 devices, and the error offers colocation
    bad = problems(
        **{
            "launcher.colocate": False,
            "actor.backend": "fsdp:d2",
            "cluster.n_gpus_per_node": 2,
            "actor.weight_update": "disk",
        }
    )
    assert "3 devices" in bad["actor.backend"] and "launcher.colocate=true" in bad["actor.backend"]
    assert "2 devices" in problems(**{"actor.backend": "fsdp:d2"})["actor.backend"]


def test_nccl_inside_one_device_is_refused_with_the_fix():
    bad = problems(**{"actor.weight_update": "distributed"})
    assert "NCCL" in bad["actor.weight_update"] and "actor.weight_update=tensor" in bad["actor.weight_update"]
    # on CPU gloo has no such limit
    validate_config(raw(**{"actor.weight_update": "distributed", "cluster.device": "cpu"}))


def test_tensor_updates_need_colocation_and_one_server():
    assert (
        "launcher.colocate=true"
        in problems(**{"launcher.colocate": False, "cluster.n_gpus_per_node": 2})["actor.weight_update"]
    )
    assert "one server" in problems(**{"rollout.backend": "sglang:d2", "cluster.n_gpus_per_node": 2})["rollout.backend"]


def test_layout_rules_name_their_keys():
    assert (
        "cluster.n_nodes=1"
        in problems(**{"cluster.n_nodes": 2, "launcher.trainer_n_nodes": 1, "launcher.rollout_n_nodes": 1})[
            "launcher.colocate"
        ]
    )
    assert "inference-only" in problems(**{"launcher.trainer_n_nodes": 0})["launcher.colocate"]


def test_memory_split_and_time_sharing_rules():
    # both processes resident: the servers' share must leave the trainer room
    assert "at most 0.9" in problems(**{"sglang.mem_fraction_static": 0.95})["sglang.mem_fraction_static"]
    # time-shared (sync) runs may give the servers nearly everything
    cfg = validate_config(raw(**{"sglang.mem_fraction_static": 0.95, "rollout.max_head_offpolicyness": 0}))
    assert cfg.sglang.enable_memory_saver is True  # null follows: colocated and synchronous
    assert validate_config(raw()).sglang.enable_memory_saver is False  # asynchronous: static split
    assert "max_head_offpolicyness=0" in problems(**{"sglang.enable_memory_saver": True})["sglang.enable_memory_saver"]
    assert "actor.offload=false" in problems(**{"actor.offload": True})["actor.offload"]
    validate_config(raw(**{"actor.offload": True, "rollout.max_head_offpolicyness": 0}))


def test_the_trainers_auto_budget_counts_on_its_share_beside_resident_servers():
    from areal.config.experiment import trainer_memory_share

    cfg = validate_config(raw(**{"sglang.mem_fraction_static": 0.5}))  # asynchronous: both resident
    assert trainer_memory_share(cfg) == pytest.approx(1 - 0.5 - 0.05)  # actor.mb_server_margin's default
    # time-shared: the servers release their memory while the trainer trains; alone: its own device
    assert trainer_memory_share(validate_config(raw(**{"rollout.max_head_offpolicyness": 0}))) is None
    apart = raw(**{"launcher.colocate": False, "cluster.n_gpus_per_node": 2, "actor.weight_update": "disk"})
    assert trainer_memory_share(validate_config(apart)) is None
    # too small a share for auto budgets is refused, naming the margin and what to lower
    bad = problems(**{"sglang.mem_fraction_static": 0.88, "actor.max_tokens_per_mb": "auto"})
    assert "0.07 of each device" in bad["actor.mb_server_margin"]
    assert "lower sglang.mem_fraction_static" in bad["actor.mb_server_margin"]
    validate_config(raw(**{"sglang.mem_fraction_static": 0.88}))  # a fixed budget counts on nothing


def test_time_shared_servers_start_with_the_memory_saver():
    cfg = validate_config(raw(**{"rollout.max_head_offpolicyness": 0}))
    (server,) = make_plan(cfg, GPU).by_role("server")
    assert "--enable-memory-saver" in server.command
    (server,) = make_plan(validate_config(raw()), GPU).by_role("server")
    assert "--enable-memory-saver" not in server.command


def test_cpu_colocated_plan():
    plan = make_plan(validate_config(raw(**{"cluster.device": "cpu"})), CPU)
    assert plan.device == "cpu" and plan.colocated
    assert {p.env["CUDA_VISIBLE_DEVICES"] for p in plan.processes} == {""}


def test_trainers_start_with_the_servers_unless_colocated():
    """SGLang sizes its KV cache from the memory free as it starts: a colocated trainer starts only
    after the servers answer; on devices of their own, trainers start with them."""
    colocated = make_plan(validate_config(raw()), GPU)
    apart = make_plan(
        validate_config(
            raw(**{"launcher.colocate": False, "cluster.n_gpus_per_node": 2, "actor.weight_update": "disk"})
        ),
        GPU,
    )
    assert not colocated.mains_start_with_servers and apart.mains_start_with_servers
    assert "trainers start while the servers start" in apart.describe()
    assert "trainers start while" not in colocated.describe()
