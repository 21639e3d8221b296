"""make_plan(cfg, facts) -> LaunchPlan: which processes run where, with what env and command.

Pure and torch-free: the same config and host facts always give the same plan, which
`areal-launch --dry-run` prints and the local and Ray backends execute.

Layout: on a single node the servers take the first devices and the trainer ranks the next (with
`launcher.colocate`, both sides start at device 0 and share the devices); with several nodes, the
rollout side gets nodes [0, rollout_n_nodes) and the trainer side the following trainer_n_nodes.
`launcher.trainer_n_nodes=0` drops the trainers and adds a rollout driver (inference-only);
`launcher.rollout_n_nodes=0` drops the servers (trainer-only).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from areal.config import ExperimentConfig
from areal.config.parallel import parse_parallel
from areal.infra import sglang_logging
from areal.infra.host import HostFacts, resolve_device, resolve_server_kind  # noqa: F401 (re-exported)
from areal.infra.pause import resolve_pause_mode, resolve_stream_interval
from areal.infra.servers import indexed_server_command

# Placeholder in a multi-node trainer's MASTER_ADDR: the backend substitutes the address of the
# node that runs trainer rank 0 (only known once the nodes are).
TRAINER_HEAD = "{trainer_head}"


@dataclass
class ProcessSpec:
    role: str  # "server" | "trainer" | "driver"
    index: int
    node: int
    devices: list[int]
    command: list[str]
    env: dict[str, str]
    port: int | None = None  # servers: their HTTP port

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass
class MpsPlan:
    """launcher.mps: one MPS control daemon for the run's GPUs (launcher/mps.py starts it). Its
    clients find it through CUDA_MPS_PIPE_DIRECTORY, which every process of the plan carries."""

    devices: list[int]
    pipe_dir: str  # short: the daemon's unix sockets live here (108-byte path limit)
    log_dir: str

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}


def mps_pipe_dir(run_dir: str) -> str:
    """A per-run folder for the daemon's sockets, short whatever the run directory's length."""
    return f"/tmp/areal-mps-{hashlib.sha1(run_dir.encode()).hexdigest()[:10]}"


@dataclass
class LaunchPlan:
    run_dir: str
    device: str  # "cuda" | "cpu"
    server_kind: str | None  # "sglang" | "builtin" | None when no servers run
    processes: list[ProcessSpec] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    colocated: bool = False  # servers and trainers share devices (launcher.colocate)
    pause_mode: str | None = None  # rollout.pause_mode resolved for server_kind (areal.infra.pause)
    stream_interval: int | None = None  # rollout.stream_interval resolved with the pause mode
    mps: MpsPlan | None = None  # launcher.mps on a CUDA run

    def by_role(self, role: str) -> list[ProcessSpec]:
        return [p for p in self.processes if p.role == role]

    @property
    def mains_start_with_servers(self) -> bool:
        """Trainers (or the driver) start with the servers instead of after their /health: their
        start-up (imports, model load) then overlaps the servers'. Not when colocated: SGLang sizes
        its KV cache from the memory free on the device as it starts."""
        return bool(self.by_role("server")) and not self.colocated

    def to_dict(self) -> dict:
        return {
            "run_dir": self.run_dir,
            "device": self.device,
            "server": self.server_kind,
            "pause_mode": self.pause_mode,
            "stream_interval": self.stream_interval,
            "colocated": self.colocated,
            "mps": asdict(self.mps) if self.mps else None,
            "warnings": self.warnings,
            "processes": [{k: v for k, v in asdict(p).items()} for p in self.processes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def describe(self) -> str:
        """The plan as people read it (areal-launch --dry-run)."""
        lines = [
            f"run directory: {self.run_dir}",
            f"device: {self.device}    server program: {self.server_kind or '(none: trainer-only)'}"
            + (f"    pause mode: {self.pause_mode}" if self.pause_mode else "")
            + (f"    answers streamed every {self.stream_interval} tokens" if self.stream_interval else "")
            + ("    colocated: servers and trainers share devices" if self.colocated else ""),
            f"processes: {len(self.processes)}"
            + ("    (trainers start while the servers start)" if self.mains_start_with_servers else ""),
        ]
        if self.mps:
            devs = ",".join(map(str, self.mps.devices))
            lines.insert(2, f"mps: a control daemon for devices [{devs}], pipes in {self.mps.pipe_dir}")
        for p in self.processes:
            devs = ",".join(map(str, p.devices)) or "-"
            port = f"  port {p.port}" if p.port else ""
            lines.append(f"  {p.name:<10} node {p.node}  devices [{devs}]{port}")
            lines.append(f"      $ {' '.join(p.command)}")
            own = {k: v for k, v in p.env.items() if k not in ("PYTHONUNBUFFERED",)}
            lines.append("      env: " + " ".join(f"{k}={v}" for k, v in sorted(own.items())))
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def make_plan(cfg: ExperimentConfig, facts: HostFacts) -> LaunchPlan:
    device = resolve_device(cfg, facts)
    la = cfg.launcher
    run_servers, run_trainers = la.rollout_n_nodes > 0, la.trainer_n_nodes > 0
    plan = LaunchPlan(
        run_dir=cfg.run_dir,
        device=device,
        server_kind=resolve_server_kind(cfg, facts, device) if run_servers else None,
        colocated=la.colocate,
    )
    if run_servers or cfg.rollout.server != "auto":  # external servers of a named program too
        kind = plan.server_kind or cfg.rollout.server
        plan.pause_mode = resolve_pause_mode(cfg.rollout.pause_mode, kind)
        plan.stream_interval = resolve_stream_interval(cfg.rollout.stream_interval, plan.pause_mode, kind)
    slots = _DeviceSlots(cfg)
    base_env = {"AREAL_RUN_DIR": cfg.run_dir, "AREAL_CONFIG": f"{cfg.run_dir}/config.yaml", "PYTHONUNBUFFERED": "1"}
    if la.mps and device == "cuda":
        plan.mps = MpsPlan(devices=[], pipe_dir=mps_pipe_dir(cfg.run_dir), log_dir=f"{cfg.run_dir}/logs/mps")
        base_env.update(plan.mps.env())
    if run_servers:
        plan.processes += _servers(cfg, facts, plan, slots, base_env)
    if run_trainers:
        plan.processes += _trainers(cfg, facts, device, slots, base_env)
    else:
        plan.processes.append(_driver(cfg, facts, base_env))
    if plan.mps:
        plan.mps.devices = sorted({d for p in plan.processes for d in p.devices})
    return plan


class _DeviceSlots:
    """Hands out (node, device ids) per process following the layout in the module docstring."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.shared_next = 0  # single node: next free device

    def take(self, side: str, index: int, count: int, side_world: int) -> tuple[int, list[int]]:
        cl, la = self.cfg.cluster, self.cfg.launcher
        if cl.n_nodes == 1:
            if la.colocate:  # each side from device 0: server i and trainer rank i share devices
                return 0, list(range(index * count, (index + 1) * count))
            start = self.shared_next
            self.shared_next += count
            return 0, list(range(start, start + count))
        nodes = la.rollout_n_nodes if side == "rollout" else la.trainer_n_nodes
        first_node = 0 if side == "rollout" else la.rollout_n_nodes
        per_node = max(1, side_world // nodes)
        offset = index * count
        node = first_node + offset // per_node
        local = offset % per_node
        return node, list(range(local, local + count))


def _visible(device: str, devices: list[int]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices)) if device == "cuda" else ""}


