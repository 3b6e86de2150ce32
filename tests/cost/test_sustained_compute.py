"""The H100 family's `sustained_compute`: a training run holds the GPU at its power limit, where
its measured (burst) compute rates do not hold.

The presets' GEMM table, attention rates and the block behind `layer_scale` were all timed in
short bursts. mamf-finder.py v4 measured the same die both ways (stas00/ml-engineering,
compute/accelerator/benchmarks/README.md, "How close it gets"): on an H200 (GH100, the H100
SXM's 132 SMs and 700 W limit) five runs gave MSMF, the rate held steady over 2-4 s once the
clock has settled under load, of 743-746 TFLOP/s, and MAMF, the median of the 5 fastest
iterations at the boost clock after 0.25 s idle, of 843-850 TFLOP/s. The H200 takes that ratio;
the H100 SXM and H800, not measured, the middle of the range between it and 1 (the block behind
`layer_scale` may already hold part of the drop); the 96 GB part, capped at 500 W, counts its
clock drop once, in `gemm_table_scale`."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu
from planner.cost.calibrate import transfer
from planner.cost.compute import AnalyticCompute
from tests.cost.burst_rates import burst_rates

MSMF_H200_TFLOPS = (743.0, 746.0)
MAMF_H200_TFLOPS = (843.0, 850.0)
GH100_PARTS = ("h100", "h800", "h200", "h100-96gb")


def test_the_factor_is_the_measurement_where_one_exists_else_the_middle_of_its_range():
    low, high = MSMF_H200_TFLOPS[0] / MAMF_H200_TFLOPS[1], MSMF_H200_TFLOPS[1] / MAMF_H200_TFLOPS[0]
    assert low <= resolve_gpu("h200").efficiency.sustained_compute <= high  # measured on this GPU model
    for name in ("h100", "h800"):  # the same die, not measured: the middle of [low, 1]
        assert resolve_gpu(name).efficiency.sustained_compute == pytest.approx((low + 1) / 2, abs=1e-3), name
    for name in GH100_PARTS:
        assert resolve_gpu(name).efficiency.sustained_compute_source, name
    assert "mamf-finder.py v4" in resolve_gpu("h100").efficiency.sustained_compute_source


def test_a_power_cap_is_counted_once():
    """The 500 W part's clock drop is its gemm_table_scale (the capped part's peak), not also the
    700 W sustained ratio on top."""
    capped = resolve_gpu("h100-96gb").efficiency
    assert capped.gemm_table_scale < 1 and capped.sustained_compute == 1.0


def test_gpus_whose_rates_are_not_burst_measurements_keep_them():
    """The A100 GEMM prior agrees with a sustained cuBLASLt measurement (docs/h100_rates.md);
    B200 and MI300X run on priors."""
    for name in ("a100-80gb", "a100-40gb", "b200", "mi300x"):
        assert resolve_gpu(name).efficiency.sustained_compute == 1.0


def _pair(name: str) -> tuple[AnalyticCompute, AnalyticCompute, float]:
    preset = resolve_gpu(name)
    burst = burst_rates(name, layer_scale=preset.efficiency.layer_scale)
    return AnalyticCompute(preset), AnalyticCompute(burst), preset.efficiency.sustained_compute


def test_measured_gemms_and_attention_slow_by_exactly_the_factor():
    sustained, burst, factor = _pair("h100")
    # an 8192^3 GEMM is compute-bound: its time less the per-kernel overhead goes as 1 / factor
    gemm = [c.gemm_time(8192, 8192, 8192) - c.overhead_s for c in (sustained, burst)]
    assert gemm[0] / gemm[1] == pytest.approx(1 / factor, rel=1e-12)
    for backward in (False, True):
        attention = [c.attention_time(1e12, 8192, backward, "flash2") for c in (sustained, burst)]
        assert attention[0] / attention[1] == pytest.approx(1 / factor, rel=1e-12)


def test_memory_bound_kernels_overhead_and_the_fp8_prior_keep_their_rates():
    """The memory clock does not move at the power limit, and the fp8 GEMM prior was not
    measured in bursts (it sits within 5% of Azure's sustained fp8 table: docs/h100_rates.md)."""
    sustained, burst, _ = _pair("h100")
    assert sustained.elementwise_time(1e9, 7) == burst.elementwise_time(1e9, 7)
    preset, burst_gpu = resolve_gpu("h100"), burst_rates("h100", layer_scale=resolve_gpu("h100").efficiency.layer_scale)
    fp8 = [AnalyticCompute(g, "bf16", gemm_dtype="fp8").gemm_time(8192, 8192, 8192) for g in (preset, burst_gpu)]
    assert fp8[0] == fp8[1]


def test_a_fit_carries_the_factor_it_was_fitted_under():
    """Fractions fitted on an H100 profile were fitted with the factor applied: moved to a GPU
    without one they keep it, as they keep `layer_scale`."""
    moved = transfer(resolve_gpu("h100").efficiency, resolve_gpu("a100-80gb"))
    assert moved.sustained_compute == resolve_gpu("h100").efficiency.sustained_compute


def test_planner_cost_names_the_factors_on_the_rates(cli):
    code, out, _ = cli("cost", "--model", "llama3-8b", "--seq", "2048", "--gpu", "h100")
    assert code == 0
    factor = resolve_gpu("h100").efficiency.sustained_compute
    assert f"sustained_compute {factor:g} (a GPU held at its power limit)" in out
    assert "layer_scale 0.948" in out
    code, out, _ = cli("cost", "--model", "llama3-8b", "--seq", "2048", "--gpu", "a100-80gb")
    assert code == 0 and "sustained_compute" not in out and "layer_scale" not in out
