"""LoRA routes of the built-in server: SGLang's /load_lora_adapter and /unload_lora_adapter.

One adapter is served at a time, merged into the weights (lora.py). While a load or unload
runs, /generate requests that name an adapter wait (the state's lora_idle event), so none is
checked against an adapter that is about to change.
"""

from __future__ import annotations

from aiohttp import web

from areal.server.bodies import read_json
from areal.server.memory import MemoryReleased, released_message
from areal.server.routes_weights import on_worker
from areal.server.state import Routes
from areal.server.validation import BadRequest, check_keys, get_typed
from areal.server.weights import check_weight_path


class LoraRoutes(Routes):
    """Load and unload an adapter on the worker thread, as weight updates run (on_worker)."""

    async def load_lora(self, request: web.Request) -> web.Response:
        """SGLang's /load_lora_adapter; the adapter becomes the one served (see lora.py)."""
        body = await read_json(request)
        where = "/load_lora_adapter"
        check_keys(body, {"lora_name", "lora_path", "pinned", "lora_id", "rid"}, where)
        name = get_typed(body, "lora_name", str, None, where)
        path = get_typed(body, "lora_path", str, None, where)
        if not name or not path:
            raise BadRequest(f"{where}: 'lora_name' and 'lora_path' (strings) are required.")
        get_typed(body, "pinned", bool, False, where)  # one adapter at a time: nothing to pin
        try:
            check_weight_path(path, self.s.weight_roots, where, key="lora_path")
        except BadRequest as exc:
            return self._reply(False, str(exc), status=exc.status)
        ok, message = await self._lora_op(where, lambda: self.s.updater.lora.load(name, path))
        return self._reply(ok, message)

    async def unload_lora(self, request: web.Request) -> web.Response:
        """SGLang's /unload_lora_adapter; unloading the served adapter restores the base."""
        body = await read_json(request)
        where = "/unload_lora_adapter"
        check_keys(body, {"lora_name", "lora_id", "rid"}, where)
        name = get_typed(body, "lora_name", str, None, where)
        if not name:
            raise BadRequest(f"{where}: 'lora_name' (string) is required.")
        ok, message = await self._lora_op(where, lambda: self.s.updater.lora.unload(name))
        return self._reply(ok, message)

    async def _lora_op(self, where: str, fn) -> tuple[bool, str]:
        def guarded():  # merging needs the weights on the device (checked on the worker)
            if self.s.updater.weights_released:
                raise MemoryReleased(released_message(where, {"weights"}))
            return fn()

        self.s.lora_ops += 1
        self.s.lora_idle.clear()
        try:
            return await on_worker(self.s, guarded)
        finally:
            self.s.lora_ops -= 1
            if self.s.lora_ops == 0:
                self.s.lora_idle.set()

    def _reply(self, ok: bool, message: str, status: int = 400) -> web.Response:
        """SGLang's LoRA reply: success, error_message, loaded_adapters (name -> path); we add
        message and the adapter being served."""
        lora = self.s.updater.lora
        return web.json_response(
            {
                "success": ok,
                "error_message": "" if ok else message,
                "message": message,
                "loaded_adapters": dict(lora.loaded),
                "active_adapter": lora.active,
            },
            status=200 if ok else status,
        )
