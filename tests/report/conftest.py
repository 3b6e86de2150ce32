"""A small plan file and its report, written once per test session."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")

PLAN_ARGS = ("plan", "--model", "tiny-llama", "--gpus", "8", "--global-batch", "32", "--seq", "512", "--pp", "2")


@pytest.fixture(scope="session")
def plan_report(tmp_path_factory):
    """(plan.json path, plan.html path, the command's stdout) of a two-rank tiny-llama plan."""
    from planner.cli import run

    folder = tmp_path_factory.mktemp("report")
    plan, page = folder / "plan.json", folder / "plan.html"
    with pytest.raises(SystemExit) as exit_info:
        run([*PLAN_ARGS, "-o", str(plan), "--report", str(page), "--tokens", "1e9", "--gpu-hour-price", "2.5"])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    return plan, page
