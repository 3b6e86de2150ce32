"""Overlap with interference: communication beside compute slows it by the SMs it holds."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.overlap import overlapped_extra_time
from planner.cost.shapes import Shard
from planner.layout import Layout, even_stage_layers
from planner.predict import predict
from planner.spec import Cluster


def test_closed_forms():
    # compute outlasts the comm: the compute slows by f x comm
    assert overlapped_extra_time(1.0, 5.0, 0.1) == pytest.approx(0.1)
    # comm outlasts compute / (1 - f): the comm's excess is exposed
    assert overlapped_extra_time(5.0, 1.0, 0.1) == pytest.approx(4.0)
    # a part that cannot overlap is exposed whole, the rest slows the compute
    assert overlapped_extra_time(1.0, 5.0, 0.1, exposed_s=0.2) == pytest.approx(0.2 + 0.1 * 0.8)
    # without interference: the exposed part or the comm's excess, as before
    assert overlapped_extra_time(1.0, 5.0, 0.0, exposed_s=0.2) == 0.2
    assert overlapped_extra_time(3.0, 1.0, 0.0, exposed_s=0.2) == 2.0


def test_total_time_matches_simulating_both_rates():
    """Compute at rate (1 - f) while the comm runs, full rate after: brute-force the finish."""
    f, comm, compute = 0.12, 0.7, 2.0
    done, t, dt = 0.0, 0.0, 1e-5
    while done < compute:
        done += dt * ((1 - f) if t < comm else 1.0)
        t += dt
    assert compute + overlapped_extra_time(comm, compute, f) == pytest.approx(max(t, comm), rel=1e-3)


def _llama_dp(interference: bool):
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    layout = Layout(
        tp=1,
        pp=1,
        dp=64,
        cp=1,
        vpp=1,
        mbs=1,
        num_microbatches=4,
        schedule="1f1b",
        recompute=("full",),
        sequence_parallel=False,
        zero_stage=1,
        stage_layers=even_stage_layers(spec.num_layers, 1, 1, "1f1b"),
    )
    model = CostModel(spec, cluster, CostOptions.of(interference=interference))
    return predict(model, layout, 256, 4096)


def test_dp_overlap_costs_the_sm_share_of_the_hidden_reduction():
    on, off = _llama_dp(True), _llama_dp(False)
    assert on.step_time_s > off.step_time_s
    extra = on.time_breakdown_s["dp_comm_exposed"] - off.time_breakdown_s["dp_comm_exposed"]
    assert 0 < extra < resolve_gpu("h100").efficiency.comm_sm_fraction * on.step_time_s


def test_tp_comm_overlap_slows_the_gemms_it_hides_behind():
    spec, shard = resolve_model("llama3-70b"), Shard(mbs=1, seq=8192, tp=8, sequence_parallel=True)
    cluster = Cluster.of(resolve_gpu("h100"), 8)
    costs = {
        i: CostModel(spec, cluster, CostOptions.of(tp_comm_overlap=1.0, interference=i)).layer_costs(
            "transformer", shard
        )
        for i in (True, False)
    }
    exposed_off = CostModel(spec, cluster, CostOptions.of(tp_comm_overlap=0.0)).layer_costs("transformer", shard)
    share = resolve_gpu("h100").efficiency.comm_sm_fraction
    assert costs[True].comm_forward_s == costs[False].comm_forward_s == 0.0
    assert costs[True].forward_s - costs[False].forward_s == pytest.approx(share * exposed_off.comm_forward_s)
