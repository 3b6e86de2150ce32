"""Fitting the efficiency knobs: synthetic runs from the planner's own prediction with known,
perturbed knobs must give those knobs back (deterministic: no timing anywhere)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.calibration.fit import (
    BOUNDS,
    KNOBS,
    MIN_SENSITIVITY,
    Run,
    apply,
    fit,
    knob_bounds,
    predict_run,
    select,
)
from planner.calibration.logs import parse_log, steady_state
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostOptions
from planner.cost.shapes import model_flops_per_token
from planner.layout import Layout, even_stage_layers
from planner.spec import Cluster
from planner.units import GiB
from tests.calibration.logmaker import megatron_log, torchtitan_log

PRIOR = resolve_gpu("h100").efficiency


def _run(model: str, gpus: int, tp: int, mbs: int, global_batch: int, seq: int, zero: int = 1) -> Run:
    spec = resolve_model(model)
    dp = gpus // tp
    layout = Layout(
        tp=tp,
        pp=1,
        dp=dp,
        mbs=mbs,
        num_microbatches=global_batch // (dp * mbs),
        schedule="1f1b",
        recompute=("none",),
        sequence_parallel=tp > 1,
        zero_stage=zero,
        stage_layers=even_stage_layers(spec.num_layers, 1, 1, "1f1b"),
    )
    return Run(
        name=f"{model} tp{tp} x{gpus}",
        spec=spec,
        cluster=Cluster.of(resolve_gpu("h100"), gpus),
        layout=layout,
        global_batch=global_batch,
        seq=seq,
        options=CostOptions(),
        measured_step_time_s=1.0,
    )


COMPUTE_BOUND = _run("llama3-8b", 8, 1, 1, 64, 8192)
"""Data parallel on one node: the gradient reduction hides behind the backward."""
COMM_BOUND = _run("llama3-8b", 16, 16, 1, 16, 2048)
"""Tensor parallel across two nodes: its all-gathers and reduce-scatters cross InfiniBand."""
SMALL_KERNELS = _run("llama3-8b", 8, 8, 1, 16, 512)
"""Tensor parallel 8 at micro-batch 1 x 512 tokens: small kernels, so per-kernel time shows."""


def _measured(run: Run, truth: dict[str, float]) -> Run:
    """`run` with the step time the planner predicts under the perturbed knobs `truth`."""
    return replace(run, measured_step_time_s=predict_run(run, apply(PRIOR, truth)).step_time_s)


def _knobs(result) -> dict[str, object]:
    return {k.name: k for k in result.knobs}


def test_one_run_fits_the_compute_factor_only():
    run = _measured(COMPUTE_BOUND, {"compute": 0.8})
    result = fit([run], PRIOR)
    knobs = _knobs(result)
    assert knobs["compute"].fitted and knobs["compute"].value == pytest.approx(0.8, rel=1e-3)
    assert not knobs["comm"].fitted and "1 run gives 1 step time" in knobs["comm"].reason
    assert not knobs["overhead"].fitted and knobs["overhead"].value == 1.0
    (res,) = result.residuals
    assert abs(res.after_pct) < 0.05 < abs(res.before_pct)
    assert result.efficiency.gemm == pytest.approx(PRIOR.gemm * 0.8, rel=1e-3)
    assert result.efficiency.attention_bwd == pytest.approx(PRIOR.attention_bwd * 0.8, rel=1e-3)
    assert result.efficiency.inter_node_comm == PRIOR.inter_node_comm


def test_two_layouts_separate_compute_from_communication():
    truth = {"compute": 0.85, "comm": 0.6}
    runs = [_measured(COMPUTE_BOUND, truth), _measured(COMM_BOUND, truth)]
    knobs = _knobs(fit(runs, PRIOR))
    assert knobs["compute"].value == pytest.approx(0.85, rel=2e-3)
    assert knobs["comm"].fitted and knobs["comm"].value == pytest.approx(0.6, rel=2e-3)
    assert not knobs["overhead"].fitted and "2 runs give 2 step times" in knobs["overhead"].reason


def test_three_layouts_give_the_kernel_overhead_too():
    truth = {"compute": 0.9, "comm": 0.7, "overhead": 2.5}
    runs = [_measured(r, truth) for r in (COMPUTE_BOUND, COMM_BOUND, SMALL_KERNELS)]
    result = fit(runs, PRIOR)
    knobs = _knobs(result)
    assert all(k.fitted for k in knobs.values())
    for name, value in truth.items():
        assert knobs[name].value == pytest.approx(value, rel=1e-2)
    assert all(abs(r.after_pct) < 0.1 for r in result.residuals)


def test_two_runs_of_the_same_layout_fit_one_knob():
    # Same layout twice: the second run adds no independent information.
    first = _measured(COMPUTE_BOUND, {"compute": 0.8})
    runs = [first, replace(first, name="again")]
    knobs = _knobs(fit(runs, PRIOR))
    assert knobs["compute"].fitted and not knobs["comm"].fitted and not knobs["overhead"].fitted
    assert "hardly depend" in knobs["comm"].reason


def test_a_run_slower_than_any_physical_efficiency_stops_at_the_bound():
    run = replace(COMPUTE_BOUND, measured_step_time_s=predict_run(COMPUTE_BOUND, PRIOR).step_time_s * 5)
    result = fit([run], PRIOR)
    compute = _knobs(result)["compute"]
    assert compute.value == pytest.approx(knob_bounds("compute", PRIOR)[0])
    assert "physical bound" in compute.reason
    assert result.residuals[0].after_pct < -50  # still far too fast: the model misses something


def test_knob_bounds_keep_every_field_within_its_physical_range():
    low, high = knob_bounds("compute", PRIOR)
    # by hand from gpus.toml's h100 priors (gemm 0.75; attention FA2 0.34 / 0.295, FA3 0.62 /
    # 0.54, cuDNN 0.545 / 0.47; hbm 0.85):
    rates = (0.34, 0.295, 0.62, 0.54, 0.545, 0.47)
    assert low == pytest.approx(max(0.3 / 0.75, 0.3 / 0.85, *(0.15 / r for r in rates)))
    assert high == pytest.approx(min(0.95 / 0.75, 0.95 / 0.85, *(0.95 / r for r in rates)))
    for name, fields in KNOBS.items():
        lo, hi = knob_bounds(name, PRIOR)
        for factor in (lo, hi):
            scaled = apply(PRIOR, {name: factor})
            for field in fields:
                assert BOUNDS[field][0] - 1e-12 <= getattr(scaled, field) <= BOUNDS[field][1] + 1e-12


def test_select_counts_independent_observations():
    compute, comm, overhead = [-1.0, -0.3], [-0.5, -0.15], [0.0, 0.01]  # comm collinear with compute
    verdicts = select({"compute": compute, "comm": comm, "overhead": overhead}, 2)
    assert [(name, fitted) for name, fitted, _, _ in verdicts] == [
        ("compute", True),
        ("comm", False),
        ("overhead", False),
    ]
    assert verdicts[1][3] == pytest.approx(0.0, abs=1e-12)
    verdicts = select({"compute": compute, "comm": [0.0, -0.4], "overhead": [0.2, 0.0]}, 2)
    assert [fitted for _, fitted, _, _ in verdicts] == [True, True, False]
    assert verdicts[1][3] > MIN_SENSITIVITY and "already used by compute, comm" in verdicts[2][2]


def _tokens(run: Run) -> int:
    return run.global_batch * run.seq


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_synthetic_logs_recover_the_knob_through_the_parser(fmt):
    truth = {"compute": 0.8}
    run = COMPUTE_BOUND
    true = predict_run(run, apply(PRIOR, truth))
    gpus, peak = run.layout.num_gpus, run.cluster.gpu.peak_flops("bf16")
    flops_per_token = model_flops_per_token(run.spec, run.seq)
    tps = _tokens(run) / (true.step_time_s * gpus)
    if fmt == "megatron":
        text = megatron_log(
            true.step_time_s,
            flops_per_token * tps / 1e12,
            run.global_batch,
            {0: true.peak_memory_bytes / 2**20, 4: 0.95 * true.peak_memory_bytes / 2**20},
        )
    else:
        text = torchtitan_log(tps, flops_per_token, peak, true.peak_memory_bytes / GiB, run.cluster.gpu.memory_gib)
    measured = steady_state(parse_log(text))
    assert measured.format == fmt
    assert measured.max_reserved_gib == pytest.approx(true.peak_memory_bytes / GiB, rel=1e-3)
    step = measured.step_time_for(_tokens(run), gpus)
    assert step == pytest.approx(true.step_time_s, rel=1e-3)
    result = fit([replace(run, measured_step_time_s=step)], PRIOR)
    assert _knobs(result)["compute"].value == pytest.approx(0.8, rel=2e-3)
    assert math.isclose(result.residuals[0].after_s, step, rel_tol=1e-3)


def test_a_gemm_only_slowdown_is_absorbed_by_the_compute_factor():
    # Only gemm x 0.8 in the truth: one run cannot tell gemm from attention or HBM, so the one
    # compute factor lands between 0.8 (all GEMM time) and 1 (no GEMM time) and matches the run.
    truth = PRIOR.model_copy(update={"gemm": PRIOR.gemm * 0.8, "gemm_table_scale": PRIOR.gemm_table_scale * 0.8})
    run = replace(COMPUTE_BOUND, measured_step_time_s=predict_run(COMPUTE_BOUND, truth).step_time_s)
    result = fit([run], PRIOR)
    factor = _knobs(result)["compute"].value
    assert 0.8 < factor < 0.9  # GEMMs are most of a Llama 3 8B step at seq 8192
    assert abs(result.residuals[0].after_pct) < 0.05