def _servers(cfg, facts, plan, slots, base_env) -> list[ProcessSpec]:
    st = parse_parallel(cfg.rollout.backend, allowed_backends=("sglang",))
    procs = []
    for i in range(st.dp):
        node, devices = slots.take("rollout", i, st.tp, st.world_size)
        port = cfg.launcher.server_base_port + i
        command = indexed_server_command(
            cfg,
            i,
            port=port,
            kind=plan.server_kind,
            pause_mode=plan.pause_mode,
            facts=facts,
            warnings=plan.warnings if i == 0 else None,
        )
        own = sglang_logging.server_env(cfg.run_dir) if plan.server_kind == "sglang" else {}
        if plan.mps and cfg.launcher.mps_server_sm_percent:
            own["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cfg.launcher.mps_server_sm_percent)
        if plan.mps and cfg.launcher.mps_server_priority == "below_normal":
            own["CUDA_MPS_CLIENT_PRIORITY"] = "1"
        env = {**base_env, **_visible(plan.device, devices), **own, **cfg.launcher.server_env}
        procs.append(ProcessSpec("server", i, node, devices, command, env, port=port))
    return procs


def _trainers(cfg, facts, device, slots, base_env) -> list[ProcessSpec]:
    st = parse_parallel(cfg.actor.backend, allowed_backends=("fsdp",))
    world = st.world_size
    la = cfg.launcher
    nodes = la.trainer_n_nodes if cfg.cluster.n_nodes > 1 else 1
    per_node = max(1, world // nodes)
    master = "127.0.0.1" if nodes == 1 else TRAINER_HEAD
    procs = []
    for rank in range(world):
        node, devices = slots.take("trainer", rank, 1, world)
        env = {
            **base_env,
            **_visible(device, devices),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(la.trainer_master_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node),
            **la.trainer_env,
        }
        command = [facts.python, "-m", la.trainer_entry, "--config", base_env["AREAL_CONFIG"]]
        procs.append(ProcessSpec("trainer", rank, node, devices, command, env))
    return procs


def _driver(cfg, facts, base_env) -> ProcessSpec:
    """Inference-only runs: one CPU process that runs the workflow against the servers."""
    env = {**base_env, "CUDA_VISIBLE_DEVICES": "", **cfg.launcher.driver_env}
    command = [facts.python, "-m", cfg.launcher.driver_entry, "--config", base_env["AREAL_CONFIG"]]
    return ProcessSpec("driver", 0, 0, [], command, env)
