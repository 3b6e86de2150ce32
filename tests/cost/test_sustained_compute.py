"""The H100 family's `sustained_compute`: a training run holds the GPU at its power limit, where
its burst-timed compute rates do not hold.

The presets' GEMM table, fp8 GEMM prior and attention rates are burst rates. The H100 SXM's
factor is its own measurement, read here from the raw records of scripts/measure_gpu_speed.py
on two H100 SXM 80GB machines (tests/data/h100_measured/): 8192^3 bf16 GEMMs held for 50 s after
25 s of load, against a burst after 1 s idle. The H200's is mamf-finder.py v4's (stas00/
ml-engineering, compute/accelerator/benchmarks/README.md, "How close it gets"): MSMF 743-746
over MAMF 843-850 TFLOP/s in five runs. The H800 takes the H100 SXM's (same die and 700 W
limit); the 96 GB part, capped at 500 W, counts its clock drop once, in `gemm_table_scale`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from planner.catalog import resolve_gpu
from planner.cost.calibrate import transfer
from planner.cost.compute import AnalyticCompute
from planner.profile.gemms import read_points
from tests.cost.burst_rates import burst_rates

MEASURED = Path(__file__).parents[1] / "data" / "h100_measured"
MSMF_H200_TFLOPS = (743.0, 746.0)
MAMF_H200_TFLOPS = (843.0, 850.0)
GH100_PARTS = ("h100", "h800", "h200", "h100-96gb")


def _h100_runs() -> list[float]:
    """Sustained over burst rate of each H100 SXM record (burst time over sustained time)."""
    records = [json.loads(p.read_text()) for p in sorted(MEASURED.glob("speed-run*.json"))]
    return [r["burst_seconds_per_gemm"] / r["seconds_per_gemm"] for rs in records for r in rs]


def test_the_h100_factor_is_the_mean_of_its_measured_runs():
    runs = _h100_runs()
    assert len(runs) == 2 and all("H100 80GB HBM3" in p.read_text() for p in MEASURED.glob("speed-run*.json"))
    for name in ("h100", "h800"):
        factor = resolve_gpu(name).efficiency.sustained_compute
        assert factor == pytest.approx(statistics.mean(runs), abs=5e-4), name
        assert min(runs) <= factor <= max(runs)


def test_the_h200_factor_is_its_own_measurement():
    low, high = MSMF_H200_TFLOPS[0] / MAMF_H200_TFLOPS[1], MSMF_H200_TFLOPS[1] / MAMF_H200_TFLOPS[0]
    assert low <= resolve_gpu("h200").efficiency.sustained_compute <= high
    assert "mamf-finder.py v4" in resolve_gpu("h200").efficiency.sustained_compute_source
    for name in GH100_PARTS:
        assert resolve_gpu(name).efficiency.sustained_compute_source, name


def test_a_power_cap_is_counted_once():
    """The 500 W part's clock drop is its gemm_table_scale (the capped part's peak), not also the
    700 W sustained ratio on top."""
    capped = resolve_gpu("h100-96gb").efficiency
    assert capped.gemm_table_scale < 1 and capped.sustained_compute == 1.0


def test_gpus_without_a_measured_ratio_keep_their_rates():
    """The A100 GEMM prior agrees with a sustained cuBLASLt measurement (docs/h100_rates.md);
    B200 and MI300X have no sustained-over-burst measurement."""
    for name in ("a100-80gb", "a100-40gb", "b200", "mi300x"):
        assert resolve_gpu(name).efficiency.sustained_compute == 1.0


@pytest.mark.parametrize("gemm_dtype", [None, "fp8"])
def test_gemms_and_attention_slow_by_exactly_the_factor(gemm_dtype):
    preset = resolve_gpu("h100")
    sustained, burst = (AnalyticCompute(g, "bf16", gemm_dtype=gemm_dtype) for g in (preset, burst_rates("h100")))
    factor = preset.efficiency.sustained_compute
    # an 8192^3 GEMM is compute-bound: its time less the per-kernel overhead goes as 1 / factor
    gemm = [c.gemm_time(8192, 8192, 8192) - c.overhead_s for c in (sustained, burst)]
    assert gemm[0] / gemm[1] == pytest.approx(1 / factor, rel=1e-12)
    for backward in (False, True):
        attention = [c.attention_time(1e12, 8192, backward, "flash2") for c in (sustained, burst)]
        assert attention[0] / attention[1] == pytest.approx(1 / factor, rel=1e-12)


def test_memory_bound_kernels_and_overhead_keep_their_rates():
    """The memory clock does not move at the power limit."""
    sustained, burst = AnalyticCompute(resolve_gpu("h100")), AnalyticCompute(burst_rates("h100"))
    assert sustained.elementwise_time(1e9, 7) == burst.elementwise_time(1e9, 7)


def test_the_fp8_prior_sits_in_the_burst_regime_of_the_bf16_table():
    """Swept warm on the same H100 (scripts/measure_gemm_table.py, shapes back to back), fp8 GEMMs
    run the same share of the fp8 prior as bf16 GEMMs of the OpenXLA burst table: the prior is a
    burst rate, so the factor divides it too."""
    h100 = burst_rates("h100")

    def share(dtype: str) -> float:
        compute = AnalyticCompute(h100, "bf16", gemm_dtype=dtype)
        points = read_points((MEASURED / f"gemm_h100_{dtype}.toml").read_text())
        ratios = [
            tflops * 1e12 * (compute.gemm_time(*shape) - compute.overhead_s) / (2.0 * shape[0] * shape[1] * shape[2])
            for shape, tflops in points.items()
            if min(shape) >= 4096
        ]
        return statistics.median(ratios)

    fp8, bf16 = share("fp8"), share("bf16")
    assert fp8 == pytest.approx(bf16, rel=0.03)
    factor = resolve_gpu("h100").efficiency.sustained_compute
    assert fp8 == pytest.approx(factor, rel=0.03) and bf16 == pytest.approx(factor, rel=0.03)


def test_a_fit_carries_the_factor_it_was_fitted_under():
    """Fractions fitted on an H100 profile were fitted with the factor applied: moved to a GPU
    without one they keep it."""
    moved = transfer(resolve_gpu("h100").efficiency, resolve_gpu("a100-80gb"))
    assert moved.sustained_compute == resolve_gpu("h100").efficiency.sustained_compute


def test_planner_cost_names_the_factor_on_the_rates(cli):
    code, out, _ = cli("cost", "--model", "llama3-8b", "--seq", "2048", "--gpu", "h100")
    assert code == 0
    factor = resolve_gpu("h100").efficiency.sustained_compute
    assert f"sustained_compute {factor:g} (a GPU held at its power limit" in out
    code, out, _ = cli("cost", "--model", "llama3-8b", "--seq", "2048", "--gpu", "a100-80gb")
    assert code == 0 and "sustained_compute" not in out
