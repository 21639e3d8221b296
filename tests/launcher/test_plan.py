"""Launch plans for full, trainer-only, inference-only and multi-node layouts (pure: no processes)."""

import dataclasses
import json

import pytest

from areal.config import ConfigError, validate_config
from areal.infra.host import HostFacts
from areal.infra.servers import drop_unknown_flags
from launcher.plan import TRAINER_HEAD, make_plan

GPU = HostFacts(cuda_available=True, python="python")
CPU = HostFacts(cuda_available=False, python="python")


def cfg(**kw):
    raw = {
        "actor": {"path": "/m", "backend": "fsdp:d4"},
        "rollout": {"backend": "sglang:d2t2"},
        "train_dataset": {"path": "/d", "batch_size": 8},
        "cluster": {"n_gpus_per_node": 8},
    }
    for key, value in kw.items():
        node = raw
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return validate_config(raw)


def test_full_single_node_layout():
    plan = make_plan(cfg(), GPU)
    servers, trainers = plan.by_role("server"), plan.by_role("trainer")
    assert [s.devices for s in servers] == [[0, 1], [2, 3]]
    assert [t.devices for t in trainers] == [[4], [5], [6], [7]]
    assert [s.port for s in servers] == [30000, 30001]
    assert servers[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    t = trainers[2].env
    assert (t["RANK"], t["WORLD_SIZE"], t["LOCAL_RANK"], t["MASTER_ADDR"], t["MASTER_PORT"]) == (
        "2",
        "4",
        "2",
        "127.0.0.1",
        "29500",
    )
    assert trainers[0].command[-2:] == ["--config", f"{plan.run_dir}/config.yaml"]
    assert "--tp-size" in servers[0].command and servers[0].command[servers[0].command.index("--tp-size") + 1] == "2"
    assert not plan.by_role("driver")
    seeds = [s.command[s.command.index("--random-seed") + 1] for s in servers]
    assert seeds == ["1", "2"]  # distinct per server, or GRPO groups get duplicate samples


def test_trainer_only_skips_servers():
    plan = make_plan(cfg(launcher__rollout_n_nodes=0, rollout__server_addrs=["h:1"]), GPU)
    assert not plan.by_role("server") and len(plan.by_role("trainer")) == 4
    assert plan.by_role("trainer")[0].devices == [0]  # trainer starts at device 0 without servers
    assert plan.server_kind is None


def test_inference_only_runs_servers_and_a_driver_without_gpu():
    plan = make_plan(cfg(launcher__trainer_n_nodes=0), GPU)
    assert not plan.by_role("trainer") and len(plan.by_role("server")) == 2
    (driver,) = plan.by_role("driver")
    assert driver.devices == [] and driver.env["CUDA_VISIBLE_DEVICES"] == ""
    assert driver.command[2] == "areal.trainer.driver"


def test_multi_node_layout_gives_each_side_its_nodes():
    c = cfg(
        cluster__n_nodes=3,
        launcher__rollout_n_nodes=1,
        launcher__trainer_n_nodes=2,
        rollout__backend="sglang:d4t2",
        actor__backend="fsdp:d16",
        train_dataset__batch_size=16,
    )
    plan = make_plan(c, GPU)
    assert {s.node for s in plan.by_role("server")} == {0}
    trainers = plan.by_role("trainer")
    assert [t.node for t in trainers] == [1] * 8 + [2] * 8
    assert trainers[9].devices == [1] and trainers[9].env["LOCAL_RANK"] == "1"
    assert trainers[0].env["MASTER_ADDR"] == TRAINER_HEAD


def test_cpu_plan_hides_gpus_and_uses_builtin_server():
    plan = make_plan(cfg(cluster__device="auto"), CPU)
    assert plan.device == "cpu" and plan.server_kind == "builtin"
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "" for p in plan.processes)
    assert plan.by_role("server")[0].command[1:3] == ["-m", "areal.server"]


def test_server_auto_prefers_sglang_with_cuda():
    facts = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    plan = make_plan(cfg(), facts)
    assert plan.server_kind == "sglang" and plan.by_role("server")[0].command[2] == "sglang.launch_server"
    assert make_plan(cfg(rollout__server="builtin"), facts).server_kind == "builtin"


