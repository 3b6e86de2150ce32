"""Calibration: recovers known efficiencies from a synthetic profile, and improves the
analytic model on a real CPU profile."""

from __future__ import annotations

import pytest
from profile_factories import make_profile, ok_row

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.calibrate import FITTED, fit, transfer
from planner.cost.compute import AnalyticCompute
from planner.cost.shapes import Shard, layer_work
from planner.errors import PlannerError
from planner.profile import store

H100 = resolve_gpu("h100")
TRUE = H100.efficiency.model_copy(
    update=dict(  # the analytic form the fit recovers, not the preset's GEMM table
        gemm=0.62,
        gemm_half_dim=150.0,
        attention_fwd=0.48,
        attention_bwd=0.36,
        hbm=0.7,
        kernel_overhead_us=7.0,
        gemm_table=None,
    )
)


def _synthetic(efficiency, model="llama3-8b"):
    """A profile whose times are the analytic model's under `efficiency`."""
    spec, compute = resolve_model(model), AnalyticCompute(H100, "bf16", efficiency)
    rows = []
    for kind in ("embedding", "transformer", "head"):
        for tp in (1, 4, 8):
            for mbs in (1, 2):
                for seq in (1024, 4096):
                    t = compute.layer_times(layer_work(spec, kind, Shard(mbs=mbs, seq=seq, tp=tp)))
                    i, w = t.backward_input_s * 1e3, t.backward_weight_s * 1e3
                    if kind == "embedding":  # the runtime runs the first stage's backward as W
                        i, w = 0.0, i + w
                    rows.append(
                        ok_row(
                            kind=kind,
                            tp=tp,
                            mbs=mbs,
                            seq=seq,
                            forward_ms=t.forward_s * 1e3,
                            backward_input_ms=i,
                            backward_weight_ms=w,
                        )
                    )
    return make_profile(rows, model=model, device="NVIDIA H100 80GB HBM3", device_type="cuda")


def test_recovers_known_efficiencies():
    result = fit([_synthetic(TRUE)], H100)
    for name in FITTED:
        assert getattr(result.efficiency, name) == pytest.approx(getattr(TRUE, name), rel=0.03), name
    assert result.before_pct > 10 and result.after_pct < 0.5
    assert result.efficiency.intra_node_comm == H100.efficiency.intra_node_comm  # not fitted


def test_fit_is_deterministic():
    profile = _synthetic(TRUE)
    assert fit([profile], H100) == fit([profile], H100)


def test_reduces_the_error_on_a_cpu_profile(cpu_profile):
    # measured CPU times move with the machine's load: no bound on the error itself
    result = fit([store.load(cpu_profile)], H100)
    assert result.after_pct < result.before_pct
    parts = {(p.kind, p.part) for p in result.parts}
    assert ("embedding", "backward") in parts and ("transformer", "backward_weight") in parts


def test_transfer_keeps_fractions_and_the_targets_communication():
    mi300x = resolve_gpu("mi300x")
    moved = transfer(TRUE, mi300x)
    for name in FITTED:
        assert getattr(moved, name) == getattr(TRUE, name)
    assert moved.inter_node_comm == mi300x.efficiency.inter_node_comm


def test_profiles_from_different_devices_are_refused():
    other = _synthetic(TRUE).model_copy(update={"device": "NVIDIA A100-SXM4-80GB"})
    with pytest.raises(PlannerError, match="one device at a time"):
        fit([_synthetic(TRUE), other], H100)
