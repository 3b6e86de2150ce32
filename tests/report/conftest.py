"""Plan files and their reports, written once per test session."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")

PLAN_ARGS = ("plan", "--model", "tiny-llama", "--gpus", "8", "--global-batch", "32", "--seq", "512", "--pp", "2")
WIDE_PLAN_ARGS = (
    *("plan", "--model", "llama3-405b", "--gpus", "1024", "--gpu", "h100", "--global-batch", "1024"),
    *("--seq", "8192", "--pp", "16", "--vpp", "4"),
)
"""A plan whose table is wide: 64 virtual stages of cuts, six-digit tokens/s, long schedule names."""


def _write_plan(folder, args: tuple[str, ...], *extra: str):
    """(plan.json path, plan.html path) written by `planner ARGS -o plan.json --report plan.html EXTRA`."""
    from planner.cli import run

    plan, page = folder / "plan.json", folder / "plan.html"
    with pytest.raises(SystemExit) as exit_info:
        run([*args, "-o", str(plan), "--report", str(page), *extra])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    return plan, page


@pytest.fixture(scope="session")
def plan_report(tmp_path_factory):
    """(plan.json path, plan.html path) of a two-rank tiny-llama plan."""
    return _write_plan(tmp_path_factory.mktemp("report"), PLAN_ARGS, "--tokens", "1e9", "--gpu-hour-price", "2.5")


@pytest.fixture(scope="session")
def wide_plan_report(tmp_path_factory):
    """(plan.json path, plan.html path) of a llama3-405b plan on 1,024 GPUs with 64 virtual stages."""
    return _write_plan(tmp_path_factory.mktemp("wide-report"), WIDE_PLAN_ARGS)
