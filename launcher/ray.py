"""The Ray backend: run a LaunchPlan on a Ray cluster.

    areal-launch --config gsm8k_grpo.yaml launcher.backend=ray launcher.ray_address=auto

Connects to `launcher.ray_address` (or starts a local Ray), reserves one placement group whose
bundles are the plan's nodes (each bundle holds the CPUs/GPUs of every process planned on that
node; STRICT_SPREAD puts each plan node on its own Ray node, and each process is pinned to its
node's bundle), then runs every process through a small actor on that node (`ProcessHost`): the
actor starts the command as a subprocess (own session), picks free ports on its node, probes
/health there, and hands output back to the launcher, which writes `{run_dir}/logs/<name>.log`
and the `[name]` console view. Trainers get MASTER_ADDR = the IP of the node of trainer rank 0.
Server addresses are published in the run's file record and in AREAL_SERVER_ADDRS, as on the
local backend.

The project must be importable on every Ray node (installed, or the same checkout path), since
actors import `launcher` and processes run `python -m ...` from the launcher's directory.
An actor whose Ray worker dies before it ran is replaced once (ACTOR_START_ATTEMPTS).
Teardown stops every subprocess tree through its actor, kills the actors and removes the
placement group, on success, failure, Ctrl-C or SIGTERM alike.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections import deque
from pathlib import Path

from areal.config import ExperimentConfig

from .console import console_program, process_console
from .plan import TRAINER_HEAD, LaunchPlan, ProcessSpec
from .procs import (
    LaunchError,
    ManagedProcess,
    advertised_host,
    child_env,
    next_free_port,
    start_banner,
    with_port,
)
from .supervisor import Supervisor, TreeCheck, compiler_in_tree, log_path, say

PLACEMENT_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 60.0  # one actor call (actor start-up included)
ACTOR_START_ATTEMPTS = 2  # an actor whose Ray worker crashed before it ran is replaced once
# A Ray the launcher starts itself has no dashboard, so nothing reads its metrics. Collecting them
# anyway costs each worker an OpenTelemetry reader thread, and in Ray 2.60 that thread can segfault
# a worker that is just creating an actor (seen once in CI: "ActorDiedError ... never ran", SIGSEGV
# in TemporalMetricStorage::buildMetrics). enable_metrics_collection alone keeps the thread.
LOCAL_RAY_OPTIONS = {
    "include_dashboard": False,
    "_system_config": {"enable_metrics_collection": False, "enable_open_telemetry": False},
}


def local_ray_options(plan: LaunchPlan) -> dict:
    """ray.init's options for a Ray the launcher starts for this run alone (launcher.ray_address
    null): always a new instance ("local": Ray would otherwise join the cluster a `ray start` on
    this machine left running, and refuse these options there), with as many logical CPUs as the
    plan reserves where the machine has fewer. Ray's CPUs only count reservations, and the local
    backend runs the same processes on those cores anyway: the CPU demo (a server and two trainer
    ranks, 3 CPUs) runs on a 2-core machine either way."""
    bundles, _ = node_bundles(plan)
    need = max((b.get("CPU", 0.0) for b in bundles), default=0.0)  # a local Ray is one node
    return {**LOCAL_RAY_OPTIONS, "address": "local", "num_cpus": max(os.cpu_count() or 1, math.ceil(need))}


def run_ray(plan: LaunchPlan, cfg: ExperimentConfig) -> int:
    import ray

    address = cfg.launcher.ray_address
    say(f"connecting to Ray at {address}" if address else "starting a local Ray instance")
    options = {"address": address} if address else local_ray_options(plan)
    try:
        ray.init(log_to_driver=False, **options)
    except (ConnectionError, RuntimeError, ValueError) as e:
        if address:
            fix = (
                f"cannot connect to Ray at launcher.ray_address={address!r}: {e}\nfix: start the cluster "
                "(ray start --head) or set launcher.ray_address to its address (null starts a local Ray)"
            )
        else:
            fix = (
                f"cannot start a local Ray (launcher.ray_address=null): {e}\nfix: see Ray's logs under "
                "/tmp/ray/session_latest/logs, or start a cluster and set launcher.ray_address to its address"
            )
        print(f"error: {fix}", file=sys.stderr)
        return 1
    try:
        return RayRun(plan, cfg).execute()
    finally:
        ray.shutdown()


def process_resources(spec: ProcessSpec, plan: LaunchPlan) -> dict[str, float]:
    """What one process reserves: a CPU, and its GPUs on CUDA plans. Processes that share a device
    (a colocated plan) each reserve their share of it, so Ray gives them the same GPU."""
    res = {"CPU": 1.0}
    if plan.device == "cuda" and spec.devices:
        sharing = device_sharing(plan)
        res["GPU"] = sum(1.0 / sharing[(spec.node, d)] for d in spec.devices)
    return res


def device_sharing(plan: LaunchPlan) -> dict[tuple[int, int], int]:
    """(node, device) -> how many of the plan's processes use that device."""
    count: dict[tuple[int, int], int] = {}
    for p in plan.processes:
        for d in p.devices:
            count[(p.node, d)] = count.get((p.node, d), 0) + 1
    return count