def test_old_sglang_is_refused_with_a_clear_message():
    facts = HostFacts(cuda_available=True, sglang_version="0.4.6", python="python")
    with pytest.raises(ConfigError, match="older than 0.5.9"):
        make_plan(cfg(rollout__server="sglang"), facts)
    with pytest.raises(ConfigError, match="not installed"):
        make_plan(cfg(rollout__server="sglang"), GPU)


def test_flags_unknown_to_installed_sglang_are_dropped_with_warnings():
    known = frozenset(
        {
            "--model-path",
            "--port",
            "--tp-size",
            "--dtype",
            "--host",
            "--tokenizer-path",
            "--mem-fraction-static",
            "--random-seed",
            "--log-level",
        }
    )
    facts = HostFacts(cuda_available=True, sglang_version="0.5.9", sglang_flags=known, python="python")
    plan = make_plan(
        cfg(rollout__server="sglang", sglang__disable_cuda_graph=True, sglang__attention_backend="fa3"), facts
    )
    cmd = plan.by_role("server")[0].command
    assert "--disable-cuda-graph" not in cmd and "--attention-backend" not in cmd and "fa3" not in cmd
    assert "--model-path" in cmd
    assert any("--attention-backend" in w and "0.5.9" in w for w in plan.warnings)
    assert any("not a tested version" in w and "0.5.16" in w for w in plan.warnings)  # 0.5.9 is not
    assert any("--disable-cuda-graph" in w for w in plan.warnings)


def test_the_plan_resolves_the_pause_mode_once_per_server_program():
    sglang = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    builtin_plan, sglang_plan = make_plan(cfg(rollout__server="builtin"), sglang), make_plan(cfg(), sglang)
    assert (builtin_plan.pause_mode, sglang_plan.pause_mode) == ("retract", "abort")  # rollout.pause_mode=auto
    assert "--disable-radix-cache" not in sglang_plan.by_role("server")[0].command
    # retract on SGLang: retracted requests must not find their prompts cached under the old weights
    retract = make_plan(cfg(rollout__pause_mode="retract"), sglang)
    assert "--disable-radix-cache" in retract.by_role("server")[0].command
    assert (
        "--disable-radix-cache" not in make_plan(cfg(rollout__pause_mode="retract"), CPU).by_role("server")[0].command
    )
    assert json.loads(sglang_plan.to_json())["pause_mode"] == "abort"


def test_the_plan_resolves_the_stream_interval_with_the_pause_mode(tmp_path):
    """rollout.stream_interval=auto streams where SGLang holds requests over an update, and
    config.yaml carries the resolved value, so no process resolves it again."""
    import yaml

    from launcher.cli import write_run_dir

    sglang = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    modes = ("auto", "in_place", "retract")
    resolved = {mode: make_plan(cfg(rollout__pause_mode=mode), sglang).stream_interval for mode in modes}
    assert resolved == {"auto": None, "in_place": 16, "retract": 16}  # auto is abort on SGLang
    assert make_plan(cfg(rollout__pause_mode="in_place", rollout__server="builtin"), sglang).stream_interval is None
    kept = make_plan(cfg(rollout__pause_mode="in_place", rollout__stream_interval=None), sglang)
    assert kept.stream_interval is None
    plan = make_plan(cfg(rollout__pause_mode="in_place", cluster__fileroot=str(tmp_path)), sglang)
    assert json.loads(plan.to_json())["stream_interval"] == 16 and "streamed every 16 tokens" in plan.describe()
    write_run_dir(cfg(rollout__pause_mode="in_place", cluster__fileroot=str(tmp_path)), plan)
    written = yaml.safe_load(open(f"{plan.run_dir}/config.yaml").read())
    assert written["rollout"]["stream_interval"] == 16
    assert validate_config(written).rollout.stream_interval == 16


