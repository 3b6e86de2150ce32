"""DeepEP's normal kernels as the planner charges them (`moe_dispatcher = "deepep"`): the
copies a token makes, against brute force and DeepEP's own benchmark routing, and the
bandwidths against DeepEP's README and an independent measurement."""

from __future__ import annotations

from itertools import combinations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.comm.fabric import fabric_of
from planner.cost.moe import (
    DEEPEP_NVLINK_FRACTION,
    DEEPEP_RDMA_GBPS,
    deepep_times,
    expected_groups_hit,
)
from planner.cost.shapes import Shard
from planner.spec import Cluster, ModelSpec


@pytest.mark.parametrize("experts, top_k, groups", [(8, 2, 4), (12, 3, 3), (16, 4, 8), (10, 5, 2)])
def test_groups_hit_against_every_choice_of_experts(experts, top_k, groups):
    size = experts // groups
    choices = list(combinations(range(experts), top_k))
    mean = sum(len({e // size for e in choice}) for choice in choices) / len(choices)
    assert expected_groups_hit(experts, top_k, groups) == pytest.approx(mean)


def test_groups_hit_against_deepeps_benchmark_routing():
    # tests/test_internode.py: scores = randn().abs() + 1, top-k; rdma_idx = topk_idx // (E / nodes)
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    experts, top_k, nodes, tokens = 128, 8, 4, 200_000
    scores = torch.randn(tokens, experts, generator=gen).abs() + 1
    topk = scores.topk(top_k, dim=-1).indices
    node = topk // (experts // nodes)
    hit = torch.zeros(tokens, nodes, dtype=torch.bool).scatter_(1, node, True).sum(dim=1).double().mean().item()
    assert expected_groups_hit(experts, top_k, nodes) == pytest.approx(hit, rel=2e-3)


def _cluster(gpu: str, gpus: int) -> Cluster:
    return Cluster.of(resolve_gpu(gpu), gpus, gpus_per_node=8)


def _moe(experts: int, top_k: int, hidden: int) -> ModelSpec:
    return resolve_model("qwen3-235b-a22b").model_copy(
        update={"hidden_size": hidden, "num_experts": experts, "moe_top_k": top_k}
    )


def test_internode_time_is_the_readme_bandwidth_over_node_copies():
    # DeepEP's README setting at EP 32 on H800 (4096 tokens, hidden 7168, top-8 of 256, BF16
    # combine): the combine moves tokens x E[nodes hit] x hidden x 2 bytes at 57 GB/s
    spec, fabric = _moe(256, 8, 7168), fabric_of(_cluster("h800", 32))
    shard = Shard(mbs=1, seq=4096, tp=1, cp=1, sequence_parallel=False, ep=32, etp=1)
    dispatch, combine = deepep_times(spec, shard, 2, 1.0, 8, fabric.nvlink_busbw, fabric.nic_busbw)
    moved = 4096 * expected_groups_hit(256, 8, 4) * 7168 * 2
    assert combine == pytest.approx(moved / (DEEPEP_RDMA_GBPS[32][1] * 1e9))
    assert dispatch == pytest.approx(moved / (DEEPEP_RDMA_GBPS[32][0] * 1e9))


def test_intranode_rate_on_h800_is_the_readme_and_on_eighteen_links_within_3pct_of_h20():
    # README: 153 GB/s dispatch on H800 (8 NVLinks); DeepEP issue #16: 337.35 GB/s measured by
    # test_intranode.py on H20 (18 NVLinks, as the H100 SXM)
    spec = _moe(128, 8, 4096)
    shard = Shard(mbs=1, seq=4096, tp=1, cp=1, sequence_parallel=False, ep=8, etp=1)
    moved = 4096 * expected_groups_hit(128, 8, 8) * 4096 * 2
    for gpu, measured in (("h800", 153.0), ("h100", 337.35)):
        fabric = fabric_of(_cluster(gpu, 8))
        dispatch, _ = deepep_times(spec, shard, 2, 1.0, 8, fabric.nvlink_busbw, fabric.nic_busbw)
        rate = moved / dispatch / 1e9
        assert rate == pytest.approx(measured, rel=0.03)
    assert DEEPEP_NVLINK_FRACTION[0] * 164.8 == pytest.approx(153.0)


def test_busiest_rank_scales_with_the_imbalance_and_tensor_parallel_splits_the_tokens():
    spec = _moe(128, 8, 4096)
    fabric = fabric_of(_cluster("h100", 256))
    base = Shard(mbs=1, seq=4096, tp=1, cp=1, sequence_parallel=False, ep=32, etp=1)
    one = deepep_times(spec, base, 2, 1.0, 8, fabric.nvlink_busbw, fabric.nic_busbw)
    busy = deepep_times(spec, base, 2, 1.25, 8, fabric.nvlink_busbw, fabric.nic_busbw)
    assert busy == pytest.approx(tuple(1.25 * t for t in one))
    tp2 = Shard(mbs=1, seq=4096, tp=2, cp=1, sequence_parallel=True, ep=32, etp=1)
    assert deepep_times(spec, tp2, 2, 1.0, 8, fabric.nvlink_busbw, fabric.nic_busbw) == pytest.approx(
        tuple(t / 2 for t in one)
    )
