"""Communication times of the collectives a training step runs, as NCCL runs them.

`Network` prices all-reduce, all-gather, reduce-scatter, broadcast, all-to-all and point-to-point sends in
a group of `size` ranks whose consecutive members are `stride` ranks apart. Ranks are laid out
with TP fastest, then CP, then DP, then PP (Megatron-LM's default order), which decides how many
members share a node (see `group_placement`). Each call costs one kernel launch plus NCCL's own
model of its fastest algorithm and protocol (planner/cost/comm/nccl.py) on the cluster's fabric
(planner/presets/networks.toml). Groups inside one node may use a measured curve instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from planner.cost.comm import nccl
from planner.cost.comm.buckets import grad_bucket_count, megatron_bucket_params
from planner.cost.comm.fabric import Fabric, fabric_of
from planner.cost.comm.placement import GroupPlacement, group_placement
from planner.spec import Cluster

__all__ = [
    "GroupPlacement",
    "MeasuredCurve",
    "Network",
    "OPS",
    "grad_bucket_count",
    "group_placement",
    "megatron_bucket_params",
]

MeasuredCurve = Callable[[float, int], float]
"""Seconds a collective of (nbytes, group size) took on one node, from a measured profile."""

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


class Network:
    """Collective times on one cluster; results are cached per (op, bytes, group shape)."""

    __slots__ = ("fabric", "gpus_per_node", "measured", "_cache")

    def __init__(self, fabric: Fabric, gpus_per_node: int, measured: Mapping[str, MeasuredCurve] | None = None):
        unknown = set(measured or {}) - set(OPS)
        if unknown:
            raise ValueError(f"measured curves for unknown collectives: {sorted(unknown)}; known: {OPS}")
        self.fabric = fabric
        self.gpus_per_node = gpus_per_node
        self.measured = dict(measured or {})
        self._cache: dict[tuple[str, float, int, int], float] = {}  # (op, bytes, size, stride)

    @classmethod
    def of(cls, cluster: Cluster, measured: Mapping[str, MeasuredCurve] | None = None) -> Network:
        """The cluster's network; `measured` curves replace the model for groups in one node."""
        return cls(fabric_of(cluster), cluster.gpus_per_node, measured)

    def placement(self, size: int, stride: int) -> GroupPlacement:
        return group_placement(size, stride, self.gpus_per_node)

    def _time(self, op: str, nbytes: float, size: int, stride: int) -> float:
        if size <= 1 or nbytes <= 0:
            return 0.0
        key = (op, nbytes, size, stride)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        place = self.placement(size, stride)
        curve = self.measured.get(op) if place.num_nodes == 1 else None
        if curve is not None:
            seconds = curve(nbytes, size)
        else:
            f = self.fabric
            micros = {
                "all_reduce": nccl.all_reduce_us,
                "all_gather": nccl.all_gather_us,
                "reduce_scatter": nccl.all_gather_us,
                "broadcast": nccl.broadcast_us,
                "all_to_all": nccl.all_to_all_us,
            }[op](f, nbytes, size, place.per_node)
            seconds = (f.launch_us + micros) * 1e-6
        self._cache[key] = seconds
        return seconds

    def all_reduce(self, nbytes: float, size: int, stride: int) -> float:
        """All-reduce of nbytes in a group of `size` ranks `stride` apart."""
        return self._time("all_reduce", nbytes, size, stride)

    def all_gather(self, nbytes: float, size: int, stride: int) -> float:
        """All-gather producing an nbytes buffer on each rank."""
        return self._time("all_gather", nbytes, size, stride)

    def reduce_scatter(self, nbytes: float, size: int, stride: int) -> float:
        """Reduce-scatter of an nbytes input buffer (each rank keeps nbytes / size)."""
        return self._time("reduce_scatter", nbytes, size, stride)

    def broadcast(self, nbytes: float, size: int, stride: int) -> float:
        """Broadcast of an nbytes buffer from one member to the rest of the group."""
        return self._time("broadcast", nbytes, size, stride)

    def all_to_all(self, nbytes: float, size: int, stride: int) -> float:
        """All-to-all of an nbytes buffer per rank, nbytes / size to each member."""
        return self._time("all_to_all", nbytes, size, stride)

    def p2p(self, nbytes: float, size: int, stride: int) -> float:
        """Send nbytes to the next member of a group of `size` ranks `stride` apart; the
        slowest hop sets the time, so any member on another node makes it inter-node."""
        if nbytes <= 0:
            return 0.0
        same_node = self.placement(size, stride).num_nodes == 1
        return (self.fabric.launch_us + nccl.p2p_us(self.fabric, nbytes, same_node)) * 1e-6
