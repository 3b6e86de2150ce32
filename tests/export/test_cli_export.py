"""`planner export`: reads the plan file `planner plan -o` writes, writes each runtime's files,
and turns every refusal or bad input into one line on stderr with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from export_helpers import make_plan

import planner.cli  # noqa: F401  (registers every command)
from planner.cli.app import run
from planner.plan import parse_plan_file

EXAMPLES = Path(__file__).parents[2] / "examples" / "plans"


def invoke(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(list(argv))
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def plan_path(tmp_path: Path, plan_file) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(plan_file.model_dump_json(indent=2))
    return path


@pytest.mark.parametrize(
    "runtime, expected",
    [
        ("megatron", {"megatron_args.sh", "launch_megatron.sh"}),
        ("torchtitan", {"planner_recipe.py", "schedule.csv", "launch_torchtitan.sh"}),
        ("torch", {"train_pipeline.py", "schedule.csv", "launch_torch.sh"}),
        (
            "deepspeed",
            {"ds_config.json", "deepspeed_pipeline.py", "launch_deepspeed.sh", "hostfile", "train_deepspeed.py"},
        ),
    ],
)
def test_export_writes_the_runtime_files(runtime, expected, tmp_path, capsys):
    path = plan_path(tmp_path, make_plan("tiny-llama", dtype="fp32"))
    out_dir = tmp_path / "out" / runtime
    code, out, err = invoke(capsys, "export", str(path), "--to", runtime, "-o", str(out_dir))
    assert code == 0, err
    written = {p.name for p in out_dir.iterdir()}
    assert written == expected | {"PLANNER_PROVENANCE.md"}
    assert f"to {out_dir}/:" in out
    for name in written:
        assert f"  {name} " in out  # every written file is listed
    provenance = (out_dir / "PLANNER_PROVENANCE.md").read_text()
    assert "planner 0.1.0" in provenance and "predicted: step" in provenance
    assert "predicted: step 1.25 s" not in provenance  # priced afresh: the file's figures were made up
    assert "in the file" in out


def test_export_picks_the_plan_by_its_number_in_the_table(tmp_path, capsys):
    """`--number N` is the plan the table numbers N (1 = the best), as the export's files say."""
    first, second = make_plan("tiny-llama", schedule="gpipe"), make_plan("tiny-llama", schedule="1f1b")
    both = first.model_copy(update={"plans": first.plans + second.plans})
    path = plan_path(tmp_path, both)
    code, out, _ = invoke(capsys, "export", str(path), "--to", "megatron", "-o", str(tmp_path / "a"), "--number", "2")
    assert code == 0 and "(plan #2 of" in out
    args = (tmp_path / "a" / "megatron_args.sh").read_text()
    assert "plan #2 of 2" in args and "1f1b" in args
    assert invoke(capsys, "export", str(path), "--to", "torch", "-o", str(tmp_path / "c"))[0] == 0
    provenance = (tmp_path / "c" / "PLANNER_PROVENANCE.md").read_text()
    assert "plan #1 of 2" in provenance and "gpipe" in provenance
    code, _, err = invoke(capsys, "export", str(path), "--to", "megatron", "-o", str(tmp_path / "b"), "--number", "3")
    assert code == 2 and "no plan number 3" in err and "--number 1..2" in err and len(err.strip().splitlines()) == 1


def test_example_plans_round_trip(tmp_path, capsys):
    for example in sorted(EXAMPLES.glob("*.json")):
        plan_file = parse_plan_file(example.read_text(), str(example))
        code, _, err = invoke(capsys, "export", str(example), "--to", "torch", "-o", str(tmp_path / example.stem))
        assert code == 0, err
        assert f"model {plan_file.model.name}" in (tmp_path / example.stem / "train_pipeline.py").read_text()


@pytest.mark.parametrize(
    "runtime, fields, words",
    [
        ("megatron", dict(schedule="zbv", vpp=2, stage_layers=[[[0, 1], [3, 4]], [[1, 2], [2, 3]]]), "Megatron-LM"),
        ("deepspeed", dict(zero_stage=3), "ZeRO-3 with pipeline"),
        ("torchtitan", dict(recompute=["full", "none"]), "recompute differs"),
        ("torch", dict(cp=2), "context parallelism"),
    ],
)
def test_refusals_are_one_line_and_exit_2(runtime, fields, words, tmp_path, capsys):
    path = plan_path(tmp_path, make_plan("tiny-llama", **fields))
    code, out, err = invoke(capsys, "export", str(path), "--to", runtime, "-o", str(tmp_path / "out"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and words in err
    assert not (tmp_path / "out").exists()  # nothing written for a refused plan


@pytest.mark.parametrize(
    "content, words",
    [
        ("not json", "Invalid JSON"),
        ('{"plans": [{"tp": 1}]}', "field 'plans.0"),
    ],
)
def test_bad_plan_files_are_one_line_and_exit_2(content, words, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(content)
    code, _, err = invoke(capsys, "export", str(path), "--to", "torch", "-o", str(tmp_path / "out"))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_unknown_target_and_missing_file(tmp_path, capsys):
    path = plan_path(tmp_path, make_plan())
    code, _, err = invoke(capsys, "export", str(path), "--to", "jax", "-o", str(tmp_path / "out"))
    assert code == 2 and "unknown export target 'jax'" in err
    code, _, err = invoke(capsys, "export", str(tmp_path / "missing.json"), "--to", "torch", "-o", str(tmp_path / "o"))
    assert code == 2 and "cannot read plan file" in err


def test_plan_file_without_model_is_refused(tmp_path, capsys):
    path = plan_path(tmp_path, make_plan().model_copy(update={"model": None}))
    code, _, err = invoke(capsys, "export", str(path), "--to", "megatron", "-o", str(tmp_path / "out"))
    assert code == 2 and "no 'model' section" in err


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan", "torch", "deepspeed"])
@pytest.mark.parametrize("schedule, words", [("chimera", "opposite directions"), ("seq1f1b", "sequence segments")])
def test_simulated_only_schedules_are_refused_by_every_exporter(runtime, schedule, words, tmp_path, capsys):
    """No runtime runs Chimera or Seq1F1B (torch's CSV runtime would run a different
    schedule: one V pipeline, or each segment as a whole micro-batch): one line naming it."""
    plan = json.loads(make_plan("tiny-llama").model_dump_json())
    plan["plans"][0]["schedule"] = schedule
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    code, _, err = invoke(capsys, "export", str(path), "--to", runtime, "-o", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"schedule '{schedule}' is planned and simulated only" in err and words in err
    assert not (tmp_path / "out").exists()
