"""RewardRunner in a process out of open files (a rollout client whose sockets took them all): the
error names the limit, and once descriptors are free again the next call starts the pool."""

import subprocess
import sys
import textwrap

# Runs in its own process: exhausting descriptors in the test process would break the test run.
SCRIPT = textwrap.dedent(
    """
    import asyncio, errno, os, resource
    from areal.infra.sockets import OpenFileLimitError
    from areal.reward import RewardRunner

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    runner = RewardRunner("gsm8k", timeout_s=30, max_workers=2)

    async def main():
        hogs = []
        try:
            while True:  # what 2,048 generation sockets do to a soft limit of 1,024
                hogs.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as e:
            assert e.errno == errno.EMFILE, e
        try:
            await runner("1+1=", "1+1=2", [], [], answer="#### 2")
        except OpenFileLimitError as e:
            print("ERROR:", e)
        for fd in hogs:
            os.close(fd)
        print("AFTER:", await runner("1+1=", "1+1=2", [], [], answer="#### 2"))

    asyncio.run(main())
    runner.close()
    """
)


def test_reward_pool_out_of_open_files_names_the_limit_then_recovers():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    error = lines.get("ERROR", "")
    assert "reward 'gsm8k': cannot start its 2 worker process(es)" in error, proc.stdout + proc.stderr
    assert "RLIMIT_NOFILE 256" in error and "ulimit -n" in error, error
    assert "rollout.max_concurrent_rollouts x gconfig.n_samples" in error, error
    assert lines.get("AFTER") == "1.0", proc.stdout + proc.stderr
