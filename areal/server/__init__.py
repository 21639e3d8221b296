"""Built-in inference server: `python -m areal.server`, speaking SGLang's HTTP API subset.

Used where SGLang cannot run (CPU, tests, machines without it); the project's SGLang client
works against either. Modules, in the order a request flows:

    args.py        command-line flags (SGLang's names)
    app.py         aiohttp routes, request validation (validation.py), response shapes
    scheduler.py   continuous batching on one worker thread; pause/abort/retract
    engine.py      the transformers model: batched prefill/decode with a shared padded KV cache
    sampling.py    per-request sampling; logprob convention (temperature-scaled, as SGLang)
    weights.py     weight updates from disk and over torch.distributed (nccl/gloo)
    lora.py        LoRA adapters (/load_lora_adapter): one served adapter, merged into the weights
    testing.py     start_server() for tests and benchmarks
"""
