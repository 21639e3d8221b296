"""RemoteSGLangEngine.from_pretrained refuses at construction a layout this machine's servers
cannot run (no servers started here)."""

import pytest

from areal.config import ConfigError
from areal.engine.sglang.pretrained import pretrained_config


def test_builtin_servers_cannot_do_tensor_parallel(monkeypatch):
    monkeypatch.setattr("areal.engine.sglang.local_servers.server_kind", lambda cfg: "builtin")
    with pytest.raises(ConfigError, match="tp_size=2 needs SGLang"):
        pretrained_config("/m", tp_size=2, cluster={"n_gpus_per_node": 8})
