"""What `plan`, `evaluate` and `simulate` print reads whole in an 80- or 120-column terminal:
every number of the plans table in full, `--help` with every option name, one meaning of
bubble everywhere, candidate counts whose parts add up, and reasons in a dense model's words."""

from __future__ import annotations

import json
import re

import pytest
from typer.main import get_command

from planner.cli import app
from planner.cli.report import cut_sizes
from planner.plan import parse_plan_file
from planner.run_length import run_length

# README.md's first command
README_REQUEST = ("--model", "llama3-70b", "--gpus", "1024", "--gpu", "h100", "--global-batch", "1024", "--seq", "8192")
SMALL = ("--model", "llama3-8b", "--gpus", "16", "--gpu", "h100", "--global-batch", "64", "--seq", "4096")


def table_rows(out: str) -> list[list[str]]:
    """The words of each row of the plans table (the first table headed `#`, under its rule)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ") and lines[i + 1].startswith("─"))
    rows = []
    for line in lines[start + 2 :]:
        if not line[:1].isdigit():
            break
        rows.append(line.split())
    return rows


def is_subsequence(words: list[str], within: list[str]) -> bool:
    """Whether `words` occur in `within` in this order."""
    rest = iter(within)
    return all(word in rest for word in words)


@pytest.mark.parametrize("columns", [80, 120])
def test_the_readme_plans_show_every_number_in_full(cli, tmp_path, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    path = tmp_path / "p.json"
    code, out, err = cli("plan", *README_REQUEST, "-o", str(path))
    assert code == 0, err
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= columns
    plans = parse_plan_file(path.read_text()).plans
    rows = table_rows(out)
    assert len(rows) == len(plans) == 5
    for rank, (row, plan) in enumerate(zip(rows, plans), start=1):
        p = plan.predicted
        expected = [
            str(rank),
            str(plan.tp),
            str(plan.pp),
            str(plan.dp),
            str(plan.cp),
            str(plan.vpp),
            str(plan.mbs),
            str(plan.num_microbatches),
            f"{p.step_time_s:.3f}",
            f"{p.mfu:.1%}",
            f"{p.bubble_fraction:.1%}",
            f"{max(p.memory_gb_per_stage):.1f}",
        ]
        assert is_subsequence(expected, row), (expected, row)
        assert f"{p.tokens_per_s:,.0f}" in out and run_length(cut_sizes(plan)) in out
    assert "i1f1b = interleaved_1f1b" in out or all(plan.schedule != "interleaved_1f1b" for plan in plans)


def test_wide_lists_every_stage(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli("evaluate", *README_REQUEST, "--tp", "4", "--pp", "4", "--vpp", "8", "--wide", "--json")
    assert code == 0, err
    [plan] = parse_plan_file(out).plans
    code, out, err = cli("evaluate", *README_REQUEST, "--tp", "4", "--pp", "4", "--vpp", "8", "--wide")
    assert code == 0, err
    listed = re.search(r"^cuts: ([\d ]+);", out, re.MULTILINE)
    assert listed is not None, out
    assert listed.group(1).split() == [str(size) for size in cut_sizes(plan)]


@pytest.mark.parametrize("command", ["plan", "evaluate", "sweep"])
def test_help_names_every_option_whole_at_80_columns(cli, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli(command, "--help")
    assert code == 0, err
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    names = [
        name for param in get_command(app).commands[command].params for name in (*param.opts, *param.secondary_opts)
    ]
    assert "--moe-dispatcher" in names or command != "plan"
    for name in names:
        assert re.search(rf"(^|[\s,/]){re.escape(name)}($|[\s,/])", out, re.MULTILINE), name


def test_the_table_the_breakdown_and_the_json_mean_one_bubble(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "p.json"
    code, out, err = cli("plan", *SMALL, "--pp", "2,4", "--top", "3", "-o", str(path))
    assert code == 0, err
    plans = parse_plan_file(path.read_text()).plans
    for row, plan in zip(table_rows(out), plans):
        assert f"{plan.predicted.bubble_fraction:.1%}" in row
    best = plans[0].predicted
    assert re.search(r"bubble: ranks' mean idle / span\s*│\s*([\d.]+%)", out).group(1) == f"{best.bubble_fraction:.1%}"
    idle = re.search(r"time: pipeline idle\s*│\s*([\d.]+) s", out).group(1)
    assert idle == f"{best.time_breakdown_s['pipeline_bubble']:.3f}"
    assert "time: pipeline bubble" not in out  # the critical rank's idle seconds are not called bubble


def test_simulate_counts_bubble_as_the_plans_do(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    code, out, err = cli("simulate", "--schedule", "zbv", "--json")
    assert code == 0, err
    figures = json.loads(out)
    code, out, err = cli("simulate", "--schedule", "zbv")
    assert code == 0, err
    assert f"bubble {figures['bubble_fraction']:.1%}: the ranks' mean idle share of the longest rank span" in out
    assert "idle in step ms" in out  # the step-relative idle time has its own name


def count_of(text: str) -> int:
    """A count as printed, '6,230' -> 6230."""
    return int(text.replace(",", ""))


@pytest.mark.parametrize(
    "argv",
    [
        (*SMALL,),
        (*SMALL, "--runtime", "megatron"),
        (
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--gpu",
            "h100",
            "--global-batch",
            "256",
            "--seq",
            "4096",
            "--pp",
            "2,4",
            "--mbs",
            "1",
        ),
    ],
)
def test_candidate_counts_add_up(cli, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = cli("plan", *argv, "--top", "2")
    assert code == 0, err
    searched = re.search(
        r"searched ([\d,]+) candidates in [\d.]+ s: ([\d,]+) over memory by their state alone, "
        r"([\d,]+) cut by the step-time bound, ([\d,]+) solved for cut points",
        out,
    )
    total, *parts = map(count_of, searched.groups())
    assert total == sum(parts) > 0
    gave = re.search(
        r"these ([\d,]+) gave ([\d,]+) layouts: ([\d,]+) over memory, ([\d,]+) cut by the step-time "
        r"bound, ([\d,]+) simulated \((.*)\)$",
        out,
        re.MULTILINE,
    )
    solved, layouts, over, cut, simulated = map(count_of, gave.groups()[:5])
    assert solved == parts[-1] and layouts == over + cut + simulated
    assert simulated == sum(count_of(part.split()[0]) for part in gave.group(6).split(", ")) > 0


def test_a_dense_plan_loses_in_dense_words(cli, tmp_path, monkeypatch):
    pytest.importorskip("plotly")
    monkeypatch.setenv("COLUMNS", "200")
    report = tmp_path / "r.html"
    code, out, err = cli("plan", *SMALL, "--top", "1", "--explain", "--moe-imbalance", "1.5", "--report", str(report))
    assert code == 0, err
    explained = out.split("why not something else")[1]
    assert "slower" in explained and "expert" not in explained
    page = report.read_text()
    assert "moe-imbalance" not in page and "moe_imbalance" not in page and "expert rank" not in page
