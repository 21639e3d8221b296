"""Chaos trials on the CPU demo: kill or stop one process of a real run at a chosen moment, and
check that the run either recovers and completes, or stops cleanly, naming what failed.

    .venv/bin/python scripts/chaos.py --trials 3 --seed 1            # from the repo root
    .venv/bin/python scripts/chaos.py --trials 1 --target server --moment weight_update --signal SIGSTOP

Each trial runs `areal-launch --config tiny_arith_cpu.yaml` small (batches of 8, --steps steps,
fsdp:d2 trainers, a checkpoint every 2 steps, launcher.restart_failed_servers=true and a 5 s
server health timeout) under its own fileroot, and picks at random (or as given):

  target   launcher | server | trainer-0 | trainer-1 | reward (a reward worker of trainer-0)
  moment   generation     (right after a step is logged: the next batch is being generated)
           weight_update  (right after the trainer logs "weight update vN")
           checkpoint     (as soon as checkpoints/step_N.tmp appears: the write is under way)
  signal   SIGKILL | SIGSTOP

Every wait has a deadline. The outcome is one of
  completed        the run finished every step by itself (e.g. a server restarted in place)
  recovered        it stopped, and a relaunch with recover.mode=auto completed every step
  clean exit       every process of the run exited within 60 s and the error named the target
                   and its log (then relaunched as above: "clean exit, recovered")
  HUNG             no step and no exit for 60 s: a silent hang (the run is then torn down)
  orphans          processes of the run outlived it (listed)
and the table says how long from the signal to completion, recovery or exit. A completed or
recovered run must have logged steps 1..N once each in metrics.jsonl and prompts.jsonl.
Processes of a run are found by their AREAL_CONFIG environment (launcher/procs.run_processes).
Not covered yet: the moments "training" and "evaluation" (no log line marks them), and agent
processes (an agent runs inside the trainer process; there is no separate one to kill).
"""

from __future__ import annotations

import argparse
import json
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.procs import run_processes  # noqa: E402

TARGETS = ("launcher", "server", "trainer-0", "trainer-1", "reward")
MOMENTS = ("generation", "weight_update", "checkpoint")
SIGNALS = ("SIGKILL", "SIGSTOP")
EXIT_WITHIN_S = 60.0
STALL_S = 60.0  # no new step and no exit for this long: hung
START_DEADLINE_S = 300.0


@dataclass
class Trial:
    target: str
    moment: str
    signal: str
    outcome: str = "?"
    seconds: float = float("nan")
    note: str = ""


