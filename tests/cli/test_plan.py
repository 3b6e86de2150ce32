"""`planner plan` and `planner sweep`: the JSON contract, agreement with `evaluate` and the
exporters, restrictions, explanations, infeasible requests and user errors."""

from __future__ import annotations

import json

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.errors import ExportError
from planner.export import export_plan
from planner.layout import even_stage_layers
from planner.plan import PlanEntry, PlanFile, parse_plan_file
from planner.runtimes import exporting_runtimes, resolve
from planner.schedule import SCHEDULES
from planner.search.runtimes import restrict
from planner.search.space import SearchSpace
from planner.uncertainty import default_memory_headroom

BASE = ["--model", "llama3-8b", "--gpus", "16", "--gpu", "h100", "--global-batch", "64", "--seq", "4096"]
KEYS = {
    "tp",
    "pp",
    "dp",
    "cp",
    "vpp",
    "mbs",
    "num_microbatches",
    "global_batch",
    "seq",
    "schedule",
    "recompute",
    "sequence_parallel",
    "zero_stage",
    "stage_layers",
    "predicted",
}


def _plans(cli, *argv, base=BASE):
    code, out, err = cli("plan", *base, *argv, "--json")
    assert code == 0, err
    return json.loads(out)["plans"]


def test_json_contract(cli):
    plans = _plans(cli, "--top", "3")
    assert 1 <= len(plans) <= 3
    times = [p["predicted"]["step_time_s"] for p in plans]
    assert times == sorted(times)
    for plan in plans:
        assert set(plan) >= KEYS
        assert plan["tp"] * plan["pp"] * plan["dp"] * plan["cp"] == 16
        assert plan["dp"] * plan["mbs"] * plan["num_microbatches"] == 64
        assert max(plan["predicted"]["memory_gb_per_stage"]) <= 79.2
        assert plan["schedule"] in SCHEDULES


