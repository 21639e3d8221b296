"""Chaos trials on the CPU demo: kill or stop one process of a real run at a chosen moment, and
check that the run either recovers and completes, or stops cleanly, naming what failed.

    .venv/bin/python scripts/chaos.py --trials 3 --seed 1            # from the repo root
    .venv/bin/python scripts/chaos.py --trials 1 --target server --moment weight_update --signal SIGSTOP

Each trial runs one of six configs small, under its own fileroot (--config): four on CPU,
  demo       tiny_arith_cpu.yaml, batches of 8, fsdp:d2 trainers (the default)
  colocated  the demo time-shared on one device: launcher.colocate=true, synchronous
             (max_head_offpolicyness=0), actor.offload=true, weights through shared memory;
             the server releases its memory while the trainer trains, so a strike lands in a
             release or resume as often as not (one trainer rank: no trainer-1; no server
             restart: a restarted server would miss the tensor updates, so a lost server ends
             the run, named, and the relaunch recovers it)
  workers    the demo with its episodes in a worker process of trainer-0 (workflow.workers=1);
             its reward workers are that process's children
  agent      calculator_agent_cpu.yaml (the OpenAI-API agent through the proxy), fsdp:d2 (no
             reward workers: the agent scores its own episodes; the episodes run in agent worker
             processes of trainer-0, workflow.agent.workers)
and two on one GPU with real SGLang (the one-GPU SmolLM2 recipe, smollm2_gsm8k_1gpu.yaml):
  gpu        asynchronous, server and trainer side by side; weights through disk, so a server that
             launcher.restart_failed_servers restarts loads the current version
  gpu_sync   time-shared and synchronous: SGLang releases its memory while the trainer trains
             (weights through CUDA IPC; no server restart)
with --backend local or ray, and --extra for more overrides (sglang.attention_backend=triton where
FA3 is missing). On the GPU a trial also checks that the device's memory returns to what it was
before the run (nvidia-smi), and, on Ray, that no raylet or GCS server of a local Ray outlives it.
Each run has --steps steps, a checkpoint every 2 steps, launcher.restart_failed_servers (but for
colocated and gpu_sync), a 5 s server health timeout (60 s on the GPU: SGLang's /health stays
silent while it compiles kernels for a new batch shape) and a 10 s launcher.stopped_timeout_s (--stopped-timeout;
evaluation every 2 steps in "evaluation" trials), and picks (or takes as given):

  target   launcher | server | trainer-0 | trainer-1 | reward (a reward worker of trainer-0,
           or of its episode worker) | agent_worker (an agent worker process of trainer-0: its
           proxy, client and agents) | episode_worker (under --config workers: the process that
           runs trainer-0's episodes, with their client of the server)
           | scheduler (SGLang's scheduler process, sglang::scheduler, under server-0's HTTP
           process; the launcher names server-0)
  moment   generation     (right after a step is logged: the next batch is being generated)
           training       (as the PPO update starts: RUN/logs/trainer-K.phase says "step N train")
           weight_update  (right after the trainer logs "weight update vN")
           checkpoint     (as soon as checkpoints/step_N.tmp appears: the write is under way)
           evaluation     (as an evaluation starts: the phase file says "step N eval", N even)
  signal   SIGKILL | SIGSTOP

Targets and moments each go round in a seeded shuffled order (so --trials 5 strikes every kind
of process, --trials 5 every moment), the signal is drawn at random; the same --seed gives the
same trials; targets a config does not have are left out of its rounds. Under --config agent,
striking agent_worker kills or stops the process that runs the agents and their OpenAI proxy
(areal/rollout/episode_workers.py): trainer-0 names it and exits, past launcher.stopped_timeout_s
for a SIGSTOP; striking trainer-0 or the server strikes the agents' episodes mid-call.
The "training" and "evaluation" moments are read from the phase file of trainer-0
(areal/trainer/grpo.py Phases), or of trainer-1 when it is the target.
A SIGSTOPped launcher cannot be noticed by anything of the run (its children keep running and
block once their output pipes fill): the trial resumes it (SIGCONT) after LAUNCHER_HOLD_S and
expects the run to go on, as an operator would.

Every wait has a deadline. The outcome is one of
  completed        the run finished every step by itself (e.g. a server restarted in place; the
                   note says how long the launcher took to notice the fault)
  recovered        it stopped, and a relaunch with recover.mode=auto completed every step
  clean exit       every process of the run exited within 60 s and the error named the target
                   and its log (then relaunched as above: "clean exit, recovered")
  HUNG             no step and no exit for 60 s: a silent hang (the run is then torn down); while
                   the launcher restarts a server, its start may take up to 300 s (SGLang on a
                   GPU takes over a minute)
  orphans          processes of the run outlived it (listed)
and the table says how long from the signal to completion, recovery or exit. A completed or
recovered run must have logged steps 1..N once each in metrics.jsonl and prompts.jsonl.
Processes of a run are found by their AREAL_CONFIG environment (launcher/procs.run_processes).
tests/scripts/test_chaos.py runs 5 seeded trials in CI.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from launcher.procs import run_processes

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("launcher", "server", "scheduler", "trainer-0", "trainer-1", "reward", "agent_worker", "episode_worker")


@dataclass(frozen=True)
class Preset:
    """A config the trials run: its file, run folder, overrides and the targets it has; on the GPU
    (`gpu`) each trial also checks that the device's memory returns to where it was."""

    config: str
    experiment: str
    overrides: tuple[str, ...]
    targets: tuple[str, ...]
    gpu: bool = False
    health_timeout_s: float = 5.0  # launcher.server_health_timeout_s of the runs


