"""The broadcast group of distributed weight updates, owned by the servers' control.

Trainer rank 0 and the servers form one process group (trainer = rank 0, server i takes ranks
1 + i * tp .. i * tp + tp), joined through POST /init_weights_update_group. Then, bucket by bucket,
the servers are told which tensors come (POST /update_weights_from_distributed {names, dtypes,
shapes, ...}) while rank 0 broadcasts the full (unsharded) tensors in that order. The group lives
across updates and is torn down with the control.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import replace
from typing import Any

from areal.api.weights import WeightUpdateMeta
from areal.infra.ports import free_port

logger = logging.getLogger(__name__)

# How long trainer rank 0 waits for every server to join the weight-update group.
JOIN_TIMEOUT_S = 120.0


class BroadcastGroup:
    """Trainer rank 0's side of the group: join it beside the servers, broadcast buckets, destroy.

    `meta` names the rendezvous (master_address, master_port: 0 picks a free one, group_name,
    backend). NCCL broadcasts from this process's current CUDA device; gloo from host memory."""

    def __init__(self, control: Any, meta: WeightUpdateMeta):  # control: the ServerControl that owns it
        from areal.utils.dist_group import init_custom_process_group

        self.control = control
        self.meta = replace(meta, master_port=meta.master_port or free_port(meta.master_address))
        self.device = "cuda" if meta.backend == "nccl" else "cpu"
        # Servers block in the rendezvous until rank 0 joins, so their requests run meanwhile;
        # rank 0 joins in a thread so that a server refusing the request fails fast instead of
        # leaving us in the rendezvous until its timeout.
        pending = control.init_weights_update_group(self.meta)
        joined: Future = Future()

        def join() -> None:
            try:
                joined.set_result(
                    init_custom_process_group(
                        timeout_s=control.weight_timeout_s,
                        backend=self.meta.backend,
                        master_address=self.meta.master_address,
                        master_port=self.meta.master_port,
                        world_size=control.group_world_size,
                        rank=0,
                        group_name=self.meta.group_name,
                    )
                )
            except BaseException as exc:  # handed to the waiting thread below
                joined.set_exception(exc)

        threading.Thread(target=join, daemon=True, name="weight-update-join").start()
        self.group = self._await_join(joined, pending)
        logger.info("weight update group %r ready: world %d", self.meta.group_name, control.group_world_size)

    def _await_join(self, joined: Future, pending: Future) -> Any:
        meta = self.meta
        done, _ = wait([joined, pending], timeout=JOIN_TIMEOUT_S, return_when=FIRST_EXCEPTION)
        for f in done:
            f.result()  # raises the first failure (e.g. a server refusing the request)
        if not joined.done():
            raise TimeoutError(
                f"the servers did not join weight update group {meta.group_name!r} at "
                f"{meta.master_address}:{meta.master_port} within {JOIN_TIMEOUT_S:.0f} s; they must build the "
                "group like SGLang (TCPStore wrapped in PrefixStore(group_name)) and reach that address"
            )
        pending.result(timeout=JOIN_TIMEOUT_S)
        return joined.result()

    def send_bucket(self, bucket: list[tuple[str, Any]], version: int | None) -> list[dict]:
        """Announce the bucket to the servers, then broadcast its tensors in the same order;
        returns the servers' replies (after they applied the bucket)."""
        import torch.distributed as dist

        announced = replace(
            self.meta,
            version=version,
            names=[n for n, _ in bucket],
            dtypes=[str(t.dtype).removeprefix("torch.") for _, t in bucket],
            shapes=[list(t.shape) for _, t in bucket],
        )
        pending = self.control.announce_broadcast(announced)
        for _, tensor in bucket:
            dist.broadcast(tensor.to(self.device).contiguous(), src=0, group=self.group)
        return pending.result(timeout=self.control.weight_timeout_s)

    def destroy(self, timeout_s: float = 60.0) -> None:
        """Tear the group down on both sides at once (a side waiting for the other to finish its
        destroy first could deadlock); server errors are logged, not raised."""
        import torch.distributed as dist

        pending = self.control.destroy_weights_update_group(self.meta)
        dist.destroy_process_group(self.group)
        try:
            pending.result(timeout=timeout_s)
        except Exception as exc:
            logger.warning("a server did not destroy weight update group %r: %s", self.meta.group_name, exc)
