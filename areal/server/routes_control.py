"""Control routes of the built-in server: /pause_generation, /continue_generation,
/abort_request, /flush_cache, and /release_memory_occupation and /resume_memory_occupation
(colocation with a trainer; memory.py).

Pause modes are SGLang's (areal/infra/pause.py): abort ends the running requests, retract and
in_place hold them. New /generate requests wait at the state's gate while generation is paused.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from areal.infra.pause import PAUSE_MODES
from areal.infra.sglang_keys import MEMORY_TAGS
from areal.server.bodies import error, read_json
from areal.server.memory import DeviceMemoryShort, NotReleased, ServerBusy
from areal.server.state import Routes
from areal.server.validation import BadRequest, check_keys, get_typed


class ControlRoutes(Routes):
    """Pause, continue, abort, the cache flush and memory hand-off, each on the worker thread."""

    # ---- pause / continue / abort -----------------------------------------------------------
    async def pause(self, request: web.Request) -> web.Response:
        body = await read_json(request, allow_empty=True)
        check_keys(body, {"mode", "rid"}, "/pause_generation")
        mode = get_typed(body, "mode", str, "abort", "/pause_generation")
        if mode not in PAUSE_MODES:
            raise BadRequest(f"/pause_generation: mode {mode!r} is invalid; use one of {list(PAUSE_MODES)}.")
        self.s.gate.clear()
        t0 = time.perf_counter()
        if mode == "abort":
            held = await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by /pause_generation."))
        else:
            held = await asyncio.wrap_future(self.s.scheduler.pause(mode))
        # beyond SGLang's answer: what the pause cost here (a weight update waits for it)
        count_key = "requests_aborted" if mode == "abort" else "requests_held"
        return web.json_response(
            {
                "message": "Generation paused successfully.",
                "status": "ok",
                count_key: held,
                "pause_s": time.perf_counter() - t0,
            }
        )

    async def resume(self, request: web.Request) -> web.Response:
        body = await read_json(request, allow_empty=True)
        check_keys(body, {"rid"}, "/continue_generation")
        await asyncio.wrap_future(self.s.scheduler.resume())
        self.s.gate.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        check_keys(body, {"rid", "abort_all", "finished_reason", "abort_message"}, "/abort_request")
        rid = get_typed(body, "rid", str, "", "/abort_request")
        abort_all = get_typed(body, "abort_all", bool, False, "/abort_request")
        message = get_typed(body, "abort_message", str, None, "/abort_request")
        if abort_all or rid:
            await asyncio.wrap_future(
                self.s.scheduler.abort(None if abort_all else rid, message or "Aborted by /abort_request.")
            )
        return web.Response(status=200)

    # ---- cache ------------------------------------------------------------------------------
    async def flush_cache(self, request: web.Request) -> web.Response:
        """There is no prefix cache to flush (each request prefills its own prompt), but the
        answer is SGLang's: 400 while requests wait or run, after waiting up to `?timeout=`
        seconds for them to drain."""
        try:
            timeout = float(request.query.get("timeout", "0") or 0)
        except ValueError:
            raise BadRequest(f"/flush_cache: timeout {request.query.get('timeout')!r} is not a number of seconds.")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                await asyncio.wrap_future(
                    self.s.scheduler.call(lambda: self.s.scheduler.check_flushable("/flush_cache"))
                )
                return web.Response(text="Cache flushed.\n", status=200)
            except ServerBusy as exc:
                if time.monotonic() >= deadline:
                    return web.Response(text=str(exc) + "\n", status=400)
            await asyncio.sleep(0.05)

    # ---- memory occupation (colocation; see memory.py) ---------------------------------------
    async def release_memory(self, request: web.Request) -> web.Response:
        """SGLang's /release_memory_occupation {tags}; SGLang answers 200 with no fields, we
        add success, message, changed, released (tags released now) and seconds."""
        tags = await self._memory_tags(request, "/release_memory_occupation")
        return await self._memory_op(lambda: self.s.memory.release(tags))

    async def resume_memory(self, request: web.Request) -> web.Response:
        tags = await self._memory_tags(request, "/resume_memory_occupation")
        return await self._memory_op(lambda: self.s.memory.resume(tags))

    async def _memory_tags(self, request: web.Request, where: str) -> list[str]:
        """`tags`: null, absent or [] mean all (SGLang's rule); unknown tags are a 400."""
        body = await read_json(request, allow_empty=True)
        check_keys(body, {"tags", "rid"}, where)
        tags = body.get("tags")
        if tags is None or tags == []:
            return list(MEMORY_TAGS)
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise BadRequest(
                f"{where}: 'tags' must be null or a list of strings from {list(MEMORY_TAGS)}, got {tags!r}."
            )
        unknown = [t for t in tags if t not in MEMORY_TAGS]
        if unknown:
            raise BadRequest(
                f"{where}: unknown tag(s) {unknown}; valid tags are "
                f"{list(MEMORY_TAGS)} (null for all). The built-in server has no "
                "CUDA graphs, so SGLang's 'cuda_graph' is not one."
            )
        return list(dict.fromkeys(tags))

    async def _memory_op(self, fn) -> web.Response:
        """Run on the worker between steps: 400 while requests need the memory, 503 when the
        device has no room for the weights yet."""
        try:
            reply = await asyncio.wrap_future(self.s.scheduler.call(fn))
        except (ServerBusy, NotReleased) as exc:
            return error(400, str(exc))
        except DeviceMemoryShort as exc:
            return error(503, str(exc))
        return web.json_response(reply)
