"""Built-in inference server: `python -m areal.server`, speaking SGLang's HTTP API subset.

Used where SGLang cannot run (CPU, tests, machines without it); the project's SGLang client
works against either. Tests and benchmarks start one with areal/infra/server_process.py's
start_builtin_server (tests through tests/serving.py). Modules, in the order a request flows:

    args.py        command-line flags (SGLang's names)
    app.py         the aiohttp application: middlewares and the route table, over the
                   route families routes_generate.py, routes_info.py, routes_control.py,
                   routes_weights.py, routes_lora.py and openai_api.py (/v1); what they share
                   is state.py; request bodies: bodies.py and validation.py
    scheduler.py   continuous batching on one worker thread; pause/abort/retract; KV budget
    engine.py      the transformers model: batched prefill/decode with a shared padded KV cache
    sampling.py    per-request sampling; logprob convention (temperature-scaled, as SGLang)
    weights.py     weight updates from disk, over torch.distributed (nccl/gloo), and from
                   tensors the trainer shares (CUDA IPC / CPU shared memory: utils/tensor_ipc.py)
    memory.py      --mem-fraction-static / --max-total-tokens budget; memory release and resume
    lora.py        LoRA adapters (/load_lora_adapter): one served adapter, merged into the weights

Routes (SGLang's paths and fields; app.py has the error shapes):

    generation     /generate, /pause_generation, /continue_generation, /abort_request
    information    /health, /health_generate, /model_info (/get_model_info), /server_info
                   (/get_server_info; KV budget as max_total_num_tokens, this process's "memory"),
                   /v1/models, /v1/loads (core: running and waiting requests); /get_weight_version
                   answers SGLang's 404
    weights        /update_weights_from_disk, /update_weights_from_tensor,
                   /init_weights_update_group, /update_weights_from_distributed,
                   /destroy_weights_update_group, /update_weight_version,
                   /load_lora_adapter, /unload_lora_adapter
    colocation     /release_memory_occupation, /resume_memory_occupation (tags kv_cache,
                   weights) and /update_weights_from_tensor: one GPU shared with a trainer
    cache          /flush_cache (nothing to flush: no prefix cache)
"""