def test_best_plan_is_what_evaluate_predicts(cli):
    plan = _plans(cli, "--top", "1", "--pp", "2", "--tp", "2")[0]
    entry = PlanEntry.model_validate(plan)
    counts = [end - start for start, end in entry.ranges_in_model_order()]
    recompute = plan["recompute"] if isinstance(plan["recompute"], str) else ",".join(plan["recompute"])
    code, out, err = cli(
        "evaluate",
        *BASE,
        "--tp",
        "2",
        "--pp",
        "2",
        "--vpp",
        str(plan["vpp"]),
        "--mbs",
        str(plan["mbs"]),
        "--schedule",
        plan["schedule"],
        "--recompute",
        recompute,
        "--sp" if plan["sequence_parallel"] else "--no-sp",
        "--stage-layers",
        ",".join(map(str, counts)),
        "--json",
    )
    assert code == 0, err
    evaluated = json.loads(out)["plans"][0]["predicted"]
    assert evaluated["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-9)
    assert evaluated["memory_gb_per_stage"] == plan["predicted"]["memory_gb_per_stage"]


def test_plan_beats_every_even_layout_evaluate_finds(cli):
    """Brute force through the CLI on a small space: evaluate each layout, keep the best that fits."""
    best = _plans(
        cli,
        "--top",
        "1",
        "--pp",
        "1,2,4",
        "--tp",
        "1,2",
        "--mbs",
        "1,2",
        "--schedules",
        "1f1b,zb_h1",
        "--vpp",
        "1",
        "--recompute",
        "none,full",
        "--sp",
    )[0]
    limit = resolve_gpu("h100").memory_gib * (1 - default_memory_headroom().share)  # what plans keep under
    reference = float("inf")
    for tp in (1, 2):
        for pp in (1, 2, 4):
            for mbs in (1, 2):
                for schedule in ("1f1b",) if pp == 1 else ("1f1b", "zb_h1"):
                    for recompute in ("none", "full"):
                        code, out, err = cli(
                            "evaluate",
                            *BASE,
                            "--tp",
                            str(tp),
                            "--pp",
                            str(pp),
                            "--mbs",
                            str(mbs),
                            "--schedule",
                            schedule,
                            "--recompute",
                            recompute,
                            "--json",
                        )
                        assert code == 0, err
                        p = json.loads(out)["plans"][0]["predicted"]
                        if max(p["memory_gb_per_stage"]) <= limit:
                            reference = min(reference, p["step_time_s"])
    assert best["predicted"]["step_time_s"] <= reference * (1 + 1e-9)


def test_restrictions_are_kept(cli):
    plans = _plans(
        cli,
        "--tp",
        "2",
        "--pp",
        "2,4",
        "--schedules",
        "1f1b,interleaved_1f1b",
        "--mbs",
        "1",
        "--recompute",
        "full",
        "--uniform-recompute",
        "--no-sp",
    )
    for plan in plans:
        assert plan["tp"] == 2 and plan["pp"] in (2, 4) and plan["mbs"] == 1
        assert plan["schedule"] in ("1f1b", "interleaved_1f1b")
        assert plan["recompute"] == "full" and plan["sequence_parallel"] is False


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed", "torchtitan"])
def test_runtime_plans_export(cli, tmp_path, runtime):
    path = tmp_path / "plan.json"
    code, out, err = cli("plan", *BASE, "--runtime", runtime, "--top", "3", "-o", str(path), "--json")
    assert code == 0, err
    document = parse_plan_file(path.read_text())
    for index, entry in enumerate(document.plans):
        export_plan(document, runtime, index)  # raises if the runtime cannot run it
        if runtime == "deepspeed":
            assert entry.tp == 1 and entry.schedule == "1f1b"
        if runtime == "megatron":
            assert entry.schedule in ("1f1b", "interleaved_1f1b")


def test_torchtitan_plans_are_costed_with_its_selective_checkpointing(cli):
    """torchtitan's `selective` (SelectiveAC, what its exporter writes) recomputes every other
    matmul: its selective plan is slower and smaller than the same layout under Megatron's
    core-attention recompute, which flash attention makes nearly free, and `evaluate
    --runtime torchtitan` predicts it as the plan did."""
    restrict = ("--recompute", "selective", "--pp", "1", "--zero", "3", "--mbs", "1", "--top", "1")
    [titan] = _plans(cli, "--runtime", "torchtitan", *restrict)
    [megatron] = _plans(
        cli,
        "--runtime",
        "megatron",
        *restrict,
        "--tp",
        str(titan["tp"]),
        "--sp" if titan["sequence_parallel"] else "--no-sp",
    )
    assert titan["tp"] == megatron["tp"]
    assert titan["predicted"]["step_time_s"] > megatron["predicted"]["step_time_s"]
    assert max(titan["predicted"]["memory_gb_per_stage"]) < max(megatron["predicted"]["memory_gb_per_stage"])
    document = PlanFile(plans=[PlanEntry.model_validate(titan)], model=resolve_model("llama3-8b"))
    assert "SelectiveAC" in "".join(export_plan(document, "torchtitan").values())
    layout = (
        "--tp",
        str(titan["tp"]),
        "--pp",
        "1",
        "--mbs",
        "1",
        "--recompute",
        "selective",
        "--zero",
        "3",
        "--sp" if titan["sequence_parallel"] else "--no-sp",
        "--json",
    )
    for runtime, expected in (("torchtitan", titan), ("megatron", megatron)):
        code, out, err = cli("evaluate", *BASE, *layout, "--runtime", runtime)
        assert code == 0, err
        [evaluated] = json.loads(out)["plans"]
        assert evaluated["predicted"]["step_time_s"] == pytest.approx(expected["predicted"]["step_time_s"])
    code, _, err = cli("evaluate", *BASE, "--runtime", "jax")
    assert code == 2 and "unknown runtime 'jax'" in err


@pytest.mark.parametrize("runtime", exporting_runtimes())
@pytest.mark.parametrize(
    "schedule", sorted(n for n, i in SCHEDULES.items() if i.searched_by_default)
)  # chimera, seq1f1b: test_chimera_seq1f1b_plan.py
def test_exporters_refuse_schedules_by_the_runtime_rule(runtime, schedule):
    """An exporter refuses a schedule by its runtime's rule (planner/runtimes/), the rule that
    also narrows `plan --runtime`'s space, and in its words."""
    spec = resolve_model("tiny-llama")
    info = SCHEDULES[schedule]
    vpp = info.min_vpp if info.min_vpp > 1 else 1
    pp = 2
    entry = PlanEntry(
        tp=1,
        pp=pp,
        dp=1,
        cp=1,
        vpp=vpp,
        mbs=1,
        num_microbatches=8,
        global_batch=8,
        seq=128,
        schedule=schedule,
        recompute="none",
        sequence_parallel=False,
        zero_stage=1,
        stage_layers=_ranges(spec.num_layers, pp, vpp, schedule),
        predicted=None,
    )
    document = PlanFile(plans=[entry], model=spec)
    version = resolve(runtime)
    allowed = version.allowed("schedules")
    try:
        export_plan(document, version.exporter)
        refused = None
    except ExportError as exc:
        refused = str(exc)
    assert (refused is None) == (allowed is None or schedule in allowed)
    if refused is not None:
        assert version.rule_refusal("schedules", schedule) in refused
    assert restrict(SearchSpace(), runtime).schedules == (allowed if allowed is not None else None)


def _ranges(layers, pp, vpp, schedule):
    cuts = even_stage_layers(layers, pp, vpp, schedule)
    return [list(c[0]) for c in cuts] if vpp == 1 else [[list(r) for r in c] for c in cuts]


def test_explain_names_why_alternatives_lost(cli):
    code, out, err = cli("plan", *BASE, "--top", "1", "--explain")
    assert code == 0, err
    assert "why not something else" in out
    assert "slower" in out
    assert "searched" in out and "candidates" in out


def test_infeasible_request_says_what_would_fit(cli):
    code, out, err = cli("plan", "--model", "llama3-70b", "--gpus", "8", "--global-batch", "64", "--seq", "4096")
    assert code == 2 and out == ""
    assert err.startswith("error: no layout of llama3-70b")
    assert "smallest need" in err and "what would fit" in err and "GPUs" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--cut-solver", "magic"],
        ["--schedules", "1f1b,warp"],
        ["--tp", "3"],
        ["--tp", "two"],
        ["--recompute", "some"],
        ["--runtime", "jax"],
        ["--runtime", "deepspeed", "--tp", "2"],
    ],
)
def test_bad_input_is_one_error_and_exit_2(cli, argv):
    """One `error:` message; a request with no layout at all adds indented lines of what has one."""
    code, out, err = cli("plan", *BASE, *argv)
    assert code == 2 and out == ""
    first, *more = err.strip().splitlines()
    assert first.startswith("error: ") and err.count("error:") == 1
    assert all(line.startswith("  ") for line in more) and (not more or argv == ["--tp", "3"])


