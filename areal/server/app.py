"""The built-in server's HTTP application (aiohttp): SGLang's paths, request fields and response
shapes, one route family per module, assembled by `build_app`:

    routes_generate.py  /generate (and admission, running and output for every generating route)
    routes_info.py      /health, /health_generate, /model_info, /server_info, /get_weight_version
    routes_control.py   pause / continue / abort, /flush_cache, memory release and resume
    routes_weights.py   weight versions and updates (disk, tensor, distributed)
    routes_lora.py      LoRA adapters
    routes_profile.py   /start_profile, /stop_profile (torch.profiler traces, SGLang's file names)
    openai_api.py       /v1/models, /v1/chat/completions, /v1/completions

Request bodies are validated in the route modules (see `validation.py`, `bodies.py`); the model
work happens on the scheduler's worker thread, and handlers await its futures, so the event loop
stays responsive (health checks, aborts and pauses are answered while a batch is decoding).

Error bodies follow SGLang: `{"error": {"message": ...}}` with HTTP 400 for client errors,
404/405 for unknown routes/methods, 401 without the API key, 500 for internal failures. Beyond
SGLang: 413 for a body larger than any valid request (`max_body_bytes`), 415 for a body sent with
a non-JSON Content-Type, 503 when --max-running-requests + --max-queued-requests /generate
requests are already in the server, and 403 (weights shape `{"success": false, "message"}`) for
a disk weight or LoRA adapter load from outside the allowed folders (--weight-dirs). LoRA
adapters: see lora.py (one adapter served at a time, merged into the weights).

Colocation with a trainer on the same GPU (SGLang's routes): /update_weights_from_tensor takes
tensors the trainer shares (CUDA IPC handles or CPU shared memory; weights.py, and
areal/utils/tensor_ipc.py for the format), and /release_memory_occupation and
/resume_memory_occupation give the KV cache and the weights back to the device and take them
again (memory.py, which also keeps the server within --mem-fraction-static). While memory is
released, /generate is a 400 that names /resume_memory_occupation.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from areal.server.bodies import error, max_body_bytes
from areal.server.connections import close_connections_when_files_run_short
from areal.server.openai_api import OpenAIRoutes
from areal.server.routes_control import ControlRoutes
from areal.server.routes_generate import GenerateRoutes
from areal.server.routes_info import InfoRoutes
from areal.server.routes_lora import LoraRoutes
from areal.server.routes_profile import ProfileRoutes
from areal.server.routes_weights import WeightRoutes
from areal.server.state import ServerState
from areal.server.validation import BadRequest

logger = logging.getLogger("areal.server")


def build_app(state: ServerState) -> web.Application:
    app = web.Application(
        middlewares=[_error_middleware, _auth_middleware(state.args.api_key)],
        client_max_size=max_body_bytes(state.context_length),
    )
    app["state"] = state
    app.on_response_prepare.append(close_connections_when_files_run_short)  # connections.py
    generation = GenerateRoutes(state)
    info, control = InfoRoutes(state, generation), ControlRoutes(state)
    weights, lora = WeightRoutes(state), LoraRoutes(state)
    openai = OpenAIRoutes(state, generation)
    profile = ProfileRoutes(state)
    add = app.router.add_route
    for path, handler in (
        ("/health", info.health),
        ("/health_generate", info.health_generate),
        ("/model_info", info.model_info),
        ("/get_model_info", info.model_info),
        ("/server_info", info.server_info),
        ("/get_server_info", info.server_info),
        ("/get_weight_version", info.get_weight_version),
        ("/weight_version", info.get_weight_version),
        ("/v1/models", openai.models),
        ("/v1/loads", info.loads),
    ):
        add("GET", path, handler)
    for method in ("GET", "POST"):
        add(method, "/flush_cache", control.flush_cache)
        add(method, "/release_memory_occupation", control.release_memory)
        add(method, "/resume_memory_occupation", control.resume_memory)
        add(method, "/start_profile", profile.start_profile)
        add(method, "/stop_profile", profile.stop_profile)
    for method in ("POST", "PUT"):
        add(method, "/generate", generation.generate)
    for path, handler in (
        ("/pause_generation", control.pause),
        ("/continue_generation", control.resume),
        ("/abort_request", control.abort_request),
        ("/update_weight_version", weights.update_weight_version),
        ("/update_weights_from_disk", weights.update_from_disk),
        ("/update_weights_from_tensor", weights.update_from_tensor),
        ("/load_lora_adapter", lora.load_lora),
        ("/unload_lora_adapter", lora.unload_lora),
        ("/init_weights_update_group", weights.init_group),
        ("/update_weights_from_distributed", weights.update_from_distributed),
        ("/destroy_weights_update_group", weights.destroy_group),
    ):
        add("POST", path, handler)
    add("POST", "/v1/chat/completions", openai.chat)
    add("POST", "/v1/completions", openai.completions)
    return app


@web.middleware
async def _error_middleware(request, handler):
    try:
        return await handler(request)
    except BadRequest as exc:
        return error(exc.status, str(exc))
    except web.HTTPNotFound:
        return error(404, f"No route {request.path}. See SGLang's native API for the routes this server answers.")
    except web.HTTPMethodNotAllowed as exc:
        return error(405, f"{request.method} is not allowed on {request.path}; use {sorted(exc.allowed_methods)}.")
    except web.HTTPException as exc:
        if exc.status >= 400:  # SGLang's JSON error shape, not aiohttp's plain text
            return error(exc.status, f"{request.method} {request.path}: {exc.text or exc.reason}")
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the server stays up; the client sees what failed
        logger.exception("%s failed", request.path)
        return error(500, f"Internal server error on {request.path}: {exc}")


def _auth_middleware(api_key: str | None):
    """As SGLang: with --api-key, every path except /health* needs the bearer token."""

    @web.middleware
    async def auth(request, handler):
        if api_key and not request.path.startswith("/health"):
            if request.headers.get("Authorization", "") != f"Bearer {api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return auth
