"""The pre-registered validation set (tests/bench/preregistered_runs.toml): published runs the cost
model was never developed on, collected before any model change and evaluated once
(docs/accuracy_preregistered.md). This test checks the file only: its schema, its size, that its
sources are new, that every row builds. It asserts no error bound: the set's error is a figure to
report, not a number to hold a change to."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.fidelity.published import build, load_runs

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "bench"
DATA = BENCH / "preregistered_runs.toml"
DEVELOPMENT = BENCH / "published_runs.toml"


@pytest.fixture(scope="module")
def runs():
    return load_runs(DATA)


def test_size_and_new_sources(runs):
    assert len(runs) >= 25
    development = {r.source_id for r in load_runs(DEVELOPMENT)}
    new = {r.source_id for r in runs} - development
    assert len(new) >= 4, sorted(new)
    assert all(r.source_id in new for r in runs), "a pre-registered row comes from a development source"


def test_rows_are_not_development_rows(runs):
    development = load_runs(DEVELOPMENT)
    assert not {r.name for r in runs} & {r.name for r in development}
    assert not {r.url for r in runs} & {r.url for r in development}


def test_no_row_is_tagged_held_out(runs):
    """Every row is held out by construction; the development set's every-third-row tag is not used."""
    assert not [r.name for r in runs if r.held_out]


def test_every_url_is_https_and_every_row_says_what_it_assumed(runs):
    for run in runs:
        assert run.url.startswith("https://"), run.name
        assert run.source and run.assumptions, run.name


def test_header_records_the_preregistration():
    header = DATA.read_text().split("[[run]]", 1)[0]
    for phrase in ("before any model change", "never used to choose or tune a mechanism", "evaluated once"):
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
