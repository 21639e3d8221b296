"""ServerControl: every control route of a set of inference servers, in one client.

    control = ServerControl(["127.0.0.1:30000"], api_key=None, retries=3)
    control.pause()                                  # /pause_generation, on every server at once
    control.update_weights(WeightUpdateMeta("disk", path="/ckpt/v1", version=1))
    control.resume()

Generation control (pause / continue), versions (/model_info), LoRA adapters, the three weight
updates (disk, distributed, tensor) and memory hand-off (release / resume) all go through here,
with one retry and auth policy: connection errors and 502/503/504 are retried `retries` times with
backoff, every request carries the bearer key, and any server's failure raises an error naming it.
Payloads are built and answers parsed by `protocol.py`; this module only sends them.

RemoteSGLangEngine owns one (and adds discovery, generation and the rollout executor); an
FSDPEngine given bare server URLs (`connect_servers`) builds one. The same object is what the
trainer pushes weights to either way: the trainer produces weights, this client moves them.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from areal.api.inference import WeightUpdateMeta
from areal.engine.sglang import protocol
from areal.engine.sglang.http import ServerError, auth_headers, fanout, get_json, post_json
from areal.infra.discovery import normalize_addrs

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 60.0  # pause / continue / info / memory answer quickly


def pause_report(answers: list[Any]) -> dict[str, float]:
    """The servers' /pause_generation answers, summarised: the slowest server's own pause seconds
    and the requests aborted or held, summed (keys only where some server reported them)."""
    report: dict[str, float] = {}
    for answer in answers:
        if not isinstance(answer, dict):
            continue
        if isinstance(answer.get("pause_s"), (int, float)):
            report["server_pause_s"] = max(report.get("server_pause_s", 0.0), float(answer["pause_s"]))
        for key in ("requests_aborted", "requests_held"):
            if isinstance(answer.get(key), int):
                report[key] = report.get(key, 0) + answer[key]
    return report


class ServerControl:
    """Control calls to `addrs` (host:port); see the module docstring.

    timeout_s bounds weight loads (a large model reloads for minutes); control calls that answer
    at once use CONTROL_TIMEOUT_S. ranks_per_server is each server's tensor-parallel size: a
    server takes that many ranks of a distributed update group and one tensor payload per rank.
    pause_mode is the /pause_generation mode (abort, retract or in_place).
    """

    def __init__(
        self,
        addrs: list[str],
        *,
        api_key: str | None = None,
        retries: int = 0,
        timeout_s: float = 600.0,
        ranks_per_server: int = 1,
        pause_mode: str = "abort",
    ):
        self.addrs = normalize_addrs(addrs)
        self.headers = auth_headers(api_key)
        self.retries = retries
        self.timeout_s = timeout_s
        self.ranks_per_server = ranks_per_server
        self.pause_mode = pause_mode
        self.lora_name: str | None = None  # the adapter /generate requests name (adapter pushes)
        self._paused = threading.Event()
        self._lock = threading.Lock()
        self._version = 0
        self._bg = ThreadPoolExecutor(max_workers=4, thread_name_prefix="server-control")

    # ---- transport ----------------------------------------------------------------------------
    def post_all(
        self, route: str, body_of: Callable[[int, str], dict] | dict, timeout: float | None = None
    ) -> list[Any]:
        """POST to every server at once (`body_of(index, addr)` or one shared body); all answers,
        or one error naming each server that failed."""
        make = body_of if callable(body_of) else (lambda i, a: body_of)
        return fanout(
            self.addrs,
            lambda i, a: post_json(
                a, route, make(i, a), timeout=timeout or self.timeout_s, retries=self.retries, headers=self.headers
            ),
        )

    def _checked(self, route: str, body_of, timeout: float | None = None) -> list[Any]:
        """post_all for routes that answer {"success": ..., "message": ...}."""
        answers = self.post_all(route, body_of, timeout)
        for answer in answers:
            protocol.parse_success(route, answer)
        return answers

    def get(self, addr: str, route: str) -> Any:
        return get_json(addr, route, timeout=CONTROL_TIMEOUT_S, headers=self.headers)

    def close(self) -> None:
        self._bg.shutdown(wait=False, cancel_futures=True)

    # ---- information --------------------------------------------------------------------------
    def server_info(self, addr: str) -> dict:
        return self.get(addr, protocol.SERVER_INFO)

    def server_programs(self) -> list[str | None]:
        """Each server's /get_server_info "version" ("areal-builtin" for the built-in server, a
        release number for SGLang); None where it cannot be read."""

        def program(i, addr):
            try:
                info = self.server_info(addr)
            except (ServerError, OSError, ValueError) as e:
                logger.debug("cannot read %s's server info: %s", addr, e)
                return None
            return info.get("version") if isinstance(info, dict) else None

        return fanout(self.addrs, program)

    def server_versions(self) -> dict[str, int | None]:
        """Each server's weight version from /model_info (/get_model_info on servers without it)."""
        return dict(zip(self.addrs, fanout(self.addrs, lambda i, a: self._model_info_version(a))))

    def _model_info_version(self, addr: str) -> int | None:
        try:
            body = self.get(addr, protocol.MODEL_INFO)
        except ServerError as e:
            if "HTTP 404" not in str(e):
                raise
            body = self.get(addr, protocol.MODEL_INFO_LEGACY)
        return protocol.parse_model_info_version(body)

    # ---- versions -----------------------------------------------------------------------------
    def get_version(self) -> int:
        with self._lock:
            return self._version

    def set_version(self, version: int) -> None:
        """The version new tokens are attributed to when a server reports none; weight updates
        that pass a version set it on the servers too."""
        with self._lock:
            self._version = int(version)

    # ---- pause / continue ---------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def pause(self) -> dict[str, float]:
        """Pause generation on every server (pause_mode); returns what the servers say it cost
        (see pause_report)."""
        self._paused.set()  # first: an aborted request must wait, not resubmit at once
        body = protocol.pause_payload(self.pause_mode)
        return pause_report(self.post_all(protocol.PAUSE, body, CONTROL_TIMEOUT_S))

    def resume(self) -> None:
        self.post_all(protocol.CONTINUE, protocol.continue_payload(), CONTROL_TIMEOUT_S)
        self._paused.clear()

    def _paused_call(self, fn: Callable[[], Any]) -> Any:
        """Run fn with generation paused, unless the caller already paused."""
        paused_here = not self.paused
        if paused_here:
            self.pause()
        try:
            return fn()
        finally:
            if paused_here:
                self.resume()

    # ---- weights ------------------------------------------------------------------------------
    def update_weights(self, meta: WeightUpdateMeta) -> list[dict]:
        """Disk update: every server loads meta.path, then the version becomes meta.version.
        With meta.lora_name (actor.lora_push=adapter) meta.path is a peft adapter folder, loaded
        under that name (see _update_adapter). Returns the servers' answers."""
        if meta.type != "disk":
            raise ValueError(
                f"update_weights takes disk updates, not {meta.type!r}: use "
                "update_weights_from_distributed or update_weights_from_tensor"
            )
        if not meta.path:
            raise ValueError("WeightUpdateMeta(type='disk') needs path: the saved Hugging Face folder")
        if meta.lora_name is not None:
            return self._paused_call(lambda: self._update_adapter(meta))
        body = protocol.disk_update_payload(meta.path, meta.version)
        return self._paused_call(lambda: self._apply(protocol.UPDATE_FROM_DISK, body, meta.version))

    def _apply(self, route: str, body_of, version: int | None) -> list[dict]:
        answers = self._checked(route, body_of)
        if version is not None:
            self.set_version(version)
        return answers

    def _update_adapter(self, meta: WeightUpdateMeta) -> list[dict]:
        """Load the adapter, set the version, switch requests to it, unload the previous one
        (all while paused, so no request names an adapter that is gone)."""
        answers = self._checked(protocol.LOAD_LORA, protocol.load_lora_payload(meta.lora_name, meta.path))
        if meta.version is not None:
            self._checked(protocol.UPDATE_WEIGHT_VERSION, protocol.weight_version_payload(meta.version))
            self.set_version(meta.version)
        previous, self.lora_name = self.lora_name, meta.lora_name
        if previous is not None and previous != meta.lora_name:
            self._checked(protocol.UNLOAD_LORA, protocol.unload_lora_payload(previous))
        return answers

    @property
    def group_world_size(self) -> int:
        """Ranks of a distributed update group: the trainer (rank 0) plus every server's ranks."""
        return 1 + len(self.addrs) * self.ranks_per_server

    def init_weights_update_group(self, meta: WeightUpdateMeta) -> Future:
        """Every server joins the trainer's broadcast group (server i owns ranks
        1 + i * ranks_per_server ...); resolves once all joined, which needs the trainer to join
        concurrently."""
        tp, world = self.ranks_per_server, self.group_world_size
        return self._bg.submit(
            self._checked,
            protocol.INIT_GROUP,
            lambda i, a: protocol.init_group_payload(meta, rank_offset=1 + i * tp, world_size=world),
        )

    def update_weights_from_distributed(self, meta: WeightUpdateMeta) -> Future:
        """Every server receives meta.names/dtypes/shapes from the trainer's broadcast; resolves
        to the answers once loaded (the trainer broadcasts meanwhile). Pauses generation unless
        the caller did."""
        body = protocol.distributed_update_payload(meta)
        return self._bg.submit(
            self._paused_call, lambda: self._apply(protocol.UPDATE_FROM_DISTRIBUTED, body, meta.version)
        )

    def destroy_weights_update_group(self, meta: WeightUpdateMeta) -> Future:
        return self._bg.submit(self._checked, protocol.DESTROY_GROUP, protocol.destroy_group_payload(meta.group_name))

    def update_weights_from_tensor(self, meta: WeightUpdateMeta, named_tensors: list) -> list[dict]:
        """Servers on the trainer's own device(s) copy `named_tensors` ((HF name, tensor) pairs)
        through CUDA IPC handles (shared memory on CPU); the tensors must stay alive until this
        returns. Every tensor-parallel rank of a server gets the full tensors. Pauses generation
        unless the caller did."""
        from areal.utils.tensor_ipc import serialize_named_tensors

        text = serialize_named_tensors(named_tensors)
        body = protocol.tensor_update_payload(
            [text] * self.ranks_per_server, version=meta.version, flush_cache=meta.flush_cache
        )
        return self._paused_call(lambda: self._apply(protocol.UPDATE_FROM_TENSOR, body, meta.version))

    # ---- memory hand-off ----------------------------------------------------------------------
    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Servers free their KV cache and/or move their weights off the device (tags among
        kv_cache, weights; None: both); generation must be paused and idle."""
        self.post_all(protocol.RELEASE_MEMORY, protocol.memory_payload(tags, protocol.RELEASE_MEMORY))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.post_all(protocol.RESUME_MEMORY, protocol.memory_payload(tags, protocol.RESUME_MEMORY))
