"""A RemoteSGLangEngine of one built-in server process, for tests that generate (module fixtures)."""

import contextlib

from areal.engine.sglang.client import RemoteSGLangEngine
from areal.server.testing import start_server


@contextlib.contextmanager
def served_engine(model_dir: str, consumer_batch_size: int = 2):
    """A built-in server of `model_dir` (float32, one thread) and an engine of it; both stopped after."""
    server = start_server(model_dir, extra_args=["--dtype", "float32"], env={"OMP_NUM_THREADS": "1"})
    engine = RemoteSGLangEngine.from_pretrained(
        model_dir, server_addrs=[server.url], rollout={"consumer_batch_size": consumer_batch_size}
    )
    try:
        yield engine
    finally:
        engine.destroy()
        server.stop()
