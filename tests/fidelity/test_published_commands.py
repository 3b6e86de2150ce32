"""Each published run's printed `planner evaluate` command gives the harness's prediction.

A row holds its runtime version and only the settings where the run departs from it.

The harness (planner/fidelity/published.py) predicts a run from a `Request` (its runtime
version and the settings where the run departs from it) and a fixed layout; the command it
prints is what a user types. One run of each source is run through the CLI here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import resolve_gpu
from planner.fidelity.published import evaluate_command, evaluate_run, load_runs
from planner.job import cost_options
from planner.request import Request
from planner.runtimes import resolve

RUNS = load_runs(Path(__file__).parents[1] / "bench" / "published_runs.toml")
ONE_PER_SOURCE = list({(run.source_id, run.runtime): run for run in RUNS}.values())


@pytest.mark.parametrize("run", ONE_PER_SOURCE, ids=lambda run: run.name)
def test_printed_command_reproduces_the_prediction(cli, run):
    words = evaluate_command(run)
    assert words[:2] == ["planner", "evaluate"]
    code, out, err = cli(*words[1:], "--json")
    assert code == 0, err
    predicted = json.loads(out)["plans"][0]["predicted"]
    harness = evaluate_run(run).prediction.to_predicted()
    assert predicted["step_time_s"] == harness.step_time_s
    assert predicted["memory_gb_per_stage"] == harness.memory_gb_per_stage
    assert predicted["bubble_fraction"] == harness.bubble_fraction


@pytest.mark.parametrize("run", ONE_PER_SOURCE, ids=lambda run: run.name)
def test_request_settings_are_only_departures_from_the_runtime(run):
    request = run.request()
    version = cost_options(resolve(request.runtime), resolve_gpu(run.gpu)).flat()
    assert all(version[name] != value for name, value in request.options.items())
    assert Request.model_validate_json(request.model_dump_json()) == request
