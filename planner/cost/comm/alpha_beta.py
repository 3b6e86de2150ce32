"""Textbook alpha-beta collectives and how a group sits on the nodes.

The NCCL-shaped model (planner/cost/comm/nccl.py) replaces these for the planner's costs; they
stay as the closed-form reference its tests compare against.

A message of m bytes over a link of latency alpha (s) and bandwidth beta (bytes/s) takes
alpha + m / beta. The collectives over n ranks are the textbook forms (Thakur, Rabenseifner
and Gropp 2005; Chan et al. 2007), with m the full (unsharded) buffer size:

  ring all-reduce      2 (n-1) alpha + 2 (n-1)/n * m / beta
  tree all-reduce      2 ceil(log2 n) alpha + 2 m / beta        (pipelined binary tree)
  ring all-gather      (n-1) alpha + (n-1)/n * m / beta
  ring reduce-scatter  (n-1) alpha + (n-1)/n * m / beta
  point-to-point       alpha + m / beta

Ranks are laid out with TP fastest, then CP, then DP, then PP (Megatron-LM's default
"tp-cp-ep-dp-pp" order), which decides which groups leave the node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
