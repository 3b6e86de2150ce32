"""The search's per-layout bound, with each rank's exposed DP communication added, never exceeds
the predicted step (so pruning with it cannot drop a better plan)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel
from planner.layout import Layout, even_stage_layers
from planner.predict import chunk_costs, exposed_dp_time, predict
from planner.search.search import _bound
from planner.spec import Cluster

SEQ = 4096


@pytest.mark.parametrize(
    "schedule,pp,vpp", [("1f1b", 2, 1), ("1f1b", 4, 1), ("interleaved_1f1b", 4, 2), ("zb_h1", 4, 1)]
)
@pytest.mark.parametrize("dp,zero", [(2, 1), (8, 0), (16, 1)])
@pytest.mark.parametrize("m", [4, 16])
def test_bound_never_exceeds_the_predicted_step(schedule, pp, vpp, dp, zero, m):
    spec = resolve_model("llama3-8b")
    tp = 2
    model = CostModel(spec, Cluster.of(resolve_gpu("a100-80gb"), tp * pp * dp))
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        mbs=1,
        num_microbatches=m,
        schedule=schedule,
        recompute=("none",) * pp,
        sequence_parallel=True,
        zero_stage=zero,
        vpp=vpp,
        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule),
    )
    costs = chunk_costs(model, layout, SEQ)
    bound = _bound(model, layout, costs)
    step = predict(model, layout, dp * m, SEQ).step_time_s
    assert bound <= step * (1 + 1e-9)
    # the DP tail is what raised it: later ranks expose their whole single-bucket reduction
    assert exposed_dp_time(model, layout, costs, pp - 1) > 0


@pytest.mark.parametrize(
    "schedule,pp,vpp", [("1f1b", 4, 1), ("interleaved_1f1b", 4, 2), ("zb_h1", 4, 1), ("chimera", 4, 2)]
)
@pytest.mark.parametrize("dp,zero", [(8, 0), (16, 1), (16, 3)])
def test_bound_against_a_threshold_prunes_exactly_what_the_full_bound_prunes(schedule, pp, vpp, dp, zero):
    """Given a threshold the bound may stop at its part without DP terms: never above the full
    bound, and at or over the threshold exactly when the full bound is."""
    spec = resolve_model("llama3-8b")
    tp = 2
    model = CostModel(spec, Cluster.of(resolve_gpu("a100-80gb"), tp * pp * dp))
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        mbs=1,
        num_microbatches=8,
        schedule=schedule,
        recompute=("none",) * pp,
        sequence_parallel=True,
        zero_stage=zero,
        vpp=vpp,
        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule),
    )
    costs = chunk_costs(model, layout, SEQ)
    full = _bound(model, layout, costs)
    without_dp = _bound(model, layout, costs, threshold=0.0)  # any bound reaches 0: the cheap one
    assert 0.0 < without_dp <= full
    if schedule in ("zb_h1", "chimera"):  # no backward in the chain: the DP tail of 8+ ranks shows
        assert without_dp < full
    for threshold in (0.5 * without_dp, without_dp, 0.5 * (without_dp + full), full, 1.5 * full):
        bound = _bound(model, layout, costs, threshold)
        assert bound <= full
        assert (bound >= threshold) == (full >= threshold)