class Run:
    """One areal-launch subprocess whose console goes to a file under the trial's folder."""

    def __init__(self, root: Path, steps: int, extra: list[str], attempt: int):
        from areal.infra.ports import next_free_port

        self.root = root
        self.run_dir = root / "tiny_arith_cpu" / "demo"
        self.console = root / f"console-{attempt}.log"
        base = next_free_port(20000 + random.randrange(30000))
        args = [
            sys.executable,
            "-m",
            "launcher.cli",
            "--config",
            "tiny_arith_cpu.yaml",
            f"cluster.fileroot={root}",
            "train_dataset.batch_size=8",
            f"total_train_steps={steps}",
            "actor.backend=fsdp:d2",
            "cluster.n_gpus_per_node=3",
            "recover.freq_steps=2",
            "evaluator.freq_steps=null",
            "saver.save_at_end=false",
            "stats_logger.progress_bar=false",
            "stats_logger.plot=false",
            "launcher.restart_failed_servers=true",
            "launcher.server_health_timeout_s=5",
            "launcher.shutdown_grace_s=3",
            f"launcher.server_base_port={base}",
            f"launcher.trainer_master_port={next_free_port(base + 10)}",
            *extra,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("OMP_NUM_THREADS", None)
        self.out = open(self.console, "w")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    @property
    def config(self) -> str:
        return str(self.run_dir / "config.yaml")

    def text(self) -> str:
        return self.console.read_text(errors="replace")

    def pid_of(self, name: str) -> int | None:
        found = re.findall(rf"started {name} \(pid (\d+)\)", self.text())
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


def at_moment(run: Run, moment: str, after_step: int) -> None:
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
    if target == "reward":
        trainer = run.pid_of("trainer-0")
        # spawned pool workers run spawn_main (the resource tracker, also a child, does not)
        workers = [p for p in psutil.Process(trainer).children() if "spawn_main" in " ".join(p.cmdline())]
        if not workers:
            raise RuntimeError("trainer-0 has no reward worker right now")
        return workers[0].pid
    name = "server-0" if target == "server" else target
    pid = run.pid_of(name)
    if pid is None:
        raise RuntimeError(f"the launcher's console names no {name}")
    return pid


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


def watch(run: Run, steps: int, t_signal: float) -> tuple[str, float]:
    """Follow a run after the signal: ('completed'|'exit <code>'|'HUNG', seconds since the signal)."""
    last_steps, last_change = len(run.steps()), time.monotonic()
    while True:
        code = run.proc.poll()
        if code is not None:
            return ("completed" if code == 0 else f"exit {code}"), time.monotonic() - t_signal
        n = len(run.steps())
        if n != last_steps:
            last_steps, last_change = n, time.monotonic()
        if time.monotonic() - last_change > STALL_S:
            return "HUNG", time.monotonic() - t_signal
        time.sleep(0.1)


def complete(run: Run, steps: int) -> str:
    """'' when metrics.jsonl and prompts.jsonl hold steps 1..steps once each, else what is wrong."""
    from areal.trainer.prompt_log import read_prompts

    logged = run.steps()
    if sorted(logged) != list(range(1, steps + 1)):
        return f"metrics.jsonl steps {logged}"
    prompts = read_prompts(run.run_dir)
    if sorted(prompts) != list(range(1, steps + 1)):
        return f"prompts.jsonl steps {sorted(prompts)}"
    return ""


def trial(t: Trial, root: Path, steps: int, kill_after: int) -> Trial:
    run = Run(root, steps, [], 0)
    try:
        at_moment(run, t.moment, kill_after)
        pid = target_pid(run, t.target)
        sig = getattr(signal, t.signal)
        t_signal = time.monotonic()
        os.kill(pid, sig)
        if t.target == "launcher" and sig == signal.SIGKILL:
            run.proc.wait(30)
            state, seconds = "exit -9", time.monotonic() - t_signal
            if not wait_until_empty(run.config):
                seconds = time.monotonic() - t_signal  # until no process of the run is left
        else:
            state, seconds = watch(run, steps, t_signal)
        text = run.text()
        if sig == signal.SIGSTOP and psutil.pid_exists(pid):
            try:
                os.kill(pid, signal.SIGCONT)  # a stopped process left behind would never exit
            except OSError:
                pass
        if state == "HUNG":
            kill_run(run)
            t.outcome, t.seconds, t.note = "HUNG", seconds, f"no step and no exit for {STALL_S:g} s"
            return t
        left = wait_until_empty(run.config) if state != "completed" else []
        if left:
            t.outcome, t.note = "orphans", "; ".join(left)
            kill_run(run)
            return t
        if state == "completed":
            problem = complete(run, steps)
            back = "restarted in place" if re.search(r"is back at", text) else "unaffected"
            t.outcome, t.seconds, t.note = ("completed" if not problem else "INCOMPLETE"), seconds, problem or back
            return t
        named = {"launcher": None, "reward": "trainer-0", "server": "server-0"}.get(t.target, t.target)
        message = re.search(rf"error: {named} .*; log: \S+", text) if named else True
        if t.target == "launcher":
            exited = "all exited" if seconds <= EXIT_WITHIN_S else "slow exit"
        else:
            exited = "clean exit" if message and seconds <= EXIT_WITHIN_S else f"exit without naming {named}"
        # relaunch with recover.mode=auto
        again = Run(root, steps, ["recover.mode=auto"], 1)
        try:
            code = again.proc.wait(START_DEADLINE_S)
        except subprocess.TimeoutExpired:
            kill_run(again)
            code = None
        problem = complete(again, steps) if code == 0 else f"relaunch exit {code}"
        t.outcome = f"{exited}, " + ("recovered" if not problem else "NOT recovered")
        t.seconds = seconds
        t.note = problem or f"{state} after {seconds:.1f} s; relaunch completed {steps} steps"
        again.close()
        return t
    except (TimeoutError, RuntimeError) as e:
        t.outcome, t.note = "not delivered", str(e)
        kill_run(run)
        return t
    finally:
        run.close()
        left = leftovers(run.config)
        if left:
            t.note += f" [left after the trial: {left}]"
            kill_run(run)


def wait_until_empty(config: str) -> list[str]:
    """Processes of the run still there after EXIT_WITHIN_S ([] once all are gone)."""
    deadline = time.monotonic() + EXIT_WITHIN_S
    while time.monotonic() < deadline:
        left = leftovers(config)
        if not left:
            return []
        time.sleep(0.2)
    return leftovers(config)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10, help="training steps of each run")
    ap.add_argument("--target", choices=TARGETS)
    ap.add_argument("--moment", choices=MOMENTS)
    ap.add_argument("--signal", choices=SIGNALS)
    ap.add_argument("--root", default="/tmp/areal_chaos", help="each trial runs under ROOT/trial-K")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    results = []
    for k in range(args.trials):
        t = Trial(
            args.target or rng.choice(TARGETS), args.moment or rng.choice(MOMENTS), args.signal or rng.choice(SIGNALS)
        )
        kill_after = rng.randint(2, max(2, args.steps // 2))
        root = Path(args.root) / f"trial-{args.seed}-{k}"
        if root.exists():
            import shutil

            shutil.rmtree(root)
        root.mkdir(parents=True)
        print(f"trial {k}: {t.signal} to {t.target} at {t.moment} after step {kill_after} ({root})", flush=True)
        results.append(trial(t, root, args.steps, kill_after))
        r = results[-1]
        print(f"  -> {r.outcome} ({r.seconds:.1f} s) {r.note}", flush=True)
    print()
    print("| target | moment | signal | outcome | seconds | note |\n| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r.target} | {r.moment} | {r.signal} | {r.outcome} | {r.seconds:.1f} | {r.note} |")
    bad = [r for r in results if r.outcome.startswith(("HUNG", "orphans", "INCOMPLETE")) or "NOT" in r.outcome]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