# SGLang's first batches of a new shape compile kernels: its /health stays silent for up to minutes
# on cold caches (docs/benchmarks.md, section 9), longer than the CPU presets' 5 s.
GPU_HEALTH_TIMEOUT_S = 60.0
GPU_TARGETS = ("launcher", "server", "scheduler", "trainer-0")


DEMO_OVERRIDES = (
    "train_dataset.batch_size=8",
    "actor.backend=fsdp:d2",
    "cluster.n_gpus_per_node=3",
    "launcher.restart_failed_servers=true",
)

PRESETS = {
    "demo": Preset(
        "tiny_arith_cpu.yaml",
        "tiny_arith_cpu",
        DEMO_OVERRIDES,
        ("launcher", "server", "trainer-0", "trainer-1", "reward"),
    ),
    "colocated": Preset(
        "tiny_arith_cpu.yaml",
        "tiny_arith_cpu",
        (
            "train_dataset.batch_size=8",
            "launcher.colocate=true",
            "cluster.n_gpus_per_node=1",
            "actor.weight_update=tensor",
            "rollout.max_head_offpolicyness=0",
            "actor.offload=true",
            "launcher.restart_failed_servers=false",  # a restarted server would miss tensor updates
        ),
        ("launcher", "server", "trainer-0", "reward"),
    ),
    # the demo with its RLVR episodes in a worker process of trainer-0 (workflow.workers=1): the
    # reward workers are that process's children
    "workers": Preset(
        "tiny_arith_cpu.yaml",
        "tiny_arith_cpu",
        (*DEMO_OVERRIDES, "workflow.workers=1"),
        ("launcher", "server", "trainer-0", "trainer-1", "episode_worker", "reward"),
    ),
    "agent": Preset(
        "calculator_agent_cpu.yaml",
        "calculator_agent_cpu",
        ("actor.backend=fsdp:d2", "cluster.n_gpus_per_node=3", "launcher.restart_failed_servers=true"),
        ("launcher", "server", "trainer-0", "trainer-1", "agent_worker"),
    ),
    # the one-GPU SmolLM2 recipe on SGLang (--extra sglang.attention_backend=triton where FA3 is
    # missing): server and trainer share the device; weights through disk, so a restarted server
    # loads the current version (launcher.restart_failed_servers)
    "gpu": Preset(
        "smollm2_gsm8k_1gpu.yaml",
        "smollm2_gsm8k_1gpu",
        ("actor.weight_update=disk", "launcher.restart_failed_servers=true", "rollout.server=sglang"),
        GPU_TARGETS,
        gpu=True,
        health_timeout_s=GPU_HEALTH_TIMEOUT_S,
    ),
    # the same, time-shared and synchronous: SGLang releases its memory while the trainer trains
    "gpu_sync": Preset(
        "smollm2_gsm8k_1gpu.yaml",
        "smollm2_gsm8k_1gpu",
        (
            "rollout.max_head_offpolicyness=0",
            "actor.offload=true",
            "launcher.restart_failed_servers=false",  # a restarted server would miss tensor updates
            "rollout.server=sglang",
        ),
        GPU_TARGETS,
        gpu=True,
        health_timeout_s=GPU_HEALTH_TIMEOUT_S,
    ),
}
MOMENTS = ("generation", "training", "weight_update", "checkpoint", "evaluation")
SIGNALS = ("SIGKILL", "SIGSTOP")
EXIT_WITHIN_S = 60.0
STALL_S = 60.0  # no new step and no exit for this long: hung
START_DEADLINE_S = 300.0
LAUNCHER_HOLD_S = 15.0  # a SIGSTOPped launcher is resumed after this long
STOPPED_TIMEOUT_S = 10  # launcher.stopped_timeout_s of the trial runs (--stopped-timeout)
EVAL_EVERY = 2  # evaluator.freq_steps of "evaluation" trials


