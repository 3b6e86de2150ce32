"""The Python API gives what the command line prints, through the same request path."""

from __future__ import annotations

import json

import pytest

import planner
from planner.errors import PlannerError
from planner.plan import parse_plan_file
from planner.search.space import SearchSpace

REQUEST = planner.Request(model="llama3-8b", num_gpus=16, global_batch=64, seq=4096, runtime="megatron@0.19")
FLAGS = ["-m", "llama3-8b", "-n", "16", "-b", "64", "-s", "4096", "--runtime", "megatron@0.19"]


def test_evaluate_matches_the_cli(cli):
    document = planner.evaluate(REQUEST, tp=2, pp=2, mbs=2, recompute="selective")
    code, out, err = cli(
        "evaluate", *FLAGS, "--tp", "2", "--pp", "2", "--mbs", "2", "--recompute", "selective", "--json"
    )
    assert code == 0, err
    printed = json.loads(out)["plans"][0]
    entry = document.plans[0]
    assert (entry.tp, entry.pp, entry.dp, entry.mbs, entry.num_microbatches) == (2, 2, 4, 2, 8)
    assert entry.predicted.step_time_s == printed["predicted"]["step_time_s"]
    assert entry.predicted.memory_gb_per_stage == printed["predicted"]["memory_gb_per_stage"]
    assert document.request == REQUEST


def test_plan_matches_the_cli(cli):
    space = SearchSpace(tp=(1, 2), pp=(1, 2), mbs=(1, 2))
    document = planner.plan(REQUEST, space, top=3)
    code, out, err = cli("plan", *FLAGS, "--tp", "1,2", "--pp", "1,2", "--mbs", "1,2", "--top", "3", "--json")
    assert code == 0, err
    printed = json.loads(out)["plans"]
    assert [p.predicted.step_time_s for p in document.plans] == [p["predicted"]["step_time_s"] for p in printed]
    assert all("megatron" in p.runtimes for p in document.plans)


def test_the_plan_file_keeps_the_request(cli, tmp_path):
    request = REQUEST.model_copy(update={"options": {"dropout": True, "attention": "flash2"}})
    path = tmp_path / "plan.json"
    code, _, err = cli(
        "evaluate", *FLAGS, "--tp", "2", "--set", "dropout=true", "--attention", "flash2", "-o", str(path)
    )
    assert code == 0, err
    assert parse_plan_file(path.read_text()).request == request


def test_settings_change_the_prediction_as_the_runtime_version_would():
    """megatron@2022 is megatron@0.19 less its MoE op count and with dropout, no distributed
    optimizer overlap and blocking sends: setting those over 0.19 prices as 2022 does."""
    older = planner.evaluate(REQUEST.model_copy(update={"runtime": "megatron@2022"}), tp=2, pp=2)
    newer = planner.evaluate(
        REQUEST.model_copy(
            update={
                "options": {
                    "dropout": True,
                    "overlap_grad_reduce": False,
                    "overlap_param_gather": False,
                    "p2p_mode": "blocking",
                    "megatron_moe_ops": False,
                    "attention": "unfused",
                }
            }
        ),
        tp=2,
        pp=2,
    )
    assert older.plans[0].predicted == newer.plans[0].predicted


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(PlannerError, match="p2p_mode"):
        planner.evaluate(REQUEST.model_copy(update={"options": {"p2p_mode": "carrier-pigeon"}}))
    with pytest.raises(PlannerError, match="unknown runtime"):
        planner.evaluate(REQUEST.model_copy(update={"runtime": "colossalai"}))
    with pytest.raises(PlannerError, match="unknown version"):
        planner.evaluate(REQUEST.model_copy(update={"runtime": "megatron@1999"}))


def test_a_plan_file_without_a_request_answers_its_plans_batch_and_sequence():
    """Files written before the request was recorded keep the batch and sequence in each plan:
    the request rebuilt from them (what hints and re-checks use) carries those, not defaults."""
    from pathlib import Path

    from planner.api import document_request
    from planner.plan import parse_plan_file

    path = Path(__file__).parents[1] / "examples" / "plans" / "llama3-8b-32gpu-1f1b.json"
    document = parse_plan_file(path.read_text())
    assert document.request is None and document.plans
    request, _ = document_request(document)
    assert (request.global_batch, request.seq) == (document.plans[0].global_batch, document.plans[0].seq)
    assert request.num_gpus == document.plans[0].num_gpus
