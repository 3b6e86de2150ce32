"""The per-step terms after the backward (planner/cost/step.py) against closed forms, and the
bucketed-overlap formula against a brute-force replay of the buckets on one stream."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_gpu
from planner.cost import step
from planner.cost.comm import Network
from planner.cost.compute import AnalyticCompute
from planner.spec import Cluster

GPU = resolve_gpu("h100")
COMPUTE = AnalyticCompute(GPU)
BW = GPU.hbm_bw_gbps * 1e9 * GPU.efficiency.hbm
OVERHEAD = GPU.efficiency.kernel_overhead_us * 1e-6
NET = Network.of(Cluster.of(GPU, 64))
"""The collectives' own times are tests/cost/test_comm.py's and test_nccl_tests.py's; here
each term is checked to charge the right collective, group and bytes."""
PER_LAUNCH = 2048 * 32 * 320


def test_multi_tensor_launches_one_per_320_chunks_of_65536():
    assert step.multi_tensor_launches(0) == 0
    assert step.multi_tensor_launches(1) == 1
    assert step.multi_tensor_launches(PER_LAUNCH) == 1
    assert step.multi_tensor_launches(PER_LAUNCH + 1) == 2
    assert step.multi_tensor_launches(1e9) == math.ceil(1e9 / 20_971_520)


@pytest.mark.parametrize(
    ("zero", "dp", "owned", "bytes_per_param"),
    [
        (0, 8, 1e9, 28 + 6),  # every parameter, Adam then the fp32 -> bf16 copy
        (1, 8, 1e9 / 8, 28 + 6),  # distributed optimizer: the shard
        (3, 8, 1e9 / 8, 28),  # FSDP keeps fp32 parameters: no copy
    ],
)
def test_adam_is_memory_bound_over_the_owned_shard_plus_launches(zero, dp, owned, bytes_per_param):
    launches = math.ceil(owned / PER_LAUNCH) * (2 if bytes_per_param == 34 else 1)
    expected = owned * bytes_per_param / BW + launches * OVERHEAD
    assert step.adam_time(COMPUTE, 1e9, zero, dp) == pytest.approx(expected)


def test_grad_norm_reads_owned_grads_and_all_reduces_one_value():
    params = 2e9
    # TP 8 inside one node, no DP, no PP: the model-parallel group is the TP group
    local = params * 4 / BW + math.ceil(params / PER_LAUNCH) * OVERHEAD
    expected = local + NET.all_reduce(4, 8, 1)
    assert step.grad_norm_time(COMPUTE, NET, params, 8, 1, 1, 1, 0) == pytest.approx(expected)
    # the distributed optimizer reduces its statistics over DP too (here 4 nodes, one GPU each
    # in the DP group, stride 8) and reads only its shard of the grads
    owned = params / 4
    local = owned * 4 / BW + math.ceil(owned / PER_LAUNCH) * OVERHEAD
    expected = local + NET.all_reduce(4, 8, 1) + NET.all_reduce(4, 4, 8)
    assert step.grad_norm_time(COMPUTE, NET, params, 8, 1, 4, 1, 1) == pytest.approx(expected)


def test_loss_scale_check_only_for_fp16():
    assert step.loss_scale_time(COMPUTE, NET, "bf16", 1e9, 8, 1, 4, 2, 1) == 0.0
    owned = 1e9 / 4
    local = owned * 8 / BW + math.ceil(owned / PER_LAUNCH) * OVERHEAD
    reduce = step.grad_stats_all_reduce(NET, 8, 1, 4, 2, 1)
    assert step.loss_scale_time(COMPUTE, NET, "fp16", 1e9, 8, 1, 4, 2, 1) == pytest.approx(local + reduce)


def test_tied_embedding_all_reduce_between_two_ranks_of_different_nodes():
    assert step.tied_embedding_time(NET, 50_000, 4096, 4, 8, 1, 2, 1) == 0.0
    nbytes = 4 * 50_000 * 4096 / 8
    # first and last of 4 stages, TP 8 DP 2: 2 ranks 48 apart, on different nodes
    expected = NET.all_reduce(nbytes, 2, 8 * 2 * 3)
    assert step.tied_embedding_time(NET, 50_000, 4096, 4, 8, 1, 2, 4) == pytest.approx(expected)
    assert NET.placement(2, 48).num_nodes == 2
    # first and last stage in the same node (TP 1, DP 1, PP 4): NVLink, faster
    nbytes = 4 * 50_000 * 4096
    inside = step.tied_embedding_time(NET, 50_000, 4096, 4, 1, 1, 1, 4)
    assert inside == pytest.approx(NET.all_reduce(nbytes, 2, 3))
    assert inside < NET.all_reduce(nbytes, 2, 8)


def _replay_buckets(sizes, total_s, window_s):
    """Gradient buckets, first ready first: bucket k is ready when the compute has produced
    all grads up to it, each runs alone on the comm stream; seconds after the window ends."""
    params = sum(sizes)
    ready = stream = produced = 0.0
    for size in sizes:
        produced += size
        ready = window_s * produced / params
        stream = max(stream, ready) + total_s * size / params
    return max(0.0, stream - window_s)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.floats(0.1, 5.0), st.floats(0.05, 3.0), st.floats(0.0, 10.0), st.floats(0.0, 5.0))
def test_bucketed_exposure_matches_a_replay_of_the_buckets(count, bucket, tail_scale, total_s, window_s):
    """Equal buckets but the last (any size): the closed form is the replay's exact result."""
    tail = bucket * tail_scale
    sizes = [bucket] * count + [tail]
    params = sum(sizes)
    got = step.exposed_after_window(total_s, window_s, params, bucket, tail)
    assert got == pytest.approx(_replay_buckets(sizes, total_s, window_s), abs=1e-12)


def test_one_bucket_is_never_hidden_and_a_long_window_hides_all_but_the_last():
    # a single bucket (M = 1 of a small model): nothing overlaps
    assert step.exposed_after_window(2.0, 100.0, 10.0, 10.0, 10.0) == 2.0
    # ten buckets, a long window: only the last bucket's share stays exposed
    assert step.exposed_after_window(2.0, 100.0, 10.0, 1.0, 1.0) == pytest.approx(0.2)
    # a short window: the first bucket waits a tenth of it, the rest streams behind
    assert step.exposed_after_window(2.0, 1.0, 10.0, 1.0, 1.0) == pytest.approx(2.0 - 0.9)
