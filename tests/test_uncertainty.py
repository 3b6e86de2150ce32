"""A prediction's interval: the spread of comparable runs' step errors, widened in a fixed order
of comparability when too few runs match."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.api import prediction_interval
from planner.uncertainty import MIN_RUNS, Residual, comparable, interval_from_errors, scale_band, step_interval


def _runs(n: int, **fields) -> list[Residual]:
    base = {"runtime": "megatron", "gpu_generation": "h100", "gpus": 512, "moe": False, "step_error": 0.0}
    return [Residual(name=f"r{i}-{fields}", **{**base, **fields}) for i in range(n)]


def test_interval_is_what_runs_with_those_errors_measured():
    interval = interval_from_errors(12.0, [-0.2, 0.0, 0.2], "three")
    assert (interval.low_s, interval.high_s, interval.runs) == (pytest.approx(10.0), pytest.approx(15.0), 3)


def test_scale_bands():
    assert [scale_band(g) for g in (1, 64, 65, 1024, 1025, 16384)] == [0, 0, 1, 1, 2, 2]


def test_the_closest_tier_with_enough_runs_is_used():
    close = _runs(MIN_RUNS, step_error=0.05)
    other_band = _runs(MIN_RUNS, gpus=8192, step_error=-0.3)
    chosen, basis = comparable(tuple(close + other_band), "megatron@0.19", "h100-96gb", 256, moe=False)
    assert chosen == close and basis == "dense, megatron on h100, 65-1,024 GPUs"
    chosen, basis = comparable(tuple(close[:-1] + other_band), "megatron", "h800", 256, moe=False)
    assert len(chosen) == 2 * MIN_RUNS - 1 and basis == "dense, megatron on h100"
    chosen, basis = comparable(tuple(close), "torchtitan", "a100-80gb", 8, moe=True)
    assert chosen == close and basis == "all runs; none on a100"


def test_an_interval_says_when_no_development_run_was_on_its_gpu():
    """The shipped set has no B200 run: its interval borrows other GPUs' runs and says so."""
    assert step_interval(10.0, "megatron", "b200", 8, moe=False).basis.endswith("; none on b200")
    assert "none on" not in step_interval(10.0, "megatron", "h100", 8, moe=False).basis


def test_a_calibration_narrows_the_interval_to_its_own_runs():
    calibration = SimpleNamespace(
        residuals=[
            SimpleNamespace(predicted_after_s=9.9, measured_step_time_s=10.0),
            SimpleNamespace(predicted_after_s=10.1, measured_step_time_s=10.0),
        ]
    )
    job = SimpleNamespace(calibration=calibration)
    interval = prediction_interval(job, 20.0)
    assert interval.runs == 2 and interval.basis == "2 calibration run(s)"
    assert (interval.low_s, interval.high_s) == (pytest.approx(20 / 1.01), pytest.approx(20 / 0.99))


def test_shipped_development_residuals_give_an_interval_around_the_prediction():
    interval = step_interval(10.0, None, "h100", 1024, moe=False)
    assert interval.runs >= MIN_RUNS and interval.low_s < interval.high_s


def test_the_interval_is_in_the_json_the_table_and_the_report(cli, tmp_path):
    job = ["-m", "llama3-8b", "-n", "16", "-b", "64", "-s", "4096", "--tp", "2"]
    code, out, err = cli("evaluate", *job, "--json")
    assert code == 0, err
    import json

    predicted = json.loads(out)["plans"][0]["predicted"]
    low, high = predicted["step_time_interval_s"]
    expected = step_interval(predicted["step_time_s"], None, "h100", 16, moe=False)
    assert (low, high) == (expected.low_s, expected.high_s)
    assert predicted["interval_basis"] == expected.basis
    code, out, err = cli("evaluate", *job)
    assert code == 0, err
    assert f"{low:.2f}-{high:.2f} s" in out
    pytest.importorskip("plotly")
    page = tmp_path / "plan.html"
    code, _, err = cli("evaluate", *job, "-o", str(tmp_path / "plan.json"))
    assert code == 0, err
    code, _, err = cli("report", str(tmp_path / "plan.json"), "-o", str(page), "--no-explain")
    assert code == 0, err
    assert f"runs like it measured {low:.3f} to {high:.3f} s" in page.read_text()
