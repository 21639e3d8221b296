"""What the built-in server says about itself: /health, /health_generate, /model_info
(/get_model_info), /server_info (/get_server_info), /v1/loads and SGLang's 404 for
/get_weight_version.

The launcher and the client probe /health; /server_info reports the server's flags, batching
statistics, load, KV budget and this process's memory (benchmarks read per-phase peaks there).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict
from datetime import datetime, timezone

from aiohttp import web

from areal.server.bodies import error
from areal.server.memory import memory_readings
from areal.server.routes_generate import GenerateRoutes
from areal.server.sampling import SamplingParams
from areal.server.state import Routes, ServerState

HEALTH_GENERATE_TIMEOUT_S = 20.0
# the sections SGLang's /v1/loads accepts in `include`; this server fills the core one
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


class InfoRoutes(Routes):
    """Health and information routes; /health_generate generates through `generation`."""

    def __init__(self, state: ServerState, generation: GenerateRoutes):
        super().__init__(state)
        self.generation = generation

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """Generate one token; while generation is paused or memory is released the server
        counts as healthy (the caller chose that nothing runs)."""
        if not self.s.gate.is_set() or self.s.scheduler.memory_released:
            return web.Response(status=200)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        try:
            await asyncio.wait_for(
                self.generation.run(rid, [0], SamplingParams(max_new_tokens=1, top_k=1), False),
                HEALTH_GENERATE_TIMEOUT_S,
            )
        except asyncio.TimeoutError:
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        a = self.s.args
        return web.json_response(
            {
                "model_path": a.model_path,
                "tokenizer_path": a.tokenizer_path or a.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.s.weight_version,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """Server args, batching statistics and load (SGLang puts scheduler state in
        `internal_states`; ours holds the batching stats), the KV budget (SGLang's
        max_total_num_tokens) and this process's memory (for per-phase peaks in benchmarks)."""
        stats = self.s.scheduler.stats.as_dict()
        info = {k: v for k, v in asdict(self.s.args).items() if k != "api_key"}
        budget = self.s.kv_budget
        info.update(
            {
                "context_length": self.s.context_length,
                "max_total_num_tokens": self.s.scheduler.max_total_tokens,
                "kv_budget": budget.as_dict() if budget is not None else None,
                "memory": self._memory(),
                "weight_version": self.s.weight_version,
                "resolved_device": str(self.s.runner.device),
                "resolved_dtype": str(self.s.runner.dtype).removeprefix("torch."),
                "batching": stats,
                "load": {
                    **self.s.scheduler.load(),
                    "accepted": self.s.accepted,
                    "capacity": self.s.capacity,
                    "accept_out_of_files": self.s.accept_out_of_files,
                },
                "internal_states": [{"batching": stats}],
                "uptime_s": time.time() - self.s.started,
                "version": "areal-builtin",
            }
        )
        return web.json_response(info)

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang's /v1/loads, core section: one scheduler, its running and waiting requests now."""
        include = {part.strip() for part in request.query.get("include", "core").split(",")}
        if not include <= LOAD_SECTIONS:
            return error(
                400, f"Invalid include sections: {include - LOAD_SECTIONS}. Valid options: {sorted(LOAD_SECTIONS)}"
            )
        load = self.s.scheduler.load()
        return web.json_response(
            {
                "timestamp": datetime.now(timezone.utc).isoformat(),
                "version": "areal-builtin",
                "loads": [
                    {
                        "timestamp": time.time(),
                        "dp_rank": 0,
                        "num_running_reqs": load["running"],
                        "num_waiting_reqs": load["waiting"],
                        "max_running_requests": self.s.scheduler.max_running,
                    }
                ],
            }
        )

    def _memory(self) -> dict:
        memory = memory_readings(self.s.runner.device)
        offloader = self.s.updater.offloader
        memory.update(
            released=sorted(self.s.scheduler.memory_released),
            kv_cache_bytes=self.s.scheduler.kv_cache_bytes(),
            offloaded_weights_bytes=offloader.offloaded_bytes() if offloader else 0,
        )
        return memory

    async def get_weight_version(self, request: web.Request) -> web.Response:
        """Gone from SGLang 0.5.9 on; its answer: a 404 that names /model_info."""
        return error(
            404, "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
        )
