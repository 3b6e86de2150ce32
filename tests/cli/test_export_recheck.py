"""`planner export` checks a plan file against its model, cluster and request and prices it
afresh before writing anything: a hand edit that breaks a rule is refused in one line, a valid
one is exported with its own figures."""

from __future__ import annotations

import json

import pytest

JOB = ["--model", "llama3-8b", "--gpus", "16", "--gpu", "h100", "--global-batch", "64", "--seq", "4096"]


@pytest.fixture()
def plan_json(cli, tmp_path):
    path = tmp_path / "plan.json"
    code, _, err = cli("evaluate", *JOB, "--tp", "2", "--pp", "2", "-o", str(path))
    assert code == 0, err
    return path


def _edited(path, edit):
    document = json.loads(path.read_text())
    edit(document["plans"][0])
    edited = path.with_name("edited.json")
    edited.write_text(json.dumps(document))
    return edited


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda plan: plan.update(tp=3), "GPUs, but the cluster has 16"),
        (lambda plan: plan.update(ep=2), "ep 2 needs a mixture-of-experts model"),
        (lambda plan: plan.update(stage_layers=[[0, 10], [12, 32]]), "do not cover the layers contiguously"),
        (lambda plan: plan.update(stage_layers=[[0, 10], [10, 30]]), "the model has 32 layers"),
    ],
)
def test_a_hand_edit_that_breaks_a_rule_is_refused(cli, plan_json, tmp_path, edit, words):
    code, out, err = cli("export", str(_edited(plan_json, edit)), "--to", "megatron", "-o", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and words in err
    assert not (tmp_path / "out").exists()


def test_a_valid_edit_is_exported_with_fresh_figures(cli, plan_json, tmp_path):
    fresh = json.loads(plan_json.read_text())["plans"][0]["predicted"]["step_time_s"]
    edited = _edited(plan_json, lambda plan: plan["predicted"].update(step_time_s=99.0))
    code, out, err = cli("export", str(edited), "--to", "megatron", "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "in the file" in out and "99 s" in out
    header = (tmp_path / "out" / "megatron_args.sh").read_text()
    assert f"step {fresh:.4g} s" in header and "step 99 s" not in header
