"""`planner simulate`: the JSON contract, the flag mapping, the SVG file and user errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

import planner.cli.simulate  # noqa: F401  (registers the command)
from planner.cli.app import app, run
from planner.errors import ScheduleError


def _run(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        run(["simulate", *argv])
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def _json(capsys, *argv):
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_contract_for_1f1b(capsys):
    figures = _json(capsys, "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2")
    assert {"step_time", "bubble_fraction", "busy_per_stage", "peak_inflight_per_stage"} <= set(figures)
    assert (figures["schedule"], figures["stages"], figures["microbatches"], figures["vpp"], figures["units"]) == (
        "1f1b",
        4,
        8,
        1,
        "ms",
    )
    assert figures["step_time"] == pytest.approx(33.0)
    assert figures["bubble_fraction"] == pytest.approx(3 / 11)
    assert figures["busy_per_stage"] == pytest.approx([24.0] * 4)
    assert figures["peak_inflight_per_stage"] == [4, 3, 2, 1]


def test_b_and_w_map_to_input_and_weight_grad(capsys):
    """--b is the full backward, --w its weight-grad part: I = b - w, W = w. ZB-H1 then idles
    (P-1)(F + I - W) per rank."""
    for w, idle in ((1.0, 3 * (1 + 1 - 1)), (0.5, 3 * (1 + 1.5 - 0.5))):
        figures = _json(capsys, "--schedule", "zb_h1", "--f", "1", "--b", "2", "--w", str(w))
        assert figures["step_time"] == pytest.approx(8 * 3 + idle)
    default = _json(capsys, "--schedule", "zb_h1", "--f", "1", "--b", "2")
    assert default["step_time"] == pytest.approx(27.0)
    assert default["peak_inflight_per_stage"] == [4, 4, 4, 4]
    assert default["peak_inflight_freed_at_input_grad_per_stage"] == [4, 3, 2, 1]


def test_vpp_splits_the_rank_time_across_chunks(capsys):
    figures = _json(capsys, "--schedule", "interleaved_1f1b", "--vpp", "2", "--microbatches", "8")
    assert figures["bubble_fraction"] == pytest.approx(3 / 19)
    assert figures["busy_per_stage"] == pytest.approx([24.0] * 4)


def test_comm_delays_the_step(capsys):
    base = _json(capsys, "--schedule", "gpipe")["step_time"]
    assert _json(capsys, "--schedule", "gpipe", "--comm", "0.5")["step_time"] > base


def test_terminal_output_and_svg(capsys, tmp_path):
    path = tmp_path / "zbv.svg"
    code, out, err = _run(capsys, "--schedule", "zbv", "--vpp", "2", "--svg", str(path))
    assert code == 0
    assert "zbv  P=4 M=8 V=2" in out and "rank 3" in out and "step time" in out and "bubble" in out
    assert f"wrote {path}" in err
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")


@pytest.mark.parametrize(
    ("schedule", "vpp"),
    [("zbv", 2), ("dualpipev", 2), ("interleaved_1f1b", 2), ("chimera", 2), ("1f1b", 1), ("seq1f1b", 1)],
)
def test_vpp_defaults_to_what_the_schedule_needs(capsys, schedule, vpp):
    assert _json(capsys, "--schedule", schedule)["vpp"] == vpp


@pytest.mark.parametrize(
    "schedule, title", [("chimera", "chimera  P=4 M=8 V=2"), ("seq1f1b", "seq1f1b  P=4 M=8 V=1 k=4")]
)
def test_chimera_and_seq1f1b_draw_their_timelines(capsys, tmp_path, schedule, title):
    path = tmp_path / f"{schedule}.svg"
    code, out, err = _run(capsys, "--schedule", schedule, "--svg", str(path))
    assert code == 0, err
    assert title in out and "rank 3" in out and "bubble" in out
    assert ET.parse(path).getroot().tag.endswith("svg")


def test_chimera_runs_each_microbatch_through_one_stage_and_seq1f1b_splits_it(capsys):
    """--f/--b are one micro-batch on one rank: Chimera's rank runs M of them (M/2 on each of
    its two stages), Seq1F1B's k segments of 1/k each; both match 1F1B's busy time, with less
    bubble (P=4, M=8, f=1, b=2: 1F1B 3/11, Chimera 2(P-2)/(3M+2(P-2)) = 1/7, Seq1F1B k=4 3/35)."""
    one, chim = _json(capsys, "--schedule", "1f1b"), _json(capsys, "--schedule", "chimera")
    seq = _json(capsys, "--schedule", "seq1f1b", "--segments", "4")
    assert one["busy_per_stage"] == chim["busy_per_stage"] == pytest.approx(seq["busy_per_stage"]) == [24.0] * 4
    assert (one["bubble_fraction"], chim["bubble_fraction"], seq["bubble_fraction"]) == pytest.approx(
        (3 / 11, 1 / 7, 3 / 35)
    )
    causal = _json(capsys, "--schedule", "seq1f1b", "--attention-share", "0.5")
    assert causal["busy_per_stage"] == pytest.approx([24.0] * 4) and causal["step_time"] > seq["step_time"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--schedule", "2f2b"], "unknown schedule '2f2b'"),
        (["--schedule", "chimera", "--stages", "3"], "even number of stages"),
        (["--schedule", "1f1b", "--segments", "2"], "segments=2"),
        (["--schedule", "1f1b", "--attention-share", "0.3"], "--attention-share applies to seq1f1b"),
        (["--schedule", "seq1f1b", "--attention-share", "2"], "within 0..1"),
        (["--schedule", "zbv", "--vpp", "1"], "needs vpp 2"),
        (["--schedule", "1f1b", "--stages", "8", "--microbatches", "4"], "microbatches >= 8"),
        (["--schedule", "zb_h1", "--b", "1", "--w", "2"], "0 <= w <= b"),
        (["--schedule", "gpipe", "--f", "-1"], "--f must be >= 0"),
        (["--schedule", "interleaved_1f1b", "--vpp", "2", "--microbatches", "9"], "not a multiple of 2"),
        (["--schedule", "looped_bfs", "--vpp", "0"], "must be positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1


def test_unwritable_svg_is_one_line(capsys, tmp_path):
    code, _, err = _run(capsys, "--svg", str(tmp_path / "missing" / "t.svg"))
    assert code == 2 and err.startswith("error: cannot write") and err.count("\n") == 1


def test_w_on_an_unsplit_schedule_warns(capsys):
    code, _, err = _run(capsys, "--schedule", "1f1b", "--w", "0.5", "--json")
    assert code == 0 and "--w has no effect on 1f1b" in err


def test_cli_runner_propagates_schedule_error():
    result = CliRunner().invoke(app, ["simulate", "--schedule", "nope"])
    assert isinstance(result.exception, ScheduleError)
