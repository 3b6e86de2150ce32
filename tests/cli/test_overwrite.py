"""Output files the user names are never overwritten silently: an existing one is refused in one
`error:` line naming it and --force (exit 2, nothing written); --force overwrites it, and an
export into a folder replaces only the export's own files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner.plan import parse_plan_file

TINY = ("--model", "tiny-llama", "--gpus", "8", "--gpu", "h100", "--global-batch", "32", "--seq", "512")
EXAMPLE_PLAN = Path(__file__).parents[2] / "examples" / "plans" / "llama3-8b-32gpu-1f1b.json"
KEPT = "made by hand\n"


def _refused(result, target: Path) -> None:
    """The command refused `target` in one error line naming it and --force, and left it as it was."""
    code, _, err = result
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert str(target) in err and "--force" in err
    assert target.read_text() == KEPT


def _existing(path: Path) -> Path:
    path.write_text(KEPT)
    return path


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """A tiny-llama plan file with its recorded inputs (what `planner report` reads)."""
    from planner.cli import run

    path = tmp_path_factory.mktemp("plan") / "plan.json"
    with pytest.raises(SystemExit) as exit_info:
        run(["plan", *TINY, "--top", "1", "-o", str(path)])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    return path


@pytest.mark.parametrize("command", [("plan", *TINY, "--top", "1"), ("evaluate", *TINY)])
def test_plan_file_is_refused_then_forced(cli, tmp_path, command):
    target = _existing(tmp_path / "plan.json")
    _refused(cli(*command, "-o", str(target)), target)
    code, _, err = cli(*command, "-o", str(target), "--force")
    assert code == 0, err
    assert parse_plan_file(target.read_text()).plans
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # written as any new file is
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary file left


def test_a_refused_report_writes_no_plan_file_either(cli, tmp_path):
    pytest.importorskip("plotly", reason="--report needs the `report` extra (plotly)")
    page = _existing(tmp_path / "plan.html")
    plan = tmp_path / "new.json"
    _refused(cli("plan", *TINY, "--top", "1", "-o", str(plan), "--report", str(page)), page)
    assert not plan.exists()
    code, _, err = cli("plan", *TINY, "--top", "1", "-o", str(plan), "--report", str(page), "--force")
    assert code == 0, err
    assert "Plotly.newPlot" in page.read_text() and plan.exists()


def test_report_page_is_refused_then_forced(cli, tmp_path, plan_file):
    pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")
    page = _existing(tmp_path / "plan.html")
    _refused(cli("report", str(plan_file), "-o", str(page), "--no-explain"), page)
    code, _, err = cli("report", str(plan_file), "-o", str(page), "--no-explain", "--force")
    assert code == 0, err
    assert "Plotly.newPlot" in page.read_text()


def test_sweep_outputs_are_refused_then_forced(cli, tmp_path):
    pytest.importorskip("plotly", reason="--svg and --report need the `report` extra (plotly)")
    sweep = (
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
        "4,8",
    )
    svg, page = _existing(tmp_path / "sweep.svg"), _existing(tmp_path / "sweep.html")
    _refused(cli(*sweep, "--svg", str(svg)), svg)
    _refused(cli(*sweep, "--report", str(page)), page)
    code, _, err = cli(*sweep, "--report", str(page), "--force")
    assert code == 0, err
    assert "Plotly.newPlot" in page.read_text()


def test_simulate_svg_is_refused_then_forced(cli, tmp_path):
    svg = _existing(tmp_path / "t.svg")
    _refused(cli("simulate", "--svg", str(svg), "--json"), svg)
    code, _, err = cli("simulate", "--svg", str(svg), "--json", "--force")
    assert code == 0, err
    assert svg.read_text().startswith("<svg")


def test_calibration_file_is_refused_before_any_fit(cli, tmp_path):
    target = _existing(tmp_path / "calibration.json")
    missing = tmp_path / "not-read"
    _refused(cli("calibrate", "--from-log", str(missing), "--plan", str(missing), "-o", str(target)), target)


def test_export_refuses_its_files_and_force_leaves_other_files_alone(cli, tmp_path):
    folder = tmp_path / "out"
    code, _, err = cli("export", str(EXAMPLE_PLAN), "--to", "torch", "-o", str(folder))
    assert code == 0, err
    script = folder / "train_pipeline.py"
    exported = {path.name: path.read_text() for path in folder.iterdir()}
    script.write_text(KEPT)
    foreign = _existing(folder / "my_notes.txt")
    _refused(cli("export", str(EXAMPLE_PLAN), "--to", "torch", "-o", str(folder)), script)
    assert (folder / "schedule.csv").read_text() == exported["schedule.csv"]
    code, _, err = cli("export", str(EXAMPLE_PLAN), "--to", "torch", "-o", str(folder), "--force")
    assert code == 0, err
    assert {path.name: path.read_text() for path in folder.iterdir()} == {**exported, "my_notes.txt": KEPT}
    assert foreign.read_text() == KEPT
    assert os.access(script, os.X_OK)  # a script with a #! line stays executable


def test_export_into_a_folder_without_its_files_needs_no_force(cli, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    foreign = _existing(folder / "README")
    code, _, err = cli("export", str(EXAMPLE_PLAN), "--to", "megatron", "-o", str(folder))
    assert code == 0, err
    assert foreign.read_text() == KEPT
    assert {path.name for path in folder.iterdir()} == {
        "README",
        "megatron_args.sh",
        "launch_megatron.sh",
        "PLANNER_PROVENANCE.md",
    }


def test_force_on_a_new_path_just_writes_it(cli, tmp_path):
    target = tmp_path / "plan.json"
    code, out, err = cli("evaluate", *TINY, "--json", "-o", str(target), "--force")
    assert code == 0, err
    assert json.loads(out) == json.loads(target.read_text())


def test_an_export_whose_output_is_cut_off_still_writes_every_file(cli, tmp_path):
    """`planner export ... | head -1`: the reader goes away after one line, and the export is whole."""
    import subprocess
    import sys

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    code, _, err = cli("export", str(EXAMPLE_PLAN), "--to", "torchtitan", "-o", str(whole))
    assert code == 0, err
    export = [sys.executable, "-m", "planner", "export", str(EXAMPLE_PLAN), "--to", "torchtitan", "-o", str(cut)]
    reader = subprocess.Popen(["head", "-1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    subprocess.run(export, stdout=reader.stdin, stderr=subprocess.DEVNULL, check=False)
    reader.stdin.close()
    reader.wait()
    assert {p.name: p.read_text() for p in cut.iterdir()} == {p.name: p.read_text() for p in whole.iterdir()}
