"""The report's plan table says what `planner plan --json` says for the same request: every
degree, batch count, cut, step time, throughput, MFU, bubble and memory, read back from the
page's HTML and held to the JSON at the precision the cell shows."""

from __future__ import annotations

import json

import pytest

from planner.run_length import expand_counts
from tests.report.conftest import PLAN_ARGS, WIDE_PLAN_ARGS
from tests.report.tables import plan_table

INTEGERS = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "V": "vpp", "mbs": "mbs", "M": "num_microbatches"}
"""Integer columns by the plan file field they show."""
ROUNDED = {
    "step s": lambda p: p["step_time_s"],
    "tokens/s": lambda p: p["tokens_per_s"],
    "MFU": lambda p: 100 * p["mfu"],
    "bubble": lambda p: 100 * p["bubble_fraction"],
    "mem GiB": lambda p: max(p["memory_gb_per_stage"]),
}
"""Rounded columns: the value each shows, from the plan's `predicted` record (percent for MFU and bubble)."""
TEXT = {"schedule", "recompute", "sp", "runs on"}
"""Columns with no number in them (held to the JSON elsewhere, or names only)."""


def model_order_sizes(plan: dict) -> list[int]:
    """Layers per virtual stage in model order: every (rank, chunk) range of the plan (a rank's
    one [start, end) or its chunks' list of them), by first layer."""
    ranks = plan["stage_layers"]
    ranges = sorted(tuple(r) for chunks in ranks for r in ([chunks] if isinstance(chunks[0], int) else chunks))
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), "ranges do not tile the layers"
    return [end - start for start, end in ranges]


def assert_shows(cell: str, value: float, column: str) -> None:
    """`cell` ('53.107', '157,957', '40.9%') is `value` rounded to the digits the cell shows."""
    number = cell.rstrip("%").replace(",", "")
    decimals = len(number.partition(".")[2])
    assert abs(float(number) - value) <= 0.5 * 10**-decimals * (1 + 1e-9), f"{column}: {cell} shows {value}"


@pytest.mark.parametrize(("fixture", "args"), [("plan_report", PLAN_ARGS), ("wide_plan_report", WIDE_PLAN_ARGS)])
def test_every_number_in_the_plan_table_is_the_json_s(fixture, args, request, cli, capsys):
    _, page = request.getfixturevalue(fixture)
    capsys.readouterr()  # what writing the report printed, when this test wrote it
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    plans = json.loads(out)["plans"]
    table = plan_table(page.read_text())
    assert len(table.rows) == len(plans) > 1
    assert set(table.header) == {"#", "zero", "cuts", *INTEGERS, *ROUNDED, *TEXT}, table.header
    for rank, (row, titles, plan) in enumerate(zip(table.rows, table.titles, plans), start=1):
        cells = dict(zip(table.header, row))
        assert int(cells["#"]) == rank
        for column, field in INTEGERS.items():
            assert int(cells[column]) == plan[field], column
        assert int(cells["zero"]) == plan["zero_stage"]
        assert cells["schedule"] == plan["schedule"]
        assert cells["sp"] == ("y" if plan["sequence_parallel"] else "n")
        sizes = model_order_sizes(plan)
        assert expand_counts(cells["cuts"], "cuts") == sizes
        assert len(cells["cuts"]) <= len("|".join(map(str, sizes)))
        assert [int(s) for s in titles[table.header.index("cuts")].split("|")] == sizes
        for column, value in ROUNDED.items():
            assert_shows(cells[column], value(plan["predicted"]), column)


def test_the_wide_plan_s_cuts_are_written_as_runs(wide_plan_report):
    """64 virtual stages of mostly 2 layers: a few runs in the cell, every count in its title."""
    plan, page = wide_plan_report
    table = plan_table(page.read_text())
    cuts = table.header.index("cuts")
    for row, titles in zip(table.rows, table.titles):
        assert "×" in row[cuts] and len(row[cuts]) < 20, row[cuts]
        assert titles[cuts].count("|") == 63
    first = json.loads(plan.read_text())["plans"][0]
    assert first["pp"] * first["vpp"] == 64


def test_an_moe_plan_s_table_shows_its_expert_degrees_and_a_dense_one_none():
    from planner.api import plan
    from planner.cli.report_cmd import plans_rows
    from planner.request import Request
    from planner.search.space import SearchSpace

    request = Request(model="tiny-moe", gpu="h100", num_gpus=8, global_batch=16, seq=256)
    moe = plan(request, SearchSpace(ep=(2, 4)), top=3).plans
    table = plans_rows(moe)
    assert {"ep", "etp"} <= set(table.header)
    for row, entry in zip(table.rows, moe):
        cells = dict(zip(table.header, row))
        assert (int(cells["ep"]), int(cells["etp"])) == (entry.ep, entry.etp or 1)
    assert all(entry.ep > 1 for entry in moe)
    dense = plan(Request(model="tiny-llama", gpu="h100", num_gpus=8, global_batch=16, seq=256), top=1).plans
    assert not {"ep", "etp"} & set(plans_rows(dense).header)
