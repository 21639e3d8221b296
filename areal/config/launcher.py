"""How processes are started: backend, node split between trainer and rollout, env, timeouts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from .base import Section

# launcher/procs.py child_env; why 1 on GPU: docs/benchmarks.md section 4
_OMP_DEFAULT = (
    "OMP_NUM_THREADS, unless set here or in the launcher's environment: 1 on GPU, the node's cores shared out on CPU."
)


def _env_text(value):
    """Environment values are text; `+launcher.trainer_env.X=1` arrives from Hydra as an int."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value) if isinstance(value, (int, float)) else value


EnvVars = dict[str, Annotated[str, BeforeValidator(_env_text)]]


class LauncherConfig(Section):
    backend: Literal["local", "ray"] = Field(
        "local", description="'local' runs subprocesses on this machine; 'ray' places them on a Ray cluster."
    )
    ray_address: str | None = Field(
        None, description="Ray cluster to join (e.g. 'ray://head:10001' or 'auto'); None starts a local Ray."
    )
    trainer_n_nodes: int = Field(
        1,
        ge=0,
        description="Nodes for trainer workers; 0 gives an inference-only debug run (servers + rollout driver).",
    )
    rollout_n_nodes: int = Field(
        1,
        ge=0,
        description="Nodes for inference servers; 0 gives a trainer-only run against rollout.server_addrs "
        "or rollout.replay_path.",
    )
    colocate: bool = Field(
        False,
        description="Servers and trainer workers share the same devices (AReaL's allocation writes it "
        "'sglang:d1|fsdp:d1'): one GPU runs both, the plan needs max(rollout, trainer) devices instead of "
        "their sum. sglang.mem_fraction_static is the servers' share of each device; with "
        "sglang.enable_memory_saver a synchronous run time-shares the device instead (the servers release "
        "their memory while the trainer trains). The trainer's CUDA allocator then uses expandable segments "
        "unless PYTORCH_CUDA_ALLOC_CONF is set (launcher.trainer_env or the environment). Single-node runs only.",
    )
    mps: bool = Field(
        False,
        description="Colocated CUDA runs: start an NVIDIA MPS control daemon (nvidia-cuda-mps-control, from the "
        "driver's utilities) for the run, so the kernels of the servers and the trainer workers that share a GPU "
        "run at the same time instead of taking turns in time slices. Local backend; the launcher warns when "
        "no process attached (CUDA then runs them without MPS).",
    )
    mps_server_sm_percent: int | None = Field(
        None,
        ge=1,
        le=100,
        description="With launcher.mps: the share of each GPU's multiprocessors that a server may use "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), leaving the rest to training; null: all of them.",
    )
    mps_server_priority: Literal["normal", "below_normal"] = Field(
        "normal",
        description="With launcher.mps: the servers' MPS client priority (CUDA_MPS_CLIENT_PRIORITY, 0 or 1). "
        "below_normal asks MPS to run the trainer's ready work before the servers' (the trainer sets the "
        "pace of an asynchronous step); normal: the same priority as the trainer.",
    )
    server_env: EnvVars = Field(
        default_factory=dict, description="Extra environment for inference servers. " + _OMP_DEFAULT
    )
    trainer_env: EnvVars = Field(
        default_factory=dict, description="Extra environment for trainer workers. " + _OMP_DEFAULT
    )
    driver_env: EnvVars = Field(default_factory=dict, description="Extra environment for the rollout driver.")
    server_base_port: int = Field(
        30000,
        ge=1024,
        le=65000,
        description="First server port; server i uses base + i (the local backend moves past ports in use).",
    )
    trainer_master_port: int = Field(
        29500, ge=1024, le=65535, description="torch.distributed rendezvous port of trainer rank 0."
    )
    server_startup_timeout_s: float = Field(
        600.0, gt=0, description="Seconds to wait for every server's /health before giving up."
    )
    server_health_timeout_s: float | None = Field(
        300.0,
        gt=0,
        description="While the run goes on, a server whose /health stays unanswered this long (hung, "
        "stopped) fails the run, or is restarted with launcher.restart_failed_servers; null disables "
        "the check. Until a trainer rank begins its first step the servers are still starting (the "
        "warm-up compiles SGLang's kernels) and launcher.server_startup_timeout_s applies where longer; "
        "so it does, at any time, while a compiler (ninja, nvcc, ptxas, ...) runs in the server's process "
        "tree. Raise it where weight loads block /health for longer.",
    )
    stopped_timeout_s: float | None = Field(
        60.0,
        gt=0,
        description="A process of the run (trainer rank, driver, server) that stays in the stopped state "
        "(SIGSTOP; not a debugger's tracing stop) this long fails the run, naming it (a server is restarted "
        "instead with launcher.restart_failed_servers; a server stopped before it first answers /health fails "
        "the start); null disables the check. Local backend, and the Ray backend through each process's actor.",
    )
    trainer_phase_timeout_s: float | None = Field(
        7200.0,
        gt=0,
        description="A trainer rank whose phase (RUN/logs/trainer-K.phase: step N rollout, train, eval, ...) "
        "stays the same this long fails the run, naming the rank and the phase; the console names it at "
        "half (from the rank's first phase on: start-up is not watched). It ends a hang no other deadline "
        "sees: a rank of a one-rank run blocked without being stopped. It must exceed the slowest phase "
        "(a rollout may wait rollout.request_timeout_s); null disables the check.",
    )
    shutdown_grace_s: float = Field(
        10.0, gt=0, description="Seconds between SIGTERM and SIGKILL when stopping processes."
    )
    inference_only_batches: int = Field(
        2, ge=1, description="Batches the rollout driver generates in an inference-only run."
    )
    keep_servers: bool = Field(
        False,
        description="Inference-only runs: keep servers up after the driver and print their addresses "
        "for manual debugging (Ctrl-C stops them).",
    )
    restart_failed_servers: bool = Field(
        False,
        description="Fault tolerance: restart a server that dies or hangs (up to 3 times each), loading the "
        "trainer's last disk weight update (actor.weight_update=disk) so it serves the current weights; "
        "clients retry connection errors for up to launcher.server_startup_timeout_s meanwhile.",
    )
    trainer_entry: str = Field(
        "areal.trainer.main", description="Python module run (python -m) by each trainer worker."
    )
    driver_entry: str = Field(
        "areal.trainer.driver", description="Python module run by the rollout driver of inference-only runs."
    )
