"""Collectives against their textbook alpha-beta forms."""

from __future__ import annotations

import math

import pytest

from planner.cost.comm import (
    Link,
    Network,
    all_gather_time,
    flat_all_reduce_time,
    group_placement,
    p2p_time,
    reduce_scatter_time,
    ring_all_reduce_time,
    tree_all_reduce_time,
)

ALPHA, BETA = 5e-6, 100e9
LINK = Link(ALPHA, BETA)


@pytest.mark.parametrize("n", [2, 3, 8, 64])
@pytest.mark.parametrize("m", [1e3, 1e6, 1e9])
def test_ring_collectives_textbook(n, m):
    assert ring_all_reduce_time(m, n, LINK) == pytest.approx(2 * (n - 1) * ALPHA + 2 * (n - 1) / n * m / BETA)
    assert all_gather_time(m, n, LINK) == pytest.approx((n - 1) * ALPHA + (n - 1) / n * m / BETA)
    assert reduce_scatter_time(m, n, LINK) == all_gather_time(m, n, LINK)
    # an all-reduce is a reduce-scatter followed by an all-gather (Rabenseifner)
    assert ring_all_reduce_time(m, n, LINK) == pytest.approx(
        reduce_scatter_time(m, n, LINK) + all_gather_time(m, n, LINK)
    )
    assert tree_all_reduce_time(m, n, LINK) == pytest.approx(2 * math.ceil(math.log2(n)) * ALPHA + 2 * m / BETA)


def test_all_reduce_picks_tree_for_small_and_ring_for_large_messages():
    assert flat_all_reduce_time(1e3, 256, LINK) == tree_all_reduce_time(1e3, 256, LINK)
    assert flat_all_reduce_time(1e10, 8, LINK) == ring_all_reduce_time(1e10, 8, LINK)


def test_single_rank_costs_nothing():
    assert ring_all_reduce_time(1e9, 1, LINK) == 0 == all_gather_time(1e9, 1, LINK)
    assert p2p_time(1e6, LINK) == pytest.approx(ALPHA + 1e6 / BETA)


@pytest.mark.parametrize(
    "size,stride,per_node",
    [(8, 1, 8), (4, 2, 4), (16, 1, 8), (4, 8, 1), (8, 4, 2), (2, 8, 1), (1, 1, 1)],
)
def test_group_placement(size, stride, per_node):
    assert group_placement(size, stride, 8).per_node == per_node


def test_hierarchical_all_reduce_composition():
    intra, inter = Link(2e-6, 400e9), Link(5e-6, 50e9)
    net = Network(intra=intra, inter=inter, gpus_per_node=8)
    m = 1e9
    # 16 ranks, stride 1: 8 per node on 2 nodes
    expected = (
        reduce_scatter_time(m, 8, intra)
        + flat_all_reduce_time(m / 8, 2, inter)
        + all_gather_time(m, 8, intra)
    )
    assert net.all_reduce(m, 16, 1) == pytest.approx(expected)
    # inside one node it is flat over NVLink; one rank per node it is flat over IB
    assert net.all_reduce(m, 8, 1) == pytest.approx(flat_all_reduce_time(m, 8, intra))
    assert net.all_reduce(m, 4, 8) == pytest.approx(flat_all_reduce_time(m, 4, inter))
    # spanning nodes is never faster than staying in one
    assert net.all_reduce(m, 16, 1) > net.all_reduce(m, 8, 1)
