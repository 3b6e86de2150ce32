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


@pytest.mark.parametrize("schedule,pp,vpp", [("1f1b", 2, 1), ("1f1b", 4, 1), ("interleaved_1f1b", 4, 2),
                                             ("zb_h1", 4, 1)])
@pytest.mark.parametrize("dp,zero", [(2, 1), (8, 0), (16, 1)])
@pytest.mark.parametrize("m", [4, 16])
def test_bound_never_exceeds_the_predicted_step(schedule, pp, vpp, dp, zero, m):
    spec = resolve_model("llama3-8b")
    tp = 2
    model = CostModel(spec, Cluster.of(resolve_gpu("a100-80gb"), tp * pp * dp))
    layout = Layout(tp=tp, pp=pp, dp=dp, mbs=1, num_microbatches=m, schedule=schedule,
                    recompute=("none",) * pp, sequence_parallel=True, zero_stage=zero, vpp=vpp,
                    stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule))
    costs = chunk_costs(model, layout, SEQ)
    bound = _bound(model, layout, costs)
    step = predict(model, layout, dp * m, SEQ).step_time_s
    assert bound <= step * (1 + 1e-9)
    # the DP tail is what raised it: later ranks expose their whole single-bucket reduction
    assert exposed_dp_time(model, layout, costs, pp - 1) > 0
