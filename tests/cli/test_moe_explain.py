"""`planner plan --explain` on an MoE model says what expert parallelism, expert tensor
parallelism and the schedule each cost: a row per EP and ETP change and per schedule, each
with the part of the step that grew."""

from __future__ import annotations

import re


def rows(out: str) -> dict[str, str]:
    """Explain-table rows by their change (first cell), each with its text joined across
    wrapped lines."""
    table: dict[str, str] = {}
    current = None
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) < 6:
            continue
        if cells[0]:
            current = cells[0]
            table[current] = ""
        if current is not None:
            table[current] += " " + cells[-1]
    return {k: re.sub(r"\s+", " ", v).strip() for k, v in table.items()}


def test_explain_prices_ep_etp_and_the_schedule(cli):
    code, out, err = cli(
        "plan",
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
        "--tp",
        "2",
        "--pp",
        "8",
        "--mbs",
        "2",
        "--schedules",
        "dualpipev,zbv,1f1b",
        "--top",
        "1",
        "--explain",
    )
    assert code == 0, err
    table = rows(out.split("why not something else")[1])
    best = re.search(r"best: (.*)\)", out).group(1)
    assert "dualpipev" in best and "ep1" in best and "etp2" in best
    # zbv runs the same layout but cannot hide the all-to-all behind the paired micro-batch
    assert re.match(r"[\d.]+% slower: MoE all-to-all \+", table["schedule zbv"])
    # EP 2 sends half the experts' tokens to the other rank and waits for its busiest rank
    assert "slower" in table["ep 2"] and "busiest expert rank" in table["ep 2"]
    assert "slower" in table["etp 1"] or "does not fit" in table["etp 1"]
    assert "schedule 1f1b" in table
