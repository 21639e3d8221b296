"""The limits of a process that holds many sockets: its listen queue and its open files (torch-free).

A server whose clients connect in a burst (hundreds of agent calls at the start of a step) needs a
listen backlog as deep as the burst: when the accept queue overflows, the kernel answers with SYN
cookies, and a connection whose first data segment was dropped fails the cookie check and is reset
before the server ever sees it. The kernel caps every backlog at net.core.somaxconn, silently, so
`listen_backlog` warns when that cap is below the concurrency.

Every socket is a file descriptor. A process raises its soft RLIMIT_NOFILE to the hard limit at
start (`raise_open_file_limit`), and when even the hard limit cannot hold what the configuration
asks for, it stops before any work with an error that names the limit, the need and the keys that
set the concurrency, instead of failing later with `accept() out of system resource`.

`listen_overflows()` reads the kernel's count of connections dropped from full accept queues
(TcpExt ListenOverflows in /proc/net/netstat), for tests and benchmarks.
"""

from __future__ import annotations

import errno
import logging
import resource

logger = logging.getLogger(__name__)

SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"
NETSTAT_PATH = "/proc/net/netstat"
MIN_BACKLOG = 128  # the common default; never listen with less
BASE_OPEN_FILES = 256  # a process's own files besides its sockets: libraries, logs, pipes, model shards


class OpenFileLimitError(RuntimeError):
    """The hard RLIMIT_NOFILE is below what the configured concurrency needs."""


def somaxconn() -> int | None:
    """net.core.somaxconn, the kernel's cap on every listen backlog; None where it cannot be read."""
    try:
        with open(SOMAXCONN_PATH) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def listen_backlog(concurrency: int, *, what: str, keys: str) -> int:
    """The backlog for a server that may see `concurrency` connections arrive at once (at least
    MIN_BACKLOG). Warns, naming both numbers and `keys` (the settings behind the concurrency), when
    net.core.somaxconn caps the queue below it."""
    backlog = max(int(concurrency), MIN_BACKLOG)
    cap = somaxconn()
    if cap is not None and cap < backlog:
        logger.warning(
            "%s may see %d connections at once (%s), but the kernel caps its listen queue at "
            "net.core.somaxconn=%d: a burst past it can be reset before the server sees it. "
            "Raise it (sysctl -w net.core.somaxconn=%d) or lower the concurrency.",
            what,
            backlog,
            keys,
            cap,
            backlog,
        )
    return backlog


def open_files_needed(sockets: int) -> int:
    """Descriptors a process needs to hold `sockets` sockets beside its own files."""
    return int(sockets) + BASE_OPEN_FILES


def raise_open_file_limit(need: int = 0, *, what: str = "this process", keys: str = "") -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit and return it. When `need` descriptors do
    not fit under the hard limit, raise OpenFileLimitError naming the limit, the need and `keys`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # a hard limit of infinity some kernels refuse as soft
            logger.debug("could not raise RLIMIT_NOFILE from %s to %s: %s", soft, hard, exc)
    if need and hard != resource.RLIM_INFINITY and hard < need:
        raise OpenFileLimitError(
            f"{what} needs about {need} open files (sockets for {keys or 'its connections'}), but the "
            f"hard limit on open files (RLIMIT_NOFILE, ulimit -Hn) is {hard}. Raise the hard limit "
            f"(ulimit -Hn {need}, or nofile in /etc/security/limits.conf) or lower {keys or 'the concurrency'}."
        )
    return soft


def is_out_of_files(error: BaseException) -> bool:
    """Whether `error` (an OSError, or a wrapper keeping it as `os_error`, as aiohttp's connector
    errors do) says that this process or the system has no descriptor left."""
    os_error = error if isinstance(error, OSError) else getattr(error, "os_error", None)
    return getattr(os_error, "errno", None) in (errno.EMFILE, errno.ENFILE)


def out_of_files_text(error: BaseException | None = None) -> str:
    """What ran out and what to do, for an error that is_out_of_files: the system's table of open
    files (ENFILE), or this process's limit, which the rollout client fills with a socket per
    request in flight."""
    os_error = error if isinstance(error, OSError) else getattr(error, "os_error", None)
    if getattr(os_error, "errno", None) == errno.ENFILE:
        return "the system's table of open files is full (fs.file-max; sysctl -w fs.file-max=...)"
    soft, hard = (_limit_text(n) for n in resource.getrlimit(resource.RLIMIT_NOFILE))
    return (
        f"this process is out of open files (RLIMIT_NOFILE {soft}, hard {hard}): every request in flight holds "
        "a socket (rollout.max_concurrent_rollouts x gconfig.n_samples). Raise the limit (ulimit -n, up to "
        "ulimit -Hn) or lower that concurrency"
    )


def _limit_text(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def listen_overflows() -> int | None:
    """The kernel's TcpExt ListenOverflows counter (connections a full accept queue dropped since
    boot, all processes); None where /proc/net/netstat cannot be read."""
    try:
        with open(NETSTAT_PATH) as f:
            lines = [line.split() for line in f if line.startswith("TcpExt:")]
    except OSError:
        return None
    if len(lines) < 2:
        return None
    names, values = lines[0], lines[1]
    try:
        return int(values[names.index("ListenOverflows")])
    except (ValueError, IndexError):
        return None


def rollout_client_open_files(cfg) -> tuple[int, str]:
    """(descriptors, keys) for the process that runs a run's rollout client (trainer rank 0, the
    inference-only driver): a socket per generation request in flight, the executor's episodes
    times n_samples, and three per agent call when the agents run in that process
    (workflow.agent.workers=0: the agent's connection, the proxy's end of it, the server request)."""
    r = cfg.rollout
    in_flight = (r.max_concurrent_rollouts or r.consumer_batch_size or 1) * cfg.gconfig.n_samples
    keys = "rollout.max_concurrent_rollouts x gconfig.n_samples"
    if cfg.workflow.type == "agent" and cfg.workflow.agent.workers == 0:
        return open_files_needed(3 * in_flight), keys + " (x3: workflow.agent.workers=0)"
    return open_files_needed(in_flight), keys


def raise_rollout_client_open_files(cfg, what: str) -> None:
    """raise_open_file_limit for the process that runs `cfg`'s rollout client (rollout_client_open_files)."""
    need, keys = rollout_client_open_files(cfg)
    raise_open_file_limit(need, what=what, keys=keys)
