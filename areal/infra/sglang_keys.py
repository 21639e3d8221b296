"""SGLang's request vocabulary that the client and the built-in server both speak.

The client's payload builders (areal/engine/sglang/protocol.py) send these keys and the
built-in server (areal/server/) accepts them, so both read them from here. The module sits on
the lowest floor of the import graph, imports nothing, and is torch-free: the server must not
import the engine package, nor the client the server. What only one side needs stays there:
the route paths and per-route body keys the client sends (protocol.py), the keys the server
accepts only at their neutral values (areal/server/validation.py). Pause modes are in
areal/infra/pause.py.
"""

from __future__ import annotations

# /generate's sampling_params keys both sides implement, spelt as SGLang's SamplingParams.
SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "no_stop_trim",
        "sampling_seed",
        "stream_interval",  # tokens between a streamed answer's chunks
    }
)
# What /release_memory_occupation and /resume_memory_occupation may name: the KV cache and the
# weights (SGLang's 'cuda_graph' tag has no counterpart on the built-in server).
MEMORY_TAGS = ("kv_cache", "weights")
