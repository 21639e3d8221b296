"""Weight routes of the built-in server, with SGLang's bodies and replies: /update_weight_version,
/update_weights_from_disk, /update_weights_from_tensor, and the distributed update's
/init_weights_update_group, /update_weights_from_distributed and /destroy_weights_update_group.

Bodies are checked here; the work (weights.py) runs on the scheduler's worker thread between
decode steps. Replies are `{"success", "message", ...}`: 200 on success, else 400 (403 for a disk
load from outside the allowed folders). An update that asks for a flush while requests are held
is refused first, as SGLang's flush after the update would be.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from areal.server.bodies import read_json
from areal.server.state import Routes, ServerState
from areal.server.validation import BadRequest, check_keys, get_typed
from areal.server.weights import check_weight_path

logger = logging.getLogger("areal.server")
TENSOR_LOAD_FORMATS = (None, "direct")  # both: copy by Hugging Face state-dict name
TENSOR_SELECTORS = ("all", "target")  # no draft model here
DTYPES = ("bfloat16", "float16", "float32")  # of the tensors a distributed update broadcasts
# Body keys of SGLang's weight updates: those every update takes, then each route's own.
UPDATE_KEYS = frozenset({"abort_all_requests", "weight_version", "flush_cache", "load_format", "rid"})
DISK_KEYS = UPDATE_KEYS | {"model_path", "is_async", "torch_empty_cache", "keep_pause"}
TENSOR_KEYS = UPDATE_KEYS | {"serialized_named_tensors", "selector", "torch_empty_cache"}
DISTRIBUTED_KEYS = UPDATE_KEYS | {"names", "dtypes", "shapes", "group_name"}


class WeightRoutes(Routes):
    """One method per weight route; `on_worker` runs the update itself."""

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/update_weight_version"
        check_keys(body, {"new_version", "abort_all_requests", "rid"}, where)
        version = get_typed(body, "new_version", str, None, where)
        if version is None:
            raise BadRequest(f"{where}: 'new_version' (string) is required.")
        await self._abort_all_if_asked(body, where, default=True)  # SGLang's default
        self.s.set_weight_version(version)
        return web.json_response(
            {"success": True, "new_version": version, "message": f"Weight version updated to {version}"}
        )

    async def update_from_disk(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/update_weights_from_disk"
        check_keys(body, DISK_KEYS, where)
        path = get_typed(body, "model_path", str, None, where)
        if not path:
            raise BadRequest(f"{where}: 'model_path' (string) is required.")
        try:
            check_weight_path(path, self.s.weight_roots, where)
        except BadRequest as exc:
            return self._reply(False, str(exc), None, status=exc.status)
        get_typed(body, "load_format", str, None, where)  # checked, then ignored
        version = get_typed(body, "weight_version", str, None, where)
        await self._abort_all_if_asked(body, where)
        timings: dict[str, float] = {}  # load_s: read + copy, reported for benchmarks
        flush = get_typed(body, "flush_cache", bool, True, where)  # SGLang's default
        ok, message = await on_worker(
            self.s, self._flush_checked(flush, where, lambda: self.s.updater.load_from_disk(path, timings))
        )
        return self._reply(ok, message, version, extra={"num_paused_requests": 0, **timings})

    async def update_from_tensor(self, request: web.Request) -> web.Response:
        """SGLang's /update_weights_from_tensor (weights.py has the protocol). Reply: success,
        message, and deserialize_s / load_s on success."""
        body = await read_json(request)
        where = "/update_weights_from_tensor"
        check_keys(body, TENSOR_KEYS, where)
        payload = _rank0_payload(body.get("serialized_named_tensors"), where)
        _check_tensor_update_options(body, where)
        empty_cache = get_typed(body, "torch_empty_cache", bool, False, where)
        version = get_typed(body, "weight_version", str, None, where)
        await self._abort_all_if_asked(body, where)
        timings: dict[str, float] = {}  # deserialize_s, load_s: reported for benchmarks

        def update() -> str:
            message = self.s.updater.update_from_tensors(payload, timings)
            if empty_cache:
                _empty_cuda_cache(self.s.runner.device)
            return message

        flush = get_typed(body, "flush_cache", bool, True, where)  # SGLang's default
        ok, message = await on_worker(self.s, self._flush_checked(flush, where, update))
        return self._reply(ok, message, version, extra=timings)

    async def init_group(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/init_weights_update_group"
        check_keys(
            body, {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend", "rid"}, where
        )
        kw = {
            "master_address": get_typed(body, "master_address", str, None, where),
            "master_port": get_typed(body, "master_port", int, None, where),
            "rank_offset": get_typed(body, "rank_offset", int, None, where),
            "world_size": get_typed(body, "world_size", int, None, where),
            "group_name": get_typed(body, "group_name", str, "weight_update_group", where),
            "backend": get_typed(body, "backend", str, "nccl", where),
        }
        _check_group_options(kw, where)
        ok, message = await on_worker(self.s, lambda: self.s.updater.init_group(**kw))
        return self._reply(ok, message, None)

    async def update_from_distributed(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/update_weights_from_distributed"
        check_keys(body, DISTRIBUTED_KEYS, where)
        names, dtypes, shapes = _tensor_specs(body, where)
        group = get_typed(body, "group_name", str, "weight_update_group", where)
        flush = get_typed(body, "flush_cache", bool, True, where)  # SGLang's default
        version = get_typed(body, "weight_version", str, None, where)
        await self._abort_all_if_asked(body, where)
        timings: dict[str, float] = {}  # recv_s, load_s: reported for benchmarks
        ok, message = await on_worker(
            self.s,
            self._flush_checked(
                flush,
                where,
                lambda: self.s.updater.update_from_distributed(
                    names=names, dtypes=dtypes, shapes=shapes, group_name=group, timings=timings
                ),
            ),
        )
        return self._reply(ok, message, version, extra=timings)

    async def destroy_group(self, request: web.Request) -> web.Response:
        body = await read_json(request, allow_empty=True)
        where = "/destroy_weights_update_group"
        check_keys(body, {"group_name", "rid"}, where)
        group = get_typed(body, "group_name", str, "weight_update_group", where)
        ok, message = await on_worker(self.s, lambda: self.s.updater.destroy_group(group))
        return self._reply(ok, message, None)

    async def _abort_all_if_asked(self, body: dict, where: str, default: bool = False) -> None:
        """`abort_all_requests`: end every request in the server before the update."""
        if get_typed(body, "abort_all_requests", bool, default, where):
            await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by " + where))

    def _flush_checked(self, flush: bool, where: str, load):
        """`load` run on the worker, refused first (as SGLang's flush after the update would be)
        when the update asks for a flush while requests are held (see check_flushable)."""

        def run():
            if flush:
                self.s.scheduler.check_flushable(where)
            return load()

        return run

    def _reply(
        self, ok: bool, message: str, version: str | None, extra: dict | None = None, status: int = 400
    ) -> web.Response:
        if ok and version is not None:
            self.s.set_weight_version(version)
            message += f" Weight version updated to {version}."
        return web.json_response({"success": ok, "message": message, **(extra or {})}, status=200 if ok else status)


async def on_worker(state: ServerState, fn) -> tuple[bool, str]:
    """Run a weight operation between decode steps (after running requests finish,
    unless paused, as SGLang does); errors become (False, message)."""
    try:
        return True, await asyncio.wrap_future(state.scheduler.call(fn, drain=True))
    except Exception as exc:
        logger.warning("weight operation failed: %s", exc)
        return False, str(exc)


def _rank0_payload(payloads, where: str) -> str:
    """The one entry of `serialized_named_tensors`. SGLang's tensor-parallel rank r reads entry
    r and no other (reading another rank's entry would take that rank's CUDA IPC references);
    this server runs one rank, so a list of any other length is a 400."""
    if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
        raise BadRequest(
            f"{where}: 'serialized_named_tensors' (a list of base64 strings, one per tensor-parallel rank) is required."
        )
    if len(payloads) != 1:
        raise BadRequest(
            f"{where}: 'serialized_named_tensors' has {len(payloads)} entries; this "
            "server runs one tensor-parallel rank (tp 1), so send exactly one: the "
            "serialized (name, tensor) list for rank 0."
        )
    return payloads[0]


def _check_tensor_update_options(body: dict, where: str) -> None:
    load_format = get_typed(body, "load_format", str, None, where)
    if load_format not in TENSOR_LOAD_FORMATS:
        raise BadRequest(
            f"{where}: load_format {load_format!r} is not supported by the built-in "
            "server; use null or 'direct' (both copy by Hugging Face state-dict "
            "name). 'flattened_bucket' needs SGLang's own classes in the payload, "
            "which this server does not unpickle: send (name, tensor) pairs."
        )
    selector = get_typed(body, "selector", str, "all", where)
    if selector not in TENSOR_SELECTORS:
        raise BadRequest(
            f"{where}: selector {selector!r} is invalid here; the built-in server "
            f"has no draft model, use one of {list(TENSOR_SELECTORS)}."
        )
    get_typed(body, "flush_cache", bool, True, where)  # nothing is cached across requests


def _check_group_options(kw: dict, where: str) -> None:
    """/init_weights_update_group: every key given, a known backend, and a rank after the trainer's."""
    missing = [k for k, v in kw.items() if v is None]
    if missing:
        raise BadRequest(f"{where}: missing required key(s) {missing}.")
    if kw["backend"] not in ("nccl", "gloo"):
        raise BadRequest(f"{where}: backend {kw['backend']!r} is invalid; use 'nccl' (GPU) or 'gloo' (CPU).")
    if not 1 <= kw["rank_offset"] < kw["world_size"]:
        raise BadRequest(
            f"{where}: rank_offset must be in [1, world_size); rank 0 is the "
            f"trainer. Got rank_offset={kw['rank_offset']}, "
            f"world_size={kw['world_size']}."
        )


def _tensor_specs(body: dict, where: str) -> tuple[list[str], list[str], list[list[int]]]:
    """names, dtypes and shapes of a distributed update: one of each per tensor broadcast."""
    names = _str_list(body.get("names"), "names", where)
    dtypes = _str_list(body.get("dtypes"), "dtypes", where)
    shapes = body.get("shapes")
    if not isinstance(shapes, list) or not all(
        isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes
    ):
        raise BadRequest(f"{where}: 'shapes' must be a list of lists of non-negative ints.")
    if not len(names) == len(dtypes) == len(shapes):
        raise BadRequest(
            f"{where}: names, dtypes and shapes must have equal lengths; got "
            f"{len(names)}, {len(dtypes)}, {len(shapes)}."
        )
    bad = sorted({d for d in dtypes if d not in DTYPES})
    if bad:
        raise BadRequest(f"{where}: dtypes {bad} are invalid; use bfloat16, float16 or float32.")
    return names, dtypes, shapes


def _str_list(value, key: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{where}: '{key}' must be a list of strings.")
    return value


def _empty_cuda_cache(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