def test_sglang_tuning_knobs_reach_sglang_only_and_once():
    sglang = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    knobs = dict(sglang__cuda_graph_max_bs=256, sglang__sampling_backend="pytorch", sglang__disable_radix_cache=True)
    for mode in ("abort", "retract"):  # retract adds --disable-radix-cache itself
        cmd = make_plan(cfg(rollout__pause_mode=mode, **knobs), sglang).by_role("server")[0].command
        assert cmd.count("--disable-radix-cache") == 1, cmd
        assert cmd[cmd.index("--cuda-graph-max-bs") + 1] == "256"
        assert cmd[cmd.index("--sampling-backend") + 1] == "pytorch"
    builtin = make_plan(cfg(rollout__server="builtin", **knobs), CPU).by_role("server")[0].command
    assert not {"--cuda-graph-max-bs", "--sampling-backend", "--disable-radix-cache"} & set(builtin)


def test_sglang_cuda_graphs_cover_the_running_batch():
    """SGLang 0.5.16 captures decode graphs up to 256 sequences on an H200 at tp 1: the launcher asks
    for graphs up to sglang.max_running_requests (at most 512), and says when batches outgrow them."""
    sglang = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")

    def server(**kw):
        plan = make_plan(cfg(rollout__server="sglang", **kw), sglang)
        cmd = plan.by_role("server")[0].command
        graph_bs = cmd[cmd.index("--cuda-graph-max-bs") + 1] if "--cuda-graph-max-bs" in cmd else None
        return graph_bs, [w for w in plan.warnings if "without a CUDA graph" in w]

    assert server(sglang__max_running_requests=512) == ("512", [])
    assert server(sglang__max_running_requests=64) == ("64", [])
    assert server() == (None, [])  # both null: SGLang's own sizes
    assert server(sglang__max_running_requests=512, sglang__disable_cuda_graph=True) == (None, [])
    graph_bs, (warning,) = server(sglang__max_running_requests=1024)
    assert graph_bs == "512" and "sglang.cuda_graph_max_bs is 512" in warning and "=1024" in warning
    graph_bs, (warning,) = server(sglang__max_running_requests=512, sglang__cuda_graph_max_bs=256)
    assert graph_bs == "256" and "above 256 sequences" in warning and "launcher's cap" not in warning
    builtin = make_plan(cfg(rollout__server="builtin", sglang__max_running_requests=512), CPU)
    assert "--cuda-graph-max-bs" not in builtin.by_role("server")[0].command and not builtin.warnings


def test_every_flag_reaches_sglang_0_5_16():
    """With every SGLang knob set, each flag of the command is a field of 0.5.16's ServerArgs (read
    from its source: tests/engine/data/sglang_fields.json), so the launcher drops none: until the
    rename, sglang.cuda_graph_max_bs was dropped with a warning (0.5.16 calls it
    --cuda-graph-max-bs-decode)."""
    from pathlib import Path

    fields = json.loads((Path(__file__).parents[1] / "engine" / "data" / "sglang_fields.json").read_text())
    known = frozenset("--" + f.replace("_", "-") for f in fields["ServerArgs"])
    facts = HostFacts(cuda_available=True, sglang_version="0.5.16", sglang_flags=known, python="python")
    knobs = dict(
        sglang__max_running_requests=256,
        sglang__max_queued_requests=64,
        sglang__max_prefill_tokens=8192,
        sglang__chunked_prefill_size=4096,
        sglang__attention_backend="triton",
        sglang__cuda_graph_max_bs=128,
        sglang__sampling_backend="pytorch",
        sglang__disable_radix_cache=True,
        sglang__enable_metrics=True,
        sglang__skip_tokenizer_init=True,
        rollout__stream_interval=16,
        sglang__enable_memory_saver=True,
        sglang__api_key="k",
        actor__use_lora=True,
        actor__lora_push="adapter",
    )
    plan = make_plan(cfg(rollout__server="sglang", **knobs), facts)
    cmd = plan.by_role("server")[0].command
    assert not [w for w in plan.warnings if "has no flag" in w], plan.warnings
    flags = {a for a in cmd if a.startswith("--")}
    assert flags <= known and cmd[cmd.index("--cuda-graph-max-bs-decode") + 1] == "128"
    assert {"--enable-lora", "--max-lora-rank", "--sampling-backend", "--disable-radix-cache"} <= flags
    assert "--incremental-streaming-output" in flags  # rollout.stream_interval turns it on


