"""Where the run lives and what hardware it may use."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Section


class NameResolveConfig(Section):
    record_root: str | None = Field(
        None,
        description="Directory of the records through which processes find each other "
        "(name_resolve/servers.json: the servers' addresses; name_resolve/served_weights.json: the "
        "weights they serve); defaults to the run directory (must be on storage every node sees for "
        "multi-node runs).",
    )


class ClusterConfig(Section):
    fileroot: str = Field(
        "/tmp/areal/experiments", description="Root of run directories: {fileroot}/{experiment_name}/{trial_name}/."
    )
    n_nodes: int = Field(1, ge=1, description="Nodes available to the run.")
    n_gpus_per_node: int = Field(
        8, ge=1, description="Accelerators per node; with device=cpu, the number of process slots per node."
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="'auto' uses CUDA when the launching machine has a GPU, else CPU."
    )
    name_resolve: NameResolveConfig = Field(
        default_factory=NameResolveConfig, description="Where processes find each other's addresses."
    )