def node_bundles(plan: LaunchPlan) -> tuple[list[dict[str, float]], dict[int, int]]:
    """One bundle per plan node (sum of its processes' resources) and plan node -> bundle index."""
    nodes = sorted({p.node for p in plan.processes})
    index = {node: i for i, node in enumerate(nodes)}
    bundles: list[dict[str, float]] = [{} for _ in nodes]
    for p in plan.processes:
        for key, value in process_resources(p, plan).items():
            b = bundles[index[p.node]]
            b[key] = b.get(key, 0.0) + value
    return bundles, index


def _worker_death(err: Exception) -> str:
    """'worker pid 9606, exit type SYSTEM_ERROR' from Ray's ActorDiedError text."""
    text = str(err)
    pid = re.search(r"\bpid: (\d+)", text)
    kind = re.search(r"Worker exit type: (\w+)", text)
    return f"worker pid {pid[1] if pid else '?'}, exit type {kind[1] if kind else 'unknown'}"


def _not_importable(err: Exception) -> LaunchError:
    return LaunchError(
        f"the Ray actors that run the processes did not start ({type(err).__name__}: {err}); "
        "the project must be importable on every Ray node"
    )


def _kill_quietly(actor) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except ray.exceptions.RayError:
        pass


class ProcessHost:
    """Ray actor that runs one plan process as a subprocess on the node it was placed on."""

    def __init__(self, name: str):
        self.name = name
        self.proc: ManagedProcess | None = None
        self.lines: deque[str] = deque()
        self._stopped = TreeCheck()
        self._compiler = TreeCheck(compiler_in_tree)

    def node(self) -> dict:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self, port: int, avoid: list[int]) -> int:
        return next_free_port(port, set(avoid))

    def start(self, command: list[str], env: dict[str, str], cwd: str, cpu: bool, procs_on_node: int) -> int:
        """Start the command; env is the plan's plus the launcher's additions.

        Ray sets OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES for its workers; the plan decides both
        here (CUDA_VISIBLE_DEVICES comes from the GPUs Ray assigned to this actor).
        """
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
        if os.path.isdir(cwd):
            base["PYTHONPATH"] = os.pathsep.join(filter(None, [cwd, base.get("PYTHONPATH")]))
        full = child_env(env, {}, cpu=cpu, procs_on_node=procs_on_node, base=base)
        if self.proc is not None:  # a restart: clear what is left of the previous run
            self.proc.stop(grace_s=1.0, mute=False)
        self.proc = ManagedProcess(
            self.name, command, full, cwd=cwd if os.path.isdir(cwd) else None, sink=self.lines.append
        )
        return self.proc.pid

    def drain(self) -> tuple[list[str], int | None, str | None]:
        """New output lines, the exit status (None while running; output complete once it exited)
        and which process of its tree is in the stopped state (launcher.stopped_timeout_s;
        supervisor.stopped_in_tree)."""
        code = self.proc.poll() if self.proc else None
        if code is not None:
            self.proc.wait_output()
        running = code is None and self.proc is not None
        return self._take(), code, self._stopped(self.proc.pid) if running else None

    def compiling(self) -> str | None:
        """Which compiler runs in the process's tree (supervisor.compiler_in_tree), if one does."""
        running = self.proc is not None and self.proc.poll() is None
        return self._compiler(self.proc.pid) if running else None

    def healthy(self, addr: str) -> bool:
        from areal.infra.health import is_healthy

        return is_healthy(addr, timeout=1.0)

    def stop(self, grace_s: float) -> list[str]:
        if self.proc is not None:
            self.proc.stop(grace_s, mute=False)  # the launcher mutes the console (RemoteProcess.mute)
        return self._take()

    def _take(self) -> list[str]:
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out


class RemoteProcess:
    """Launcher-side handle of a process run by a ProcessHost: writes its log and console lines."""

    def __init__(self, name: str, actor, log_file: str, command: list[str], program: str | None = None):
        self.name = name
        self.actor = actor
        self.log_path = log_file
        self.returncode: int | None = None
        self.stopped: str | None = None  # at the last drain: supervisor.stopped_in_tree of it
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_file, "a", buffering=1, encoding="utf-8", errors="replace")
        self._log.write(start_banner(name, command) + "\n")
        self._console = process_console(name, program)
        self._muted = False

    def mute(self) -> None:
        """Keep its lines out of the console from now on (the log still gets them): the launcher
        is stopping it."""
        self._muted = True

    def take(self, lines: list[str], code: int | None = None, stopped: str | None = None) -> None:
        self.stopped = stopped
        for line in lines:
            if not self._log.closed:
                self._log.write(line + "\n")
            if not self._muted:
                self._console(line)
        if code is not None and self.returncode is None:
            self.returncode = code

    def poll(self) -> int | None:
        return self.returncode

    def wait_output(self) -> None:
        """Output is complete once drain reported the exit status (the actor waited for it)."""

    def close(self) -> None:
        self._log.close()


class RayRun(Supervisor):
    """Places the plan's nodes on Ray nodes and runs each process through a ProcessHost actor."""

    procs: dict[str, RemoteProcess]

    def __init__(self, plan: LaunchPlan, cfg: ExperimentConfig):
        super().__init__(plan, cfg)
        self.pg = None
        self.actors: dict[str, object] = {}
        self.nodes: dict[str, dict] = {}  # process name -> ProcessHost.node()

    # -- placement ----------------------------------------------------------------------------

    def prepare(self) -> None:
        self._reserve()
        self._create_actors()
        self._assign_ports()
        self._check_reachability()

    def _reserve(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        bundles, _ = node_bundles(self.plan)
        strategy = "STRICT_SPREAD" if len(bundles) > 1 else "PACK"
        say(f"reserving {len(bundles)} Ray node(s) ({strategy}): {bundles}")
        self.pg = placement_group(bundles, strategy=strategy, name=f"areal-{self.cfg.trial_name}")
        if not self.pg.wait(PLACEMENT_TIMEOUT_S):
            where = "each on its own node" if strategy == "STRICT_SPREAD" else "on one node"
            raise LaunchError(
                f"the Ray cluster cannot place {len(bundles)} node(s) of {bundles} ({strategy}: {where}) "
                f"within {PLACEMENT_TIMEOUT_S:g} s; it has "
                f"{len([n for n in ray.nodes() if n.get('Alive')])} live node(s) with "
                f"{ray.available_resources()} free. Add nodes, or lower launcher.trainer_n_nodes / "
                "launcher.rollout_n_nodes / the parallel degrees"
            )

    def _create_actors(self) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        host = ray.remote(ProcessHost)
        _, index = node_bundles(self.plan)
        specs = {p.name: p for p in self.plan.processes}

        def new_actor(spec: ProcessSpec):
            res = process_resources(spec, self.plan)
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=index[spec.node]
            )
            return host.options(
                num_cpus=res["CPU"], num_gpus=res.get("GPU", 0), max_restarts=0, scheduling_strategy=strategy
            ).remote(spec.name)

        pending = list(specs)
        for attempt in range(1, ACTOR_START_ATTEMPTS + 1):
            for name in pending:
                if name in self.actors:  # its worker crashed: let Ray forget the dead actor
                    _kill_quietly(self.actors[name])
                self.actors[name] = new_actor(specs[name])
            crashed = self._await_actors(pending)
            if not crashed:
                break
            for name, err in crashed.items():
                what = f"{name}: the Ray worker of its actor died before the actor ran ({_worker_death(err)})"
                if attempt == ACTOR_START_ATTEMPTS:
                    raise LaunchError(
                        f"{what}, on each of {ACTOR_START_ATTEMPTS} attempts: {err}\nRay's logs on that node "
                        "(/tmp/ray/session_latest/logs, the worker-*.err file with the pid above) say why"
                    )
                say(f"{what}; starting another (attempt {attempt + 1} of {ACTOR_START_ATTEMPTS})", sys.stderr)
            pending = list(crashed)
        for node in sorted({p.node for p in self.plan.processes}):
            members = [p.name for p in self.plan.processes if p.node == node]
            info = self.nodes[members[0]]
            say(f"plan node {node} -> Ray node {info['node_id'][:12]} ({info['ip']}): {', '.join(members)}")

    def _await_actors(self, names: list[str]) -> dict[str, Exception]:
        """Each actor's first call (node()), which waits for its start: fills self.nodes and returns
        the actors whose Ray worker died before they ran (a system error, worth one more try).
        Any other failure ends the launch."""
        import ray

        refs = {self.actors[n].node.remote(): n for n in names}
        _, late = ray.wait(list(refs), num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        if late:
            raise LaunchError(
                f"the Ray actors that run {', '.join(refs[r] for r in late)} did not start within "
                f"{CALL_TIMEOUT_S:g} s; see `ray status` for the cluster's state"
            )
        crashed = {}
        for ref, name in refs.items():
            try:
                self.nodes[name] = ray.get(ref)
            except ray.exceptions.ActorDiedError as e:
                if e.actor_init_failed:
                    raise _not_importable(e) from None
                crashed[name] = e
            except ray.exceptions.RayError as e:
                raise _not_importable(e) from None
        return crashed

    def _assign_ports(self) -> None:
        """Free ports are a property of the node: each server's actor checks its own node."""
        import ray

        taken: dict[str, set[int]] = {}  # Ray node id -> ports given out there
        servers = self.plan.by_role("server")
        planned = {s.port for s in servers if s.port}
        for s in servers:
            node_taken = taken.setdefault(self.nodes[s.name]["node_id"], set())
            avoid = sorted(node_taken | (planned - {s.port}))
            port = ray.get(self.actors[s.name].free_port.remote(s.port, avoid), timeout=CALL_TIMEOUT_S)
            if port != s.port:
                say(f"{s.name}: port {s.port} is in use on its node; using {port}")
                s.port, s.command = port, with_port(s.command, port)
            node_taken.add(port)
        trainers = self.plan.by_role("trainer")
        if not trainers:
            return
        head = self.nodes[trainers[0].name]
        want = int(trainers[0].env["MASTER_PORT"])
        avoid = sorted(taken.get(head["node_id"], set()))
        port = ray.get(self.actors[trainers[0].name].free_port.remote(want, avoid), timeout=CALL_TIMEOUT_S)
        if port != want:
            say(f"MASTER_PORT {want} is in use on trainer-0's node; using {port}")
        for t in trainers:
            t.env["MASTER_PORT"] = str(port)
            if t.env.get("MASTER_ADDR") == TRAINER_HEAD:
                t.env["MASTER_ADDR"] = head["ip"]

    def _check_reachability(self) -> None:
        """Warn when a server listens on loopback but processes on other machines need it."""
        ips = {info["ip"] for info in self.nodes.values()}
        for s in self.plan.by_role("server"):
            if len(ips) > 1 and advertised_host(s.command).startswith("127."):
                say(
                    f"warning: {s.name} listens on {advertised_host(s.command)} only, but the run spans "
                    f"{len(ips)} machines; set sglang.host=0.0.0.0 so the trainers can reach it",
                    sys.stderr,
                )

    # -- processes ----------------------------------------------------------------------------

    def start(self, spec: ProcessSpec, extra: dict[str, str]) -> RemoteProcess:
        import ray

        info = self.nodes[spec.name]
        env = {**spec.env, **extra, "AREAL_RAY_NODE_ID": info["node_id"], "AREAL_NODE_IP": info["ip"]}
        if self.plan.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(info["gpu_ids"])
        if "OMP_NUM_THREADS" in os.environ:  # the user's choice travels to every node
            env.setdefault("OMP_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
        on_node = sum(1 for p in self.plan.processes if p.node == spec.node)
        actor = self.actors[spec.name]
        if spec.name in self.procs:  # a restart: what the old one prints while stopped is no news
            self.retire(spec.name)
        pid = ray.get(
            actor.start.remote(spec.command, env, os.getcwd(), self.plan.device == "cpu", on_node),
            timeout=CALL_TIMEOUT_S,
        )
        proc = RemoteProcess(
            spec.name, actor, log_path(self.plan, spec), spec.command, console_program(self.plan, spec)
        )
        self.procs[spec.name] = proc
        say(f"started {spec.name} on {info['ip']} (pid {pid}); log: {proc.log_path}")
        return proc

    def retire(self, name: str) -> None:
        """Stop the process a restart replaces (a hung one still holds its port), its last lines
        to its log only, and close that log: the actor's queue would hand them to the new one,
        SGLang's "crashed with exit code -15" among them."""
        import ray

        old = self.procs[name]
        old.mute()
        grace = self.cfg.launcher.shutdown_grace_s
        try:
            lines = ray.get(self.actors[name].stop.remote(grace), timeout=grace + CALL_TIMEOUT_S)
        except ray.exceptions.RayError:
            lines = []
        old.take(lines)
        old.close()

    def server_addrs(self, servers: list[ProcessSpec]) -> dict[str, str]:
        return {s.name: f"{advertised_host(s.command, self.nodes[s.name]['ip'])}:{s.port}" for s in servers}

    def probe(self, name: str, addr: str) -> bool:
        """Probe from the server's own node: the launcher's machine may not reach it directly."""
        import ray

        return ray.get(self.actors[name].healthy.remote(addr), timeout=CALL_TIMEOUT_S)

    def refresh(self) -> None:
        import ray

        running = {n: p for n, p in self.procs.items() if p.returncode is None}
        calls = {n: p.actor.drain.remote() for n, p in running.items()}
        for name, ref in calls.items():
            try:
                lines, code, stopped = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayError as e:  # the actor (or its node) died
                say(f"the Ray actor running {name} died: {type(e).__name__}: {e}", sys.stderr)
                lines, code, stopped = [], 1, None
            running[name].take(lines, code, stopped)

    def stopped(self, name: str) -> str | None:
        return self.procs[name].stopped

    def compiling(self, name: str) -> str | None:
        import ray

        try:
            return ray.get(self.actors[name].compiling.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayError:
            return None

    def teardown(self) -> None:
        import ray

        running = [n for n, p in self.procs.items() if p.returncode is None]
        if running:
            say(f"stopping {len(running)} process(es): " + ", ".join(running))
        for name in running:
            self.procs[name].mute()
        grace = self.cfg.launcher.shutdown_grace_s
        calls = {n: a.stop.remote(grace) for n, a in self.actors.items()}
        for name, ref in calls.items():
            try:
                lines = ray.get(ref, timeout=grace + 15)
            except ray.exceptions.RayError:
                lines = []
            if name in self.procs:
                self.procs[name].take(lines)
        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        for proc in self.procs.values():
            proc.close()
