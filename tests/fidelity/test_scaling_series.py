"""The development scaling series (tests/bench/scaling_series.toml). InternLM's: runs of one model
and layout at 8 to 1,024 GPUs, only the GPU count changing; the model must reproduce how the
published step grows with the cluster (the trend, relative to the same series at 64 GPUs), and the
mechanism that grows with it (InternLM's per-rank parameter broadcasts, `zero1_exchange`) must be
what reproduces it. nanotron's: its benchmark cells priced with the runtime that ran them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from planner.fidelity.published import evaluate_run, load_runs

SERIES = Path(__file__).resolve().parents[2] / "tests" / "bench" / "scaling_series.toml"
BASE, TOP = 64, 1024


def _series(runs):
    by_tp = defaultdict(dict)
    for run in runs:
        if run.source_id == "internlm-scaling":
            by_tp[run.tp][run.gpus] = run
    return by_tp


@pytest.fixture(scope="module")
def steps():
    """tp -> GPUs -> (published, predicted) step seconds."""
    return {
        tp: {gpus: _steps(run) for gpus, run in sorted(series.items())}
        for tp, series in _series(load_runs(SERIES)).items()
    }


def _steps(run):
    result = evaluate_run(run)
    return result.published_step_time_s, result.predicted_step_time_s


def _growth(series, column):
    return series[TOP][column] / series[BASE][column] - 1


def test_series_are_whole(steps):
    assert sorted(steps) == [1, 2]
    for series in steps.values():
        assert sorted(series) == [8, 16, 32, 64, 128, 256, 512, 1024]


def test_published_and_predicted_steps_grow_with_the_cluster(steps):
    for series in steps.values():
        for column in (0, 1):
            times = [series[gpus][column] for gpus in sorted(series)]
            assert times == sorted(times)


def test_growth_from_64_to_1024_gpus_is_reproduced(steps):
    """Within a factor 1.5 of the published growth, in both series."""
    for tp, series in steps.items():
        published, predicted = _growth(series, 0), _growth(series, 1)
        assert published > 0.2, tp
        assert published / 1.5 <= predicted <= published * 1.5, (tp, published, predicted)


def test_the_broadcast_exchange_is_what_grows(steps):
    """The same rows with the gradient reduce-scatter and parameter all-gather of Megatron's
    distributed optimizer in place of the per-rank broadcasts grow by under a quarter of the
    published growth."""
    for tp, series in _series(load_runs(SERIES)).items():
        steps_without = {
            gpus: evaluate_run(
                run.model_copy(update={"settings": {**run.settings, "zero1_exchange": "reduce_scatter"}})
            ).predicted_step_time_s
            for gpus, run in series.items()
            if gpus in (BASE, TOP)
        }
        grown = steps_without[TOP] / steps_without[BASE] - 1
        assert grown < 0.25 * _growth(steps[tp], 0), (tp, grown)


def test_nanotron_series_is_whole():
    cells = {(run.model, run.gpus) for run in load_runs(SERIES) if run.source_id == "nanotron-scaling"}
    assert len(cells) == 12
    assert {gpus for _, gpus in cells} == {8, 32, 64, 512}


def test_nanotron_runtime_never_charges_less_than_the_megatron_stand_in():
    """nanotron's exchange under ZeRO-1 waits for the whole backward and the step, and its fp32
    accumulator adds every micro-batch's gradients on top of the GEMMs: against megatron@0.19
    (overlapped exchange, accumulation fused into the GEMM), every cell costs at least as much."""
    for run in load_runs(SERIES):
        if run.source_id != "nanotron-scaling":
            continue
        nanotron = evaluate_run(run).predicted_step_time_s
        stand_in = evaluate_run(run.model_copy(update={"runtime": "megatron@0.19"})).predicted_step_time_s
        assert nanotron > stand_in, run.name
