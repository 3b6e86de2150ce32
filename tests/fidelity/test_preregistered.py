"""The pre-registered validation sets (tests/bench/preregistered_runs*.toml, in the order collected):
published runs the cost model was never developed on, each collected before the model change it checks
and evaluated once after it (docs/accuracy_preregistered.md). This test checks the files only: their
schema, their size, that their sources are new to every earlier set, that every row builds. It asserts
no error bound: a set's error is a figure to report, not a number to hold a change to."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.fidelity.published import build, load_runs

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "bench"
SETS = [
    BENCH / "preregistered_runs.toml",
    BENCH / "preregistered_runs_2.toml",
    BENCH / "preregistered_runs_3.toml",
    BENCH / "preregistered_runs_4.toml",
    BENCH / "preregistered_runs_5.toml",
    BENCH / "preregistered_runs_6.toml",
    BENCH / "preregistered_runs_7.toml",
    BENCH / "preregistered_runs_8.toml",
    BENCH / "preregistered_runs_9.toml",
    BENCH / "preregistered_runs_10.toml",
    BENCH / "preregistered_runs_11.toml",
    BENCH / "preregistered_runs_12.toml",
    BENCH / "preregistered_runs_13.toml",
    BENCH / "preregistered_runs_14.toml",
]
"""In the order they were collected: each set's earlier ones are development data to it."""
DEVELOPMENT = BENCH / "published_runs.toml"
HEADER_PHRASES = {
    "preregistered_runs.toml": (
        "before any model change",
        "never used to choose or tune a mechanism",
        "evaluated once",
    ),
    "preregistered_runs_2.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_3.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_4.toml": (
        "committed before that change",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_5.toml": (
        "committed before that change",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_6.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_7.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_8.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_9.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_10.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_11.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_12.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_13.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
    "preregistered_runs_14.toml": (
        "before the model change it is meant to check",
        "never used to choose or tune a mechanism",
        "not evaluated when it was collected",
    ),
}


@pytest.fixture(scope="module", params=SETS, ids=lambda path: path.name)
def data(request):
    return request.param


@pytest.fixture(scope="module")
def runs(data):
    return load_runs(data)


def _earlier(data):
    return [DEVELOPMENT, *SETS[: SETS.index(data)]]


def test_size_and_new_sources(runs, data):
    assert len(runs) >= 25
    seen = {r.source_id for path in _earlier(data) for r in load_runs(path)}
    new = {r.source_id for r in runs} - seen
    assert len(new) >= 4, sorted(new)
    assert all(r.source_id in new for r in runs), "a pre-registered row comes from an earlier set's source"


def test_rows_are_not_earlier_rows(runs, data):
    for path in _earlier(data):
        earlier = load_runs(path)
        assert not {r.name for r in runs} & {r.name for r in earlier}
        assert not {r.url for r in runs} & {r.url for r in earlier}


def test_no_row_is_tagged_held_out(runs):
    """Every row is held out by construction; the development set's every-third-row tag is not used."""
    assert not [r.name for r in runs if r.held_out]


def test_every_url_is_https_and_every_row_says_what_it_assumed(runs):
    for run in runs:
        assert run.url.startswith("https://"), run.name
        assert run.source and run.assumptions, run.name


def test_header_records_the_preregistration(data):
    lines = data.read_text().split("[[run]]", 1)[0].splitlines()
    header = " ".join(line.lstrip("#").strip() for line in lines)  # a phrase may wrap across comment lines
    for phrase in HEADER_PHRASES[data.name]:
        assert phrase in header


def test_every_row_builds(runs, monkeypatch):
    """Each row's model (a preset or a file under tests/bench/preregistered_models/, named from the
    repository root), runtime version, settings and layout make a cost model and a valid layout, as
    `planner evaluate` would build them."""
    monkeypatch.chdir(ROOT)
    for run in runs:
        if not run.model.replace("-", "").replace(".", "").isalnum():
            assert (ROOT / run.model).is_file(), run.model
        build(run)
