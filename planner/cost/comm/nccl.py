"""Collective times as NCCL models them: per algorithm and protocol, latency + bytes / bandwidth,
and NCCL runs the fastest (src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime).

A group has n ranks, k of them on each of N = n / k nodes. Bandwidths are bus bandwidths per GPU
(GB/s, nccl-tests' busbw); times are microseconds without the launch.

- ring: n - 1 steps per pass (two passes for an all-reduce), each over NVLink or, N - 1 of them
  per pass, over the network. Its bus bandwidth is the NVLink's inside a node, and across nodes
  the smaller of the NVLink and the group's NICs on a node: k rails, one per GPU (a DP group
  strided across nodes, k = 1, gets one rail). LL runs at half the link (capped by NCCL's LL
  ceiling), LL128 at 120/128, Simple at the link.
- tree (all-reduce): a chain inside the node and a double binary tree across nodes, latency
  growing with k - 1 + log2 N; half the bandwidth of a ring for the same bus bandwidth, with
  NCCL's medium-size correction table.
- NVLS (all-reduce on one node, NVSwitch with NVLink SHARP): the switch reduces and multicasts,
  so each GPU's port carries the buffer once each way: algorithm bandwidth = NVLink x NCCL's
  nvlsEfficiency. Across nodes, NVLS tree: NVLS inside the node, a tree over the NICs.
- all-gather / reduce-scatter: ring (NCCL's NVLS and PAT variants are not modelled: the ring
  is as fast or faster for the sizes a training step moves).
- broadcast: a pipelined chain along the ring (NCCL runs no other algorithm for it), n steps of
  one link's latency each and the ring's bus bandwidth.
"""

from __future__ import annotations

import math

from planner.cost.comm.fabric import LL, LL128, SIMPLE, Fabric


def _log2i(n: int) -> int:
    return max(0, int(n).bit_length() - 1)


def _ll_ceiling(f: Fabric, nodes: int) -> float:
    return f.ll_max_busbw[min(nodes, 3) - 1]


def _graph_busbw(f: Fabric, k: int, nodes: int) -> float:
    """Bus bandwidth of the ring/tree graph: NVLink inside a node, the group's k rails across."""
    return f.nvlink_busbw if nodes == 1 else min(f.nvlink_busbw, k * f.nic_busbw)


def _ring_busbw(f: Fabric, proto: int, graph: float, nodes: int) -> float:
    c = f.nccl
    if proto == LL:
        return min(_ll_ceiling(f, nodes), graph * c.ring_ll_fraction)
    if proto == LL128:
        return graph * c.ring_ll128_fraction
    return graph


def _ring_latency(f: Fabric, proto: int, steps: int, inter_steps: int, k: int, nodes: int) -> float:
    """NCCL's ring latency: a base per call, then one hardware latency per step."""
    c = f.nccl
    intra = c.nvlink_latency_us["ring"][proto]
    if nodes > 1:
        intra = max(intra, f.net_overhead_us * (3 if proto == SIMPLE else 1))
    inter = (c.net_latency_us["tree"] if k == 1 else c.net_latency_us["ring"])[proto]
    return c.base_latency_us["ring"][proto] + (steps - inter_steps) * intra + inter_steps * inter


def _tree_correction(f: Fabric, proto: int, nbytes: float) -> float:
    index = _log2i(int(nbytes) >> 6)
    row = f.nccl.tree_correction[proto]
    return row[index] if int(nbytes) >= 64 and index < len(row) - 1 else 1.0


def ring_all_reduce_us(f: Fabric, nbytes: float, n: int, k: int, proto: int) -> float:
    """Ring all-reduce of nbytes with one protocol."""
    nodes = n // k
    busbw = _ring_busbw(f, proto, _graph_busbw(f, k, nodes), nodes)
    latency = _ring_latency(f, proto, 2 * (n - 1), 2 * (nodes - 1), k, nodes)
    if nodes > 1 and proto == SIMPLE:
        latency *= f.nccl.ring_simple_plateau
    return latency + 2 * (n - 1) / n * nbytes / (busbw * 1e3)


def tree_all_reduce_us(f: Fabric, nbytes: float, n: int, k: int, proto: int) -> float:
    """Tree all-reduce (chain in the node, double binary tree across nodes), one protocol."""
    c, nodes = f.nccl, n // k
    busbw = _graph_busbw(f, k, nodes) * c.tree_fraction
    if proto == LL:
        busbw = min(busbw * c.tree_ll_fraction, _ll_ceiling(f, nodes))
    elif proto == LL128:
        busbw *= c.tree_ll128_fraction_one_node if nodes == 1 else c.tree_ll128_fraction_nodes
    algbw = 0.5 * busbw * _tree_correction(f, proto, nbytes)
    latency = c.base_latency_us["tree"][proto] + 2 * (
        (k - 1) * c.nvlink_latency_us["tree"][proto] + _log2i(nodes) * c.net_latency_us["tree"][proto]
    )
    return latency + nbytes / (algbw * 1e3)


