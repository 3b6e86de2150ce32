"""Collective and point-to-point communication times: the alpha-beta model.

A message of m bytes over a link of latency alpha (s) and bandwidth beta (bytes/s) takes
alpha + m / beta. The collectives over n ranks are the textbook forms (Thakur, Rabenseifner
and Gropp 2005; Chan et al. 2007), with m the full (unsharded) buffer size:

  ring all-reduce      2 (n-1) alpha + 2 (n-1)/n * m / beta
  tree all-reduce      2 ceil(log2 n) alpha + 2 m / beta        (pipelined binary tree)
  ring all-gather      (n-1) alpha + (n-1)/n * m / beta
  ring reduce-scatter  (n-1) alpha + (n-1)/n * m / beta
  point-to-point       alpha + m / beta

An all-reduce takes the faster of ring and tree, as NCCL picks per size. A group that spans
nodes with k > 1 members on each node runs hierarchically: reduce-scatter inside the node,
all-reduce of m/k across nodes (each GPU on its own NIC), all-gather inside the node.

Ranks are laid out with TP fastest, then CP, then DP, then PP (Megatron-LM's default
"tp-cp-ep-dp-pp" order), which decides which groups leave the node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.spec import Cluster


@dataclass(frozen=True, slots=True)
class Link:
    """One hop's cost: latency_s per message, bandwidth_Bps achieved per direction."""

    latency_s: float
    bandwidth_Bps: float


def p2p_time(nbytes: float, link: Link) -> float:
    """Point-to-point send of nbytes."""
    return link.latency_s + nbytes / link.bandwidth_Bps


def ring_all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of an nbytes buffer over n ranks."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps


def tree_all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Pipelined binary-tree all-reduce (reduce then broadcast) of nbytes over n ranks."""
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.latency_s + 2 * nbytes / link.bandwidth_Bps


def all_gather_time(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather producing an nbytes buffer on each of n ranks."""
    if n <= 1:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps


def reduce_scatter_time(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of an nbytes buffer over n ranks (each keeps nbytes / n)."""
    return all_gather_time(nbytes, n, link)


def all_to_all_time(nbytes: float, n: int, link: Link) -> float:
    """All-to-all where each of n ranks sends nbytes in all, nbytes / n to each peer (its own
    share stays): (n-1) alpha + (n-1)/n * m / beta."""
    if n <= 1:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps


def flat_all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """All-reduce on one link tier: the faster of ring and tree."""
    return min(ring_all_reduce_time(nbytes, n, link), tree_all_reduce_time(nbytes, n, link))


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """How a communication group of `size` ranks sits on the nodes."""

    size: int
    per_node: int
    """Members of the group that share a node."""

    @property
    def num_nodes(self) -> int:
        return self.size // self.per_node


def group_placement(size: int, stride: int, gpus_per_node: int) -> GroupPlacement:
    """Placement of a group whose consecutive members are `stride` ranks apart."""
    if size <= 1:
        return GroupPlacement(size=max(size, 1), per_node=max(size, 1))
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    while size % per_node:
        per_node -= 1
    return GroupPlacement(size=size, per_node=per_node)


@dataclass(frozen=True, slots=True)
class Network:
    """The two link tiers of a cluster, at their achieved bandwidth."""

    intra: Link
    inter: Link
    gpus_per_node: int

    @classmethod
    def of(cls, cluster: Cluster) -> Network:
        eff = cluster.gpu.efficiency
        return cls(
            intra=Link(
                cluster.intra_node_latency_us * 1e-6,
                cluster.intra_node_bw_gbps * 1e9 * eff.intra_node_comm,
            ),
            inter=Link(
                cluster.inter_node_latency_us * 1e-6,
                cluster.inter_node_bw_gbps * 1e9 * eff.inter_node_comm,
            ),
            gpus_per_node=cluster.gpus_per_node,
        )

    def placement(self, size: int, stride: int) -> GroupPlacement:
        return group_placement(size, stride, self.gpus_per_node)

    def all_reduce(self, nbytes: float, size: int, stride: int) -> float:
        """All-reduce of nbytes in a group of `size` ranks `stride` apart."""
        place = self.placement(size, stride)
        if place.num_nodes == 1:
            return flat_all_reduce_time(nbytes, size, self.intra)
        if place.per_node == 1:
            return flat_all_reduce_time(nbytes, size, self.inter)
        k = place.per_node
        return (
            reduce_scatter_time(nbytes, k, self.intra)
            + flat_all_reduce_time(nbytes / k, place.num_nodes, self.inter)
            + all_gather_time(nbytes, k, self.intra)
        )

    def all_gather(self, nbytes: float, size: int, stride: int) -> float:
        """All-gather (or, same cost, reduce-scatter) of an nbytes result buffer."""
        place = self.placement(size, stride)
        if place.num_nodes == 1:
            return all_gather_time(nbytes, size, self.intra)
        if place.per_node == 1:
            return all_gather_time(nbytes, size, self.inter)
        k = place.per_node
        return all_gather_time(nbytes / k, place.num_nodes, self.inter) + all_gather_time(
            nbytes, k, self.intra
        )

    def reduce_scatter(self, nbytes: float, size: int, stride: int) -> float:
        """Reduce-scatter of an nbytes input buffer (mirror of all_gather)."""
        return self.all_gather(nbytes, size, stride)

    def all_to_all(self, nbytes: float, size: int, stride: int) -> float:
        """All-to-all in which each of `size` ranks `stride` apart sends nbytes spread evenly
        over the group. Across nodes the share for peers on other nodes goes over the NICs
        while the node's own share crosses NVLink at the same time; the slower sets the time."""
        place = self.placement(size, stride)
        if place.num_nodes == 1:
            return all_to_all_time(nbytes, size, self.intra)
        k = place.per_node
        remote = (size - k) / size * nbytes / self.inter.bandwidth_Bps + (size - k) * self.inter.latency_s
        local = all_to_all_time(nbytes * k / size, k, self.intra)
        return max(remote, local)

    def p2p(self, nbytes: float, size: int, stride: int) -> float:
        """Send nbytes to the next member of a group of `size` ranks `stride` apart; the
        slowest hop sets the time, so any member on another node makes it inter-node."""
        link = self.intra if self.placement(size, stride).num_nodes == 1 else self.inter
        return p2p_time(nbytes, link)