def test_renamed_sglang_flags_take_the_installed_versions_name():
    old_only = frozenset({"--model-path", "--port", "--cuda-graph-max-bs"})  # 0.5.9's field
    new_only = frozenset({"--model-path", "--port", "--cuda-graph-max-bs-decode"})  # 0.5.16's
    for known, flag in ((old_only, "--cuda-graph-max-bs"), (new_only, "--cuda-graph-max-bs-decode")):
        facts = HostFacts(cuda_available=True, sglang_version="0.5.16", sglang_flags=known, python="python")
        plan = make_plan(cfg(rollout__server="sglang", sglang__max_running_requests=64), facts)
        cmd = plan.by_role("server")[0].command
        assert cmd[cmd.index(flag) + 1] == "64" and cmd.count("--cuda-graph-max-bs") == (flag == "--cuda-graph-max-bs")
        assert not any("cuda-graph" in w for w in plan.warnings)


def test_sglang_gets_a_folder_for_the_projects_model_names():
    """SGLang cannot read tiny:/smollm2: names: it starts through areal.models.serve, which resolves
    them to the shared folder and execs SGLang; folders and hub ids go to SGLang directly."""
    sglang = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    cmd = make_plan(cfg(actor__path="smollm2:135m-instruct"), sglang).by_role("server")[0].command
    assert cmd[1:4] == ["-m", "areal.models.serve", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == "smollm2:135m-instruct"
    cmd = make_plan(cfg(actor__path="/models/qwen"), sglang).by_role("server")[0].command
    assert cmd[1:3] == ["-m", "sglang.launch_server"]


def test_serve_resolves_model_names_before_exec(monkeypatch):
    from areal.models import serve

    monkeypatch.setattr(serve, "resolve_model_path", lambda name: f"/cache/{name.replace(':', '_')}")
    args = ["--model-path", "tiny:chars", "--tokenizer-path=smollm2:135m-instruct", "--port", "1", "--dtype", "x"]
    assert serve.resolved_args(args) == [
        "--model-path",
        "/cache/tiny_chars",
        "--tokenizer-path=/cache/smollm2_135m-instruct",
        "--port",
        "1",
        "--dtype",
        "x",
    ]


def test_drop_keeps_values_with_their_flags():
    out = drop_unknown_flags(["--a", "1", "--b", "--c", "x"], frozenset({"--a", "--c"}), "0.5", [])
    assert out == ["--a", "1", "--c", "x"]


def test_drop_keeps_every_value_of_a_list_flag():
    """--lora-target-modules takes several values; keeping only the first made SGLang refuse an
    adapter on o_proj ("incompatible with the current LoRA memory pool")."""
    flags = ["--enable-lora", "--lora-target-modules", "q_proj", "k_proj", "o_proj", "--old", "1", "2", "--port", "9"]
    warnings: list[str] = []
    out = drop_unknown_flags(flags, frozenset({"--enable-lora", "--lora-target-modules", "--port"}), "0.5.16", warnings)
    assert out == ["--enable-lora", "--lora-target-modules", "q_proj", "k_proj", "o_proj", "--port", "9"]
    assert warnings == ["sglang 0.5.16 has no flag --old; it is dropped from the server command"]


def test_plan_json_shape():
    data = json.loads(make_plan(cfg(), GPU).to_json())
    proc = data["processes"][0]
    assert {"role", "index", "node", "devices", "command", "env"} <= set(proc)
    assert data["device"] == "cuda"


def test_role_env_reaches_only_its_role():
    plan = make_plan(cfg(launcher__trainer_env={"NCCL_DEBUG": "INFO"}, launcher__server_env={"X": "1"}), GPU)
    assert plan.by_role("trainer")[0].env["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG" not in plan.by_role("server")[0].env
    assert plan.by_role("server")[0].env["X"] == "1"


def flag_values(cmd, flag):
    """The values after `flag` up to the next flag."""
    i = cmd.index(flag) + 1
    out = []
    while i < len(cmd) and not cmd[i].startswith("--"):
        out.append(cmd[i])
        i += 1
    return out


def test_local_servers_bind_loopback_and_load_weights_only_from_the_run():
    from areal.engine.fsdp.weight_sync import disk_update_path
    from areal.trainer.checkpoint import checkpoint_root

    c = cfg(
        cluster__device="cpu",
        sglang__weight_dirs=["/data/extra"],
        sglang__max_queued_requests=8,
        sglang__max_prefill_tokens=65536,
    )
    plan = make_plan(c, CPU)
    assert plan.server_kind == "builtin"
    for server in plan.by_role("server"):
        assert flag_values(server.command, "--host") == ["127.0.0.1"]
        assert flag_values(server.command, "--max-queued-requests") == ["8"]
        assert flag_values(server.command, "--max-prefill-tokens") == ["65536"]
        dirs = flag_values(server.command, "--weight-dirs")
        assert dirs == [f"{c.run_dir}/weight_update", f"{c.run_dir}/checkpoints", f"{c.run_dir}/models", "/data/extra"]
    # the folders the trainer writes weights to are inside the allowed ones
    written = [
        disk_update_path(c.cluster.fileroot, c.experiment_name, c.trial_name, 3),
        str(checkpoint_root(c.run_dir) / "step_00000001"),
        f"{c.run_dir}/models/final",
    ]
    assert all(any(w.startswith(d + "/") for d in dirs) for w in written)
    # SGLang has no such flag: not passed to it
    facts = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    (sglang, *_) = make_plan(cfg(sglang__weight_dirs=["/data/extra"]), facts).by_role("server")
    assert "--weight-dirs" not in sglang.command and "/data/extra" not in sglang.command
    assert flag_values(sglang.command, "--host") == ["127.0.0.1"]


def test_sglang_is_started_able_to_load_pushed_lora_adapters():
    facts = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    lora = dict(
        actor__use_lora=True, actor__lora_rank=8, actor__target_modules=["q_proj", "v_proj"], rollout__server="sglang"
    )
    cmd = make_plan(cfg(actor__lora_push="adapter", **lora), facts).by_role("server")[0].command
    assert "--enable-lora" in cmd
    assert cmd[cmd.index("--max-lora-rank") + 1] == "8"
    assert cmd[cmd.index("--lora-target-modules") + 1 :][:2] == ["q_proj", "v_proj"]
    known = frozenset(t for t in cmd if t.startswith("--"))  # as the installed sglang reports its flags
    checked = make_plan(cfg(actor__lora_push="adapter", **lora), dataclasses.replace(facts, sglang_flags=known))
    assert checked.by_role("server")[0].command == cmd  # both modules survive the installed-flags check
    merged = make_plan(cfg(actor__lora_push="merged", **lora), facts).by_role("server")[0].command
    assert "--enable-lora" not in merged and "--max-lora-rank" not in merged  # full weights: no adapters
    builtin = make_plan(cfg(actor__lora_push="adapter", **{**lora, "rollout__server": "builtin"}), facts)
    assert "--enable-lora" not in builtin.by_role("server")[0].command  # merges adapters itself


def test_sglang_servers_get_the_logging_config_and_a_prompt_shutdown(tmp_path):
    """SGLang reads its logging config from SGLANG_LOGGING_CONFIG_PATH (the run's folder, written
    with the run's config) and skips draining requests on SIGTERM (SGL_FORCE_SHUTDOWN)."""
    from launcher.cli import write_run_dir

    facts = HostFacts(cuda_available=True, sglang_version="0.5.16", python="python")
    c = cfg(rollout__server="sglang", cluster__fileroot=str(tmp_path), sglang__log_level="error")
    plan = make_plan(c, facts)
    env = plan.by_role("server")[0].env
    assert env["SGL_FORCE_SHUTDOWN"] == "1"
    write_run_dir(c, plan)
    config = json.loads(open(env["SGLANG_LOGGING_CONFIG_PATH"]).read())
    assert config["root"]["level"] == "ERROR"
    assert config["handlers"]["stderr"]["formatter"] == "areal"  # read back by the console (test_console.py)
    builtin = make_plan(cfg(rollout__server="builtin", cluster__fileroot=str(tmp_path)), facts)
    assert "SGLANG_LOGGING_CONFIG_PATH" not in builtin.by_role("server")[0].env