def nvls_all_reduce_us(f: Fabric, nbytes: float, n: int, k: int) -> float:
    """NVLink SHARP all-reduce (NVLS tree across nodes); inf where the fabric has no SHARP."""
    if not f.nvls_efficiency or k < 2:
        return math.inf
    c, nodes = f.nccl, n // k
    algbw = f.nvlink_busbw * f.nvls_efficiency
    if nodes == 1:
        latency = c.nvlink_latency_us["nvls"][SIMPLE]
    else:  # the node's k rails carry the reduced buffer; NCCL doubles them on <= 2 nodes
        algbw = min(algbw, k * f.nic_busbw * (1.0 if nodes <= 2 else 0.5))
        latency = c.nvlink_latency_us["nvls_tree"][SIMPLE] + 2 * _log2i(nodes) * c.net_latency_us["nvls_tree"][SIMPLE]
    return latency + nbytes / (algbw * 1e3)


def all_reduce_us(f: Fabric, nbytes: float, n: int, k: int) -> float:
    """The fastest all-reduce NCCL has for this group and size."""
    best = nvls_all_reduce_us(f, nbytes, n, k)
    for proto in (LL, LL128, SIMPLE):
        best = min(best, ring_all_reduce_us(f, nbytes, n, k, proto), tree_all_reduce_us(f, nbytes, n, k, proto))
    return best


def all_gather_us(f: Fabric, nbytes: float, n: int, k: int) -> float:
    """Ring all-gather producing nbytes on each rank (reduce-scatter of nbytes costs the same)."""
    nodes = n // k
    graph = _graph_busbw(f, k, nodes)
    return min(
        _ring_latency(f, proto, n - 1, nodes - 1, k, nodes)
        + (n - 1) / n * nbytes / (_ring_busbw(f, proto, graph, nodes) * 1e3)
        for proto in (LL, LL128, SIMPLE)
    )


def broadcast_us(f: Fabric, nbytes: float, n: int, k: int) -> float:
    """Ring broadcast of nbytes from one rank to the n - 1 others, the fastest protocol.

    NCCL's model for a broadcast (ncclTopoTuneModel) charges n steps, each of one link's latency
    (over the network once the group spans nodes; Simple takes the tree's link latency), and
    moves the buffer at the ring's bus bandwidth. Its other branch, for graphs whose channels are
    all alike, charges a single link; the chain's first chunk still crosses n - 1 links before
    the last rank holds it, so the n-step form is the one taken."""
    c, nodes = f.nccl, n // k
    link = c.net_latency_us if nodes > 1 else c.nvlink_latency_us
    graph = _graph_busbw(f, k, nodes)
    best = math.inf
    for proto in (LL, LL128, SIMPLE):
        hop = link["tree" if proto == SIMPLE else "ring"][proto]
        latency = c.base_latency_us["ring"][proto] + n * hop
        best = min(best, latency + nbytes / (_ring_busbw(f, proto, graph, nodes) * 1e3))
    return best


def p2p_us(f: Fabric, nbytes: float, same_node: bool) -> float:
    """Send nbytes to one peer: LL up to NCCL's P2P LL threshold, Simple above; over NVLink or the
    GPU's own rail."""
    c = f.nccl
    proto = LL if nbytes <= c.p2p_ll_threshold_bytes else SIMPLE
    nodes = 1 if same_node else 2
    link = f.nvlink_busbw if same_node else f.nic_busbw
    hop = (c.nvlink_latency_us if same_node else c.net_latency_us)["ring"][proto]
    return c.base_latency_us["ring"][proto] + hop + nbytes / (_ring_busbw(f, proto, link, nodes) * 1e3)


def all_to_all_us(f: Fabric, nbytes: float, n: int, k: int) -> float:
    """All-to-all of an nbytes buffer per rank (nbytes / n to each peer): the NVLink carries the
    (k - 1) / n share for peers on the node, the GPU's rail the (n - k) / n share for the rest
    (nccl-tests #130: busbw tends to the NIC per GPU as nodes grow); one grouped launch."""
    nodes = n // k
    intra = (k - 1) / n * nbytes / (f.nvlink_busbw * 1e3)
    inter = (n - k) / n * nbytes / (f.nic_busbw * 1e3) if nodes > 1 else 0.0
    c = f.nccl
    hop = (c.net_latency_us if nodes > 1 else c.nvlink_latency_us)["ring"][SIMPLE]
    return c.base_latency_us["ring"][SIMPLE] + hop + max(intra, inter)
