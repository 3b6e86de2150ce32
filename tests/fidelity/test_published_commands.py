"""Each published run's printed `planner evaluate` command gives the harness's prediction
(one run per source of the development set and of the headline pre-registered set).

A development-set row holds its runtime version and only the settings where the run departs from it.

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

BENCH = Path(__file__).parents[1] / "bench"
DEVELOPMENT = load_runs(BENCH / "published_runs.toml")
HEADLINE = load_runs(BENCH / "preregistered_runs_13.toml")
"""The pre-registered set behind the README's headline."""


def _one_per_source(runs):
    return list({(run.source_id, run.runtime): run for run in runs}.values())


ONE_PER_SOURCE = _one_per_source(DEVELOPMENT + HEADLINE)
DEVELOPMENT_PER_SOURCE = _one_per_source(DEVELOPMENT)


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


@pytest.mark.parametrize("run", DEVELOPMENT_PER_SOURCE, ids=lambda run: run.name)
def test_request_settings_are_only_departures_from_the_runtime(run):
    """In the development set; a pre-registered row keeps what its source documents, which a later
    runtime default may equal."""
    request = run.request()
    version = cost_options(resolve(request.runtime), resolve_gpu(run.gpu)).flat()
    assert all(version[name] != value for name, value in request.options.items())
    assert Request.model_validate_json(request.model_dump_json()) == request