def test_ilp_cut_solver_agrees(cli):
    exact = _plans(cli, "--top", "1", "--pp", "4", "--tp", "1", "--mbs", "1", "--schedules", "1f1b")[0]
    ilp = _plans(
        cli, "--top", "1", "--pp", "4", "--tp", "1", "--mbs", "1", "--schedules", "1f1b", "--cut-solver", "ilp"
    )[0]
    assert ilp["predicted"]["step_time_s"] == pytest.approx(exact["predicted"]["step_time_s"], rel=1e-9)


def test_sweep_json(cli):
    code, out, err = cli(
        "sweep",
        "--model",
        "llama3-8b",
        "--global-batch",
        "64",
        "--seq",
        "4096",
        "--vary",
        "gpus",
        "--values",
        "8,16",
        "--json",
    )
    assert code == 0, err
    points = json.loads(out)["points"]
    assert [p["value"] for p in points] == [8, 16]
    for p in points:
        plan = p["plan"]
        assert plan["tp"] * plan["pp"] * plan["dp"] * plan["cp"] == p["value"]
    # doubling the GPUs at a fixed batch does not slow the step
    assert points[1]["plan"]["predicted"]["step_time_s"] <= points[0]["plan"]["predicted"]["step_time_s"]
    # --svg and --report: tests/report


def test_sweep_needs_the_fixed_inputs(cli):
    code, out, err = cli("sweep", "--model", "llama3-8b", "--seq", "4096", "--vary", "gpus", "--values", "8")
    assert code == 2 and "--global-batch is required" in err
