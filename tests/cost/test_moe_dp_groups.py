"""Expert gradients reduce over the expert data-parallel group (EDP = TP x CP x DP / (EP x
ETP), Megatron's MoE parallel folding), dense ones over DP x CP; the optimizer steps the
shard each GPU owns of each. Checked where the folding leaves no expert replica (EDP = 1:
nothing to reduce for the experts) and where it leaves DP x CP of them (EP x ETP = TP)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import step
from planner.cost.model import CostModel, CostOptions
from planner.layout import Layout
from planner.predict import after_backward_times, chunk_costs, exposed_dp_time
from planner.spec import Cluster

SEQ = 4096


def model():
    options = CostOptions.of(overlap_grad_reduce=False, overlap_param_gather=False)
    return CostModel(resolve_model("mixtral-8x7b"), Cluster.of(resolve_gpu("h100"), 16), options)


def layout(ep: int, etp: int) -> Layout:
    return Layout(
        tp=2,
        pp=2,
        dp=4,
        cp=1,
        vpp=1,
        mbs=1,
        num_microbatches=8,
        schedule="1f1b",
        recompute=("full",) * 2,
        sequence_parallel=True,
        zero_stage=1,
        stage_layers=(((0, 16),), ((16, 32),)),
        ep=ep,
        etp=etp,
    )


def test_no_expert_replica_means_only_dense_grads_are_reduced():
    """EP 8 x ETP 1 = TP 2 x DP 4: every GPU holds experts no other holds (EDP 1). Rank 1
    (one bucket, overlap off) reduce-scatters and all-gathers only its dense weights over DP."""
    m, lay = model(), layout(8, 1)
    costs = chunk_costs(m, lay, SEQ)
    dense = costs.params[1] - costs.expert_params[1]
    assert costs.expert_params[1] > dense > 0
    expected = m.network.reduce_scatter(4 * dense, 4, 2) + m.network.all_gather(2 * dense, 4, 2)
    assert exposed_dp_time(m, lay, costs, 1) == pytest.approx(expected, rel=1e-12)
    owned = dense / 4 + costs.expert_params[1]  # the experts' whole optimizer state stays here
    tail = after_backward_times(m, lay, costs.params, costs.expert_params)
    assert tail["optimizer"] == pytest.approx(step.adam_time(m.analytic, owned, 1, 1), rel=1e-12)


def test_experts_folded_over_tp_reduce_over_dp_too():
    """EP 2 x ETP 1 with TP 2: EDP = 4, the DP group's size but at stride EP x ETP = 2 —
    the same ranks as DP here, so one reduction of all weights over DP is the same time."""
    m, lay = model(), layout(2, 1)
    costs = chunk_costs(m, lay, SEQ)
    dense, experts = costs.params[1] - costs.expert_params[1], costs.expert_params[1]
    net = m.network
    expected = sum(net.reduce_scatter(4 * p, 4, 2) + net.all_gather(2 * p, 4, 2) for p in (dense, experts))
    assert exposed_dp_time(m, lay, costs, 1) == pytest.approx(expected, rel=1e-12)
    tail = after_backward_times(m, lay, costs.params, costs.expert_params)
    assert tail["optimizer"] == pytest.approx(step.adam_time(m.analytic, costs.params[1] / 4, 1, 1), rel=1e-12)


def test_more_expert_parallelism_shrinks_the_expert_reduction():
    """EP 8 leaves no expert gradient to reduce, EP 2 a DP-wide one over 4 times the expert
    weights per GPU: the exposed DP time falls as EP grows."""
    m = model()
    wide, narrow = layout(8, 1), layout(2, 1)
    wide_costs, narrow_costs = chunk_costs(m, wide, SEQ), chunk_costs(m, narrow, SEQ)
    assert exposed_dp_time(m, wide, wide_costs, 1) < exposed_dp_time(m, narrow, narrow_costs, 1)