@dataclass
class Trial:
    target: str
    moment: str
    signal: str
    outcome: str = "?"
    seconds: float = float("nan")  # signal -> clean exit, or -> the end of a run that completed by itself
    recovery_s: float = float("nan")  # signal -> a completed run (by itself, or the relaunch's end)
    note: str = ""
    gpu_left_mib: int = 0  # GPU memory still in use after the trial, above what it was before


TRIAL_NAME = "demo"  # every trial's run is ROOT/<experiment>/demo, whatever its config names it


def run_dir_of(root: Path, preset: Preset) -> Path:
    return root / preset.experiment / TRIAL_NAME


def run_env(environ) -> dict[str, str]:
    """A trial run's environment: the caller's, with the repo first on PYTHONPATH and whatever the
    caller's PYTHONPATH held after it (on the device, the folder SGLang was installed to), and no
    OMP_NUM_THREADS (the launcher sets it per process)."""
    env = {**environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))}
    env.pop("OMP_NUM_THREADS", None)
    return env


def launch_args(
    root: Path, steps: int, extra: list[str], eval_every: int | None, preset: Preset, ports: tuple[int, int]
) -> list[str]:
    """The areal-launch command of one trial's run (server and trainer ports given)."""
    return [
        sys.executable,
        "-m",
        "launcher.cli",
        "--config",
        preset.config,
        f"cluster.fileroot={root}",
        f"trial_name={TRIAL_NAME}",
        *preset.overrides,
        f"total_train_steps={steps}",
        "recover.freq_steps=2",
        f"evaluator.freq_steps={eval_every or 'null'}",
        "saver.save_at_end=false",
        "stats_logger.progress_bar=false",
        "stats_logger.plot=false",
        f"launcher.server_health_timeout_s={preset.health_timeout_s:g}",
        "launcher.shutdown_grace_s=3",
        f"launcher.server_base_port={ports[0]}",
        f"launcher.trainer_master_port={ports[1]}",
        *extra,
    ]


class Run:
    """One areal-launch subprocess whose console goes to a file under the trial's folder."""

    def __init__(
        self,
        root: Path,
        steps: int,
        extra: list[str],
        attempt: int,
        eval_every: int | None,
        preset: Preset,
    ):
        from areal.infra.ports import listen_range, next_free_port

        self.root, self.preset = root, preset
        self.run_dir = run_dir_of(root, preset)
        self.console = root / f"console-{attempt}.log"
        start, stop = listen_range()  # below the ephemeral range: CI saw a server's port taken there
        base = next_free_port(start + random.randrange(stop - start - 100), limit=stop)
        ports = (base, next_free_port(base + 10, limit=stop))
        args = launch_args(root, steps, extra, eval_every, preset, ports)
        self.out = open(self.console, "w")
        self.proc = subprocess.Popen(args, cwd=REPO, env=run_env(os.environ), stdout=self.out, stderr=subprocess.STDOUT)

    @property
    def config(self) -> str:
        return str(self.run_dir / "config.yaml")

    def text(self) -> str:
        return self.console.read_text(errors="replace")

    def pid_of(self, name: str) -> int | None:
        found = re.findall(rf"started {name}(?: on \S+)? \(pid (\d+)\)", self.text())  # " on IP": Ray
        return int(found[-1]) if found else None

    def steps(self) -> list[int]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError):
                continue
        return out

    def close(self) -> None:
        self.out.close()


