"""The NCCL constants and node fabrics of planner/presets/networks.toml, resolved for a cluster."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from planner.spec import Cluster

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree")
LL, LL128, SIMPLE = 0, 1, 2
PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True, slots=True)
class NcclConstants:
    """NCCL's tuning-model constants (src/graph/tuning.cc); per-algorithm tuples are indexed
    by protocol (LL, LL128, Simple), latencies in microseconds."""

    base_latency_us: dict[str, tuple[float, float, float]]
    nvlink_latency_us: dict[str, tuple[float, float, float]]
    net_latency_us: dict[str, tuple[float, float, float]]
    ring_ll_fraction: float
    ring_ll128_fraction: float
    tree_fraction: float
    tree_ll_fraction: float
    tree_ll128_fraction_one_node: float
    tree_ll128_fraction_nodes: float
    ring_simple_plateau: float
    tree_correction: tuple[tuple[float, ...], ...]
    nic_fraction: float
    p2p_ll_threshold_bytes: float


@dataclass(frozen=True, slots=True)
class Fabric:
    """One cluster's collective fabric as NCCL models it (bandwidths in GB/s per GPU)."""

    nvlink_busbw: float
    """Ring bus bandwidth inside a node: every NVLink of the GPU, at NCCL's per-link rate."""
    nic_busbw: float
    """The GPU's own scale-out rail (its NIC) at NCCL's modelled fraction of line rate."""
    nvls_efficiency: float
    """Fraction of the NVLink port NVLink SHARP achieves; 0 where the switch has no SHARP."""
    ll_max_busbw: tuple[float, float, float]
    """LL protocol ceiling on one node, two nodes, three or more nodes."""
    net_overhead_us: float
    """Host proxy cost per inter-node ring step (x3 for Simple)."""
    launch_us: float
    """Per-call launch cost: one kernel launch, the GPU preset's kernel_overhead_us."""
    nccl: NcclConstants


def _triples(table: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    return {algo: tuple(table[algo]) for algo in ALGORITHMS}  # type: ignore[misc]


@cache
def _data() -> dict[str, Any]:
    return tomllib.loads(resources.files("planner.presets").joinpath("networks.toml").read_text())


@cache
def nccl_constants() -> NcclConstants:
    """The [nccl] table of networks.toml."""
    t = _data()["nccl"]
    return NcclConstants(
        base_latency_us=_triples(t["base_latency_us"]),
        nvlink_latency_us=_triples(t["nvlink_latency_us"]),
        net_latency_us=_triples(t["net_latency_us"]),
        ring_ll_fraction=t["ring_ll_fraction"],
        ring_ll128_fraction=t["ring_ll128_fraction"],
        tree_fraction=t["tree_fraction"],
        tree_ll_fraction=t["tree_ll_fraction"],
        tree_ll128_fraction_one_node=t["tree_ll128_fraction_one_node"],
        tree_ll128_fraction_nodes=t["tree_ll128_fraction_nodes"],
        ring_simple_plateau=t["ring_simple_plateau"],
        tree_correction=tuple(tuple(row) for row in t["tree_correction"]),
        nic_fraction=t["nic_fraction"],
        p2p_ll_threshold_bytes=t["p2p_ll_threshold_bytes"],
    )


def fabric_name(gpu_name: str) -> str:
    """The networks.toml fabric a GPU preset sits in (`generic` when none is listed)."""
    return _data()["gpu"].get(gpu_name, "generic")


def fabric_of(cluster: Cluster) -> Fabric:
    """The cluster's fabric: the GPU's node design from networks.toml, its bandwidths scaled by
    any --intra-node-bw / --inter-node-bw override of the preset's and by the GPU's
    intra_node_comm / inter_node_comm factors (1.0 in the presets; a calibration may lower them)."""
    data, nccl = _data(), nccl_constants()
    fabric = data["fabric"][fabric_name(cluster.gpu.name)]
    gpu, eff = cluster.gpu, cluster.gpu.efficiency
    if fabric["nvlink_links"]:
        scale = cluster.intra_node_bw_gbps / gpu.intra_node_bw_gbps * eff.intra_node_comm
        nvlink = fabric["nvlink_links"] * fabric["nvlink_link_gbps"] * scale
        nic = cluster.inter_node_bw_gbps * nccl.nic_fraction * eff.inter_node_comm
    else:
        nvlink = cluster.intra_node_bw_gbps * eff.intra_node_comm
        nic = cluster.inter_node_bw_gbps * eff.inter_node_comm
    table, generation, cpu = data["nccl"], fabric["generation"], fabric["cpu_vendor"]
    return Fabric(
        nvlink_busbw=nvlink,
        nic_busbw=nic,
        nvls_efficiency=table["nvls_efficiency"].get(generation, 0.0) if fabric["nvls"] else 0.0,
        ll_max_busbw=(
            table["ll_max_busbw_one_node"][generation],
            table["ll_max_busbw_two_nodes"][cpu],
            table["ll_max_busbw_many_nodes"][cpu],
        ),
        net_overhead_us=table["net_overhead_us"][cpu],
        launch_us=eff.kernel_overhead_us,
        nccl=nccl,
    )
