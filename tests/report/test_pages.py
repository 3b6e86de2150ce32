"""The report pages: self-contained, re-created from the plan file, and the extra's absence."""

from __future__ import annotations

import json
import re
import sys

from planner.plan import parse_plan_file

CHARTS = ("timeline", "memory", "activations", "breakdown")


def test_the_page_is_self_contained(plan_report):
    """No script, style or image is fetched: nothing has a src or href to another document."""
    _, page = plan_report
    html = page.read_text()
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=", html)
    assert "<link" not in html
    for chart in CHARTS:
        assert f'<div id="{chart}"' in html
    assert "Plotly.newPlot" in html


def test_the_page_shows_the_plan_file_and_its_budget(plan_report):
    plan, page = plan_report
    html = page.read_text()
    document = parse_plan_file(plan.read_text())
    best = document.plans[0]
    assert document.request is not None and document.request.num_gpus == 8
    for name in best.runtimes:
        assert f"planner export {plan} --to {name}" in html
    assert "Why not something else" in html
    steps = 1e9 / (best.global_batch * best.seq)
    assert f"{steps:,.0f}" in html
    days = steps * best.predicted.step_time_s / 86400
    assert f"{days:,.1f}" in html
    assert "cost at 2.5 per GPU-hour" in html


def _report(cli, plan, out, *extra):
    return cli("report", str(plan), "-o", str(out), "--no-explain", *extra)


def test_report_re_creates_the_plan_from_the_file(plan_report, tmp_path, cli):
    """`planner report` re-simulates the best plan to the step time the file recorded."""
    plan, _ = plan_report
    code, out, err = _report(cli, plan, tmp_path / "again.html")
    assert code == 0, err
    html = (tmp_path / "again.html").read_text()
    assert "differs from the file" not in html
    step_ms = parse_plan_file(plan.read_text()).plans[0].predicted.step_time_s * 1e3
    assert f"step {step_ms:,.0f} ms" in html


def test_a_plan_file_without_inputs_still_reports(plan_report, tmp_path, cli):
    plan, _ = plan_report
    document = json.loads(plan.read_text())
    del document["request"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(document))
    code, _, err = _report(cli, old, tmp_path / "old.html")
    assert code == 0, err
    assert "predates recorded inputs" in (tmp_path / "old.html").read_text()


def test_a_plan_file_with_the_older_inputs_record_rebuilds_its_request(plan_report, tmp_path, cli):
    """Files written before the request was recorded kept an `inputs` record: it is read as
    the request, so the page re-simulates the same job."""
    plan, _ = plan_report
    document = json.loads(plan.read_text())
    request = document.pop("request")
    document["inputs"] = {
        "gpu": request["gpu"],
        "num_gpus": request["num_gpus"],
        "precision": "bf16",
        "moe_dispatcher": "alltoall",
        "moe_ep_overlap": False,
        "command": ["planner", "plan"],
    }
    old = tmp_path / "old.json"
    old.write_text(json.dumps(document))
    code, _, err = _report(cli, old, tmp_path / "old.html")
    assert code == 0, err
    html = (tmp_path / "old.html").read_text()
    assert "predates recorded inputs" not in html and "differs from the file" not in html


def test_without_plotly_report_exits_2_saying_what_to_install(plan_report, tmp_path, cli, monkeypatch):
    plan, _ = plan_report
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises ImportError
    code, out, err = _report(cli, plan, tmp_path / "none.html")
    assert code == 2
    assert err.strip().count("\n") == 0 and "pip install 'planner[report]'" in err
    assert not (tmp_path / "none.html").exists()
    code, _, err = cli(
        "plan",
        "--model",
        "tiny-llama",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq",
        "512",
        "--report",
        str(tmp_path / "p.html"),
    )
    assert code == 2 and "planner[report]" in err


def test_sweep_report_labels_the_winning_layout_at_each_value(tmp_path, cli):
    page = tmp_path / "sweep.html"
    code, _, err = cli(
        "sweep",
        "--model",
        "tiny-llama",
        "--gpu",
        "h100",
        "--global-batch",
        "32",
        "--seq",
        "512",
        "--vary",
        "gpus",
        "--values",
        "2,4,8",
        "--report",
        str(page),
    )
    assert code == 0, err
    html = page.read_text()
    figure = json.loads(re.search(r"var figures = (\{.*?\});\n", html, re.S).group(1).replace("<\\/", "</"))
    traces = figure["sweep"]["data"]
    assert [t["x"] for t in traces] == [[2, 4, 8]] * 2
    labels = traces[0]["text"]
    assert len(labels) == 3 and all(re.fullmatch(r"tp\d+ pp\d+ dp\d+.*", label) for label in labels)
    # as the GPU count varies the second series is MFU (the scaling efficiency), not tokens/s per GPU
    assert traces[1]["name"] == "MFU (%)"
    assert figure["sweep"]["layout"]["xaxis2"]["tickvals"] == [2, 4, 8]


def test_text_cells_may_wrap_after_commas_and_numbers_never():
    """A list in a text column ('2,3×26,2') breaks after its commas; a number's thousands
    separators ('157,957') do not break; titles and cells are escaped."""
    from planner.report.html import Table, table_html

    table = Table(
        ("cuts", "tokens/s"), (("2,3×26,2", "157,957"), ("<1>", "1")), frozenset({"cuts"}), titles=({"cuts": 'a"b'}, {})
    )
    html = table_html(table, element_id="plans")
    assert html.startswith('<table id="plans">')
    assert '<td class="text" title="a&quot;b">2,<wbr>3×26,<wbr>2</td><td>157,957</td>' in html
    assert '<td class="text">&lt;1&gt;</td><td>1</td>' in html