def wait_until(what: str, condition, deadline_s: float, run: Run | None = None):
    """condition()'s first truthy value; raises TimeoutError naming `what` after deadline_s."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            raise RuntimeError(f"the run exited (code {run.proc.returncode}) while waiting for {what}")
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {deadline_s:g} s")


def rank_of(target: str) -> str:
    """The trainer rank whose phase file marks a moment for this target."""
    return "trainer-1" if target == "trainer-1" else "trainer-0"


def at_moment(run: Run, moment: str, after_step: int, target: str = "trainer-0") -> None:
    """Return as soon as the run reaches `moment` (after `after_step` steps are logged)."""
    wait_until(f"step {after_step} in metrics.jsonl", lambda: len(run.steps()) >= after_step, START_DEADLINE_S, run)
    if moment == "generation":
        return
    if moment == "weight_update":
        log = run.run_dir / "logs" / "trainer-0.log"
        seen = len(re.findall(r"weight update v\d+", log.read_text(errors="replace")))
        wait_until(
            "a new 'weight update vN' line in trainer-0.log",
            lambda: len(re.findall(r"weight update v\d+", log.read_text(errors="replace"))) > seen,
            120,
            run,
        )
        return
    if moment in ("training", "evaluation"):
        phase, even = ("train", False) if moment == "training" else ("eval", True)
        marker = run.run_dir / "logs" / f"{rank_of(target)}.phase"

        def started():
            try:
                found = re.fullmatch(r"step (\d+) (\w+)\s*", marker.read_text())
            except OSError:
                return False
            return (
                found
                and found.group(2) == phase
                and int(found.group(1)) > after_step
                and (not even or int(found.group(1)) % EVAL_EVERY == 0)
            )

        wait_until(f"'{phase}' in {marker.name} after step {after_step}", started, 120, run)
        return
    if moment == "checkpoint":
        ckpt = run.run_dir / "checkpoints"
        wait_until(
            "a checkpoint being written (checkpoints/step_N.tmp)",
            lambda: ckpt.exists() and any(p.suffix == ".tmp" for p in ckpt.iterdir()),
            120,
            run,
        )
        return
    raise ValueError(f"--moment {moment!r}: choose one of {MOMENTS}")


def target_pid(run: Run, target: str) -> int:
    if target == "launcher":
        return run.proc.pid
    if target in ("reward", "agent_worker", "episode_worker"):
        # the agent config has no reward workers, so its spawned children are the agent workers;
        # with workflow.workers the trainer's are the episode workers, and the reward workers theirs
        workers = spawned_children(run.pid_of("trainer-0"))
        if target == "reward" and "workflow.workers=1" in run.preset.overrides:
            workers = [child for w in workers for child in spawned_children(w.pid)]
        if not workers:
            raise RuntimeError(f"trainer-0 has no {target.replace('_', ' ')} right now")
        return workers[0].pid
    if target == "scheduler":  # SGLang's scheduler process: a child of its HTTP process (server-0)
        server = run.pid_of("server-0")
        found = [p.pid for p in psutil.Process(server).children(recursive=True) if is_scheduler(p)]
        if not found:
            raise RuntimeError("server-0 has no SGLang scheduler process (sglang::scheduler) right now")
        return found[0]
    name = "server-0" if target == "server" else target
    pid = run.pid_of(name)
    if pid is None:
        raise RuntimeError(f"the launcher's console names no {name}")
    return pid


def spawned_children(pid: int) -> list[psutil.Process]:
    """The multiprocessing children of `pid`: they run spawn_main (the resource tracker does not)."""
    out = []
    for p in psutil.Process(pid).children():
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def is_scheduler(p: psutil.Process) -> bool:
    """SGLang names its scheduler processes sglang::scheduler[_TPk] (setproctitle)."""
    try:
        return p.name().startswith("sglang::sched") or " ".join(p.cmdline()).startswith("sglang::scheduler")
    except psutil.Error:
        return False


def gpu_memory_mib() -> int | None:
    """Memory in use on the device(s), summed over GPUs (nvidia-smi), or None without one."""
    from areal.infra.host import query_gpus

    rows = query_gpus("memory.used", units=False)
    return sum(int(row) for row in rows if row.isdigit()) if rows else None


def ray_leftovers(since: float) -> list[str]:
    """Ray's own processes (a local Ray the launcher started) created after `since` and still
    there: a launcher killed without its teardown leaves them."""
    out = []
    for p in psutil.process_iter(["name", "create_time"]):
        try:
            if p.info["create_time"] >= since and p.info["name"] in ("raylet", "gcs_server"):
                out.append(f"{p.pid} {p.info['name']}")
        except psutil.Error:
            continue
    return out


def leftovers(config: str) -> list[str]:
    out = []
    for p in run_processes(config):
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue
    return out


def kill_run(run: Run) -> None:
    """Tear a hung run down: wake stopped processes, SIGTERM the launcher, SIGKILL what is left."""
    pids = [p.pid for p in run_processes(run.config)]
    if run.proc.poll() is None:
        pids.append(run.proc.pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    if run.proc.poll() is None:
        run.proc.terminate()
        try:
            run.proc.wait(30)
        except subprocess.TimeoutExpired:
            run.proc.kill()
    for p in run_processes(run.config):
        try:
            p.kill()
        except psutil.Error:
            pass


RESTARTING = "; restarting it at "  # launcher/supervisor.py restart_server, as a restart begins
BACK = " is back at "  # and once the restarted server answers /health


def restart_under_way(console: str) -> bool:
    """Whether the launcher has begun a server restart that has not answered yet: while it has,
    no step comes for as long as the server takes to start (SGLang on a GPU: over a minute)."""
    return console.count(RESTARTING) > console.count(BACK)


def restarts_said(console: str) -> str:
    """The launcher's server restarts in a console, in a few words ("" if none): a trial whose
    moment never came on the GPU (2026-12-06) had restarted its server three times first."""
    lines = [line for line in console.splitlines() if RESTARTING in line]
    if not lines:
        return ""
    first = lines[0].removeprefix("[launcher] ").split(RESTARTING)[0]
    return f"; the launcher restarted a server {len(lines)} time(s) before, first: {first}"


def watch(run: Run, steps: int, t_signal: float) -> tuple[str, float, float]:
    """Follow a run after the signal: ('completed'|'exit <code>'|'HUNG', seconds since the signal,
    seconds from the signal to the launcher's first restart, NaN if none). A run is hung after
    STALL_S without a new step, or START_DEADLINE_S while a restarted server starts."""
    last_steps, last_change, restarting, noticed = len(run.steps()), time.monotonic(), False, float("nan")
    while True:
        code = run.proc.poll()
        if code is not None:
            return ("completed" if code == 0 else f"exit {code}"), time.monotonic() - t_signal, noticed
        n, console = len(run.steps()), run.text()
        if math.isnan(noticed) and RESTARTING in console:
            noticed = time.monotonic() - t_signal
        now_restarting = restart_under_way(console)
        if n != last_steps or now_restarting != restarting:
            last_steps, last_change, restarting = n, time.monotonic(), now_restarting
        if time.monotonic() - last_change > (START_DEADLINE_S if restarting else STALL_S):
            return "HUNG", time.monotonic() - t_signal, noticed
        time.sleep(0.1)


def complete(run: Run, steps: int) -> str:
    """'' when metrics.jsonl and prompts.jsonl hold steps 1..steps once each, else what is wrong."""
    from areal.trainer.prompt_log import read_prompts

    logged = [s for s in run.steps() if s > 0]  # step 0: the evaluation before training, if any
    if sorted(logged) != list(range(1, steps + 1)):
        return f"metrics.jsonl steps {logged}"
    prompts = read_prompts(run.run_dir)
    if sorted(prompts) != list(range(1, steps + 1)):
        return f"prompts.jsonl steps {sorted(prompts)}"
    return ""


def trial(
    t: Trial,
    root: Path,
    steps: int,
    kill_after: int,
    relaunch: bool,
    preset: Preset,
    stopped_timeout_s: float,
    overrides: tuple[str, ...] = (),
) -> Trial:
    eval_every = EVAL_EVERY if t.moment == "evaluation" else None
    stopped = [f"launcher.stopped_timeout_s={stopped_timeout_s:g}", *overrides]
    memory_before, started = (gpu_memory_mib() if preset.gpu else None), time.time()
    run = Run(root, steps, stopped, 0, eval_every, preset)
    try:
        at_moment(run, t.moment, kill_after, t.target)
        pid = target_pid(run, t.target)
        sig = getattr(signal, t.signal)
        t_signal = time.monotonic()
        os.kill(pid, sig)
        if t.target == "launcher" and sig == signal.SIGSTOP:
            time.sleep(LAUNCHER_HOLD_S)  # nothing in the run can notice; an operator resumes it
            os.kill(pid, signal.SIGCONT)
            state, seconds, noticed = watch(run, steps, t_signal)
        elif t.target == "launcher" and sig == signal.SIGKILL:
            run.proc.wait(30)
            state, seconds, noticed = "exit -9", time.monotonic() - t_signal, float("nan")
            if not wait_until_empty(run.config):
                seconds = time.monotonic() - t_signal  # until no process of the run is left
        else:
            state, seconds, noticed = watch(run, steps, t_signal)
        text = run.text()
        if sig == signal.SIGSTOP and psutil.pid_exists(pid):
            try:
                os.kill(pid, signal.SIGCONT)  # a stopped process left behind would never exit
            except OSError:
                pass
        if state == "HUNG":
            kill_run(run)
            if restart_under_way(text):
                what, limit = "a restarted server's start", START_DEADLINE_S
            else:
                what, limit = "no step and no exit", STALL_S
            t.outcome, t.seconds, t.note = "HUNG", seconds, f"{what} for {limit:g} s"
            return t
        left = wait_until_empty(run.config) if state != "completed" else []
        if left:
            t.outcome, t.note = "orphans", "; ".join(left)
            kill_run(run)
            return t
        if state == "completed":
            problem = complete(run, steps)
            back = f"restarted in place, {noticed:.1f} s to notice" if BACK in text else "unaffected"
            t.outcome, t.seconds, t.note = ("completed" if not problem else "INCOMPLETE"), seconds, problem or back
            t.recovery_s = seconds if not problem else float("nan")
            return t
        named = {
            "launcher": None,
            "reward": "trainer-0",
            "agent_worker": "trainer-0",
            "episode_worker": "trainer-0",
            "server": "server-0",
            "scheduler": "server-0",  # SGLang's HTTP process exits with its scheduler: the server is named
        }.get(t.target, t.target)
        message = re.search(rf"error: {named} .*; log: \S+", text) if named else True
        if t.target == "launcher":
            exited = "all exited" if seconds <= EXIT_WITHIN_S else "slow exit"
        else:
            exited = "clean exit" if message and seconds <= EXIT_WITHIN_S else f"exit without naming {named}"
        if not relaunch:
            t.outcome, t.seconds, t.note = exited, seconds, f"{state} after {seconds:.1f} s; not relaunched"
            return t
        # relaunch with recover.mode=auto
        again = Run(root, steps, [*stopped, "recover.mode=auto"], 1, eval_every, preset)
        try:
            code = again.proc.wait(START_DEADLINE_S)
        except subprocess.TimeoutExpired:
            kill_run(again)
            code = None
        problem = complete(again, steps) if code == 0 else f"relaunch exit {code}"
        t.outcome = f"{exited}, " + ("recovered" if not problem else "NOT recovered")
        t.seconds = seconds
        t.recovery_s = time.monotonic() - t_signal if not problem else float("nan")
        t.note = problem or f"{state} after {seconds:.1f} s; relaunch completed {steps} steps"
        again.close()
        return t
    except (TimeoutError, RuntimeError) as e:
        t.outcome, t.note = "not delivered", str(e) + restarts_said(run.text())
        kill_run(run)
        return t
    finally:
        run.close()
        left = wait_until_empty(run.config)  # helpers such as torch_shm_manager exit shortly after
        if left:
            t.note += f" [left after the trial: {left}]"
            kill_run(run)
        if "launcher.backend=ray" in overrides and (ray_left := ray_leftovers(started)):
            t.note += f" [Ray processes left: {ray_left}]"
        if memory_before is not None:
            t.gpu_left_mib = gpu_memory_left(memory_before)
            if t.gpu_left_mib:
                t.note += f" [GPU memory: {memory_before} MiB before, {t.gpu_left_mib} MiB more after]"


GPU_SLACK_MIB = 64  # what the driver itself may hold on to after a run


def gpu_memory_left(before: int) -> int:
    """MiB of GPU memory in use above `before` once it settles (0: all given back), waiting up to
    EXIT_WITHIN_S for the driver to release the memory of processes that just exited."""
    deadline = time.monotonic() + EXIT_WITHIN_S
    while True:
        now = gpu_memory_mib()
        extra = 0 if now is None or now <= before + GPU_SLACK_MIB else now - before
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(1.0)


def wait_until_empty(config: str) -> list[str]:
    """Processes of the run still there after EXIT_WITHIN_S ([] once all are gone)."""
    deadline = time.monotonic() + EXIT_WITHIN_S
    while time.monotonic() < deadline:
        left = leftovers(config)
        if not left:
            return []
        time.sleep(0.1)
    return leftovers(config)


def rounds(items: tuple[str, ...], rng: random.Random):
    """items forever, each round in a new shuffled order: n trials strike every item once n >= len."""
    while True:
        order = list(items)
        rng.shuffle(order)
        yield from order


def main(argv: list[str] | None = None) -> int:
    results = run_trials(parse_args(argv))
    print()
    print("| target | moment | signal | outcome | seconds | recovered after | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r.target} | {r.moment} | {r.signal} | {r.outcome} | {r.seconds:.1f} | {r.recovery_s:.1f} | {r.note} |"
        )
    print()
    print("| target | trials | median s to a completed recovery | median s to a clean exit (n) |")
    print("| --- | --- | --- | --- |")
    for target in TARGETS:
        mine = [r for r in results if r.target == target]
        if mine:
            exits = [r.seconds for r in mine if r.outcome != "completed"]
            exit_median = f"{median(exits):.1f} ({len(exits)})" if exits else "-"
            print(f"| {target} | {len(mine)} | {median([r.recovery_s for r in mine]):.1f} | {exit_median} |")
    return 1 if any(failed(r) for r in results) else 0


def median(values: list[float]) -> float:
    """The median of the values that are numbers (nan when there are none)."""
    known = sorted(v for v in values if v == v)
    if not known:
        return float("nan")
    mid = len(known) // 2
    return known[mid] if len(known) % 2 else (known[mid - 1] + known[mid]) / 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10, help="training steps of each run")
    ap.add_argument("--config", choices=tuple(PRESETS), default="demo", help="which config the trials run (PRESETS)")
    ap.add_argument(
        "--stopped-timeout",
        type=float,
        default=STOPPED_TIMEOUT_S,
        help="launcher.stopped_timeout_s of the runs: how long a SIGSTOPped process may stay stopped",
    )
    ap.add_argument("--target", choices=TARGETS)
    ap.add_argument("--moment", choices=MOMENTS)
    ap.add_argument("--signal", choices=SIGNALS)
    ap.add_argument("--root", default="/tmp/areal_chaos", help="each trial runs under ROOT/trial-K")
    ap.add_argument("--backend", choices=("local", "ray"), default="local", help="launcher.backend of the runs")
    ap.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="more overrides for every run (e.g. sglang.attention_backend=triton on a GPU without FA3)",
    )
    ap.add_argument(
        "--no-relaunch",
        action="store_true",
        help="after a clean exit, do not relaunch with recover.mode=auto (quicker: what CI runs; "
        "the resume itself is tested in tests/launcher/test_faults.py)",
    )
    return ap.parse_args(argv)


def failed(r: Trial) -> bool:
    """A trial that hung, left processes, lost or doubled a step, was not recovered, or was never
    delivered (its moment did not come)."""
    return (
        r.outcome.startswith(("HUNG", "orphans", "INCOMPLETE", "not delivered"))
        or "NOT" in r.outcome
        or r.gpu_left_mib > 0
        or "Ray processes left" in r.note
    )


def run_trials(args) -> list[Trial]:
    rng = random.Random(args.seed)
    preset = PRESETS[args.config]
    if args.target and args.target not in preset.targets:
        raise SystemExit(f"--target {args.target}: --config {args.config} has only {', '.join(preset.targets)}")
    targets, moments = rounds(preset.targets, rng), rounds(MOMENTS, rng)
    results = []
    for k in range(args.trials):
        t = Trial(args.target or next(targets), args.moment or next(moments), args.signal or rng.choice(SIGNALS))
        kill_after = rng.randint(2, max(2, args.steps // 2))
        root = Path(args.root) / f"trial-{args.seed}-{k}"
        if root.exists():
            import shutil

            shutil.rmtree(root)
        root.mkdir(parents=True)
        print(f"trial {k}: {t.signal} to {t.target} at {t.moment} after step {kill_after} ({root})", flush=True)
        overrides = (*args.extra, *(["launcher.backend=ray"] if args.backend == "ray" else []))
        results.append(
            trial(t, root, args.steps, kill_after, not args.no_relaunch, preset, args.stopped_timeout, overrides)
        )
        r = results[-1]
        print(f"  -> {r.outcome} ({r.seconds:.1f} s) {r.note}", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
