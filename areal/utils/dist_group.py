"""A named process group outside the default one: how weights travel from trainer to servers.

Shared by the trainer (rank 0 of the group) and the built-in server (ranks 1..), and
wire-compatible with SGLang's `/init_weights_update_group`.
"""

from __future__ import annotations

from datetime import timedelta


def init_custom_process_group(
    *,
    backend: str,
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    timeout_s: float = 600.0,
):
    """A named process group outside the default one, wire-compatible with SGLang's servers.

    SGLang's side: rendezvous(tcp://addr:port) -> TCPStore -> PrefixStore(group_name) ->
    _new_process_group_helper. We build the same TCPStore directly instead of calling
    rendezvous(): under torchrun, rendezvous() sees TORCHELASTIC_USE_AGENT_STORE and makes rank 0
    a store *client* of a server that nobody starts, which hangs forever.
    """
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout, multi_tenant=True
    )
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], dist.Backend(backend), store, group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg
