"""--moe-dispatcher and --moe-ep-overlap end to end: every command takes them, prices with them,
records what applied to each plan, and refuses bad values in one line; a dense model is
unchanged by them."""

from __future__ import annotations

import json
import re

import pytest
from test_moe_explain import rows

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.kernel_counts import host_times, megatron_moe_block, op_counts

# Qwen3-30B-A3B on 8 nodes of 8 H100s; EP 32 spans 4 nodes
JOB = ("--model", "qwen3-30b-a3b", "--gpus", "64", "--gpu", "h100", "--global-batch", "256", "--seq", "4096")
LAYOUT = ("--tp", "1", "--pp", "2", "--vpp", "2", "--mbs", "1", "--ep", "32", "--etp", "1")
SPACE = (
    "--tp",
    "1",
    "--pp",
    "2",
    "--vpp",
    "2",
    "--schedules",
    "interleaved_1f1b",
    "--mbs",
    "1",
    "--ep",
    "8,32",
    "--etp",
    "1",
    "--recompute",
    "selective",
)


def _json(cli, *argv) -> dict:
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def _evaluate(cli, *options) -> dict:
    return _json(cli, "evaluate", *JOB, *LAYOUT, *options)["plans"][0]


def test_evaluate_prices_and_records_the_dispatcher_and_the_overlap(cli):
    plain, deepep = _evaluate(cli), _evaluate(cli, "--moe-dispatcher", "deepep")
    both = _evaluate(cli, "--moe-dispatcher", "deepep", "--moe-ep-overlap")
    assert (plain["moe_dispatcher"], plain["moe_ep_overlap"]) == ("alltoall", False)
    assert (deepep["moe_dispatcher"], deepep["moe_ep_overlap"]) == ("deepep", False)
    assert (both["moe_dispatcher"], both["moe_ep_overlap"]) == ("deepep", True)
    a2a = [p["predicted"]["time_breakdown_s"]["moe_all_to_all"] for p in (plain, deepep, both)]
    # across 4 nodes NCCL sends every routed copy (8 per token, 6 of them off the node); DeepEP
    # one per destination node at its measured RDMA rate: less; the overlap hides most of the rest
    assert a2a[0] > a2a[1] > a2a[2] > 0
    steps = [p["predicted"]["step_time_s"] for p in (plain, deepep, both)]
    assert steps == sorted(steps, reverse=True)
    # the layout does not change: only what it was priced with
    assert all(p["stage_layers"] == plain["stage_layers"] and p["ep"] == 32 for p in (deepep, both))


def test_evaluate_records_no_overlap_where_megatron_does_not_run_it(cli):
    """Plain 1F1B with a pipeline: Megatron runs no combined 1F1B, so nothing is paired."""
    job = ("evaluate", *JOB, "--tp", "1", "--pp", "2", "--mbs", "1", "--ep", "32", "--etp", "1")
    off, on = _json(cli, *job)["plans"][0], _json(cli, *job, "--moe-ep-overlap")["plans"][0]
    assert on["moe_ep_overlap"] is False
    assert on["predicted"]["step_time_s"] == off["predicted"]["step_time_s"]


def test_plan_searches_with_the_options_and_its_plans_evaluate_the_same(cli, tmp_path):
    path = tmp_path / "plan.json"
    document = _json(
        cli, "plan", *JOB, *SPACE, "--moe-dispatcher", "deepep", "--moe-ep-overlap", "--top", "2", "-o", str(path)
    )
    plans = document["plans"]
    assert plans and all(p["moe_dispatcher"] == "deepep" and p["moe_ep_overlap"] for p in plans)
    assert document["request"]["options"]["moe_dispatcher"] == "deepep"
    assert document["request"]["options"]["moe_ep_overlap"] is True
    best = plans[0]
    counts = [end - start for rank in best["stage_layers"] for start, end in rank]
    order = [counts[0], counts[2], counts[1], counts[3]]  # model order: rank 0 chunk 0, rank 1 chunk 0, ...
    again = _json(
        cli,
        "evaluate",
        *JOB,
        "--tp",
        "1",
        "--pp",
        "2",
        "--vpp",
        "2",
        "--mbs",
        "1",
        "--ep",
        str(best["ep"]),
        "--etp",
        "1",
        "--recompute",
        "selective",
        "--stage-layers",
        ",".join(map(str, order)),
        "--moe-dispatcher",
        "deepep",
        "--moe-ep-overlap",
    )["plans"][0]
    assert again["predicted"]["step_time_s"] == pytest.approx(best["predicted"]["step_time_s"], rel=1e-9)
    without = _json(cli, "plan", *JOB, *SPACE, "--top", "1")["plans"][0]
    assert without["moe_dispatcher"] == "alltoall" and not without["moe_ep_overlap"]
    assert best["predicted"]["step_time_s"] < without["predicted"]["step_time_s"]
    code, out, err = cli("export", str(path), "--to", "megatron", "--out", str(tmp_path / "megatron"))
    assert code == 0, err
    written = (tmp_path / "megatron" / "megatron_args.sh").read_text()
    assert "--moe-flex-dispatcher-backend deepep" in written and "--overlap-moe-expert-parallel-comm" in written


def test_sweep_prices_with_the_options(cli):
    document = _json(
        cli,
        "sweep",
        *JOB[:2],
        "--gpu",
        "h100",
        "--global-batch",
        "256",
        "--seq",
        "4096",
        "--vary",
        "gpus",
        "--values",
        "32,64",
        "--tp",
        "1",
        "--pp",
        "2",
        "--schedules",
        "interleaved_1f1b",
        "--mbs",
        "1",
        "--moe-dispatcher",
        "deepep",
        "--moe-ep-overlap",
    )
    plans = [point["plan"] for point in document["points"]]
    assert all(p is not None for p in plans)
    assert all(p["moe_dispatcher"] == ("deepep" if p["ep"] > 1 else "alltoall") for p in plans)
    assert all(p["moe_ep_overlap"] == (p["ep"] > 1 and p["vpp"] > 1) for p in plans)
    assert any(p["ep"] > 1 for p in plans)


def test_cost_shows_the_all_to_all_of_each_mechanism(cli):
    job = ("cost", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--seq", "4096", "--ep", "32", "--etp", "1")
    plain, deepep = _json(cli, *job), _json(cli, *job, "--moe-dispatcher", "deepep")
    paired = _json(cli, *job, "--moe-dispatcher", "deepep", "--moe-ep-overlap")
    a2a = [d["layers"]["transformer"]["moe_all_to_all_ms"] for d in (plain, deepep, paired)]
    assert a2a[0] > a2a[1] > a2a[2] > 0
    assert (paired["moe_dispatcher"], paired["moe_ep_overlap"], paired["ep"]) == ("deepep", True, 32)
    # the compute is the same whatever moves the tokens
    assert plain["layers"]["transformer"]["forward_ms"] == deepep["layers"]["transformer"]["forward_ms"]
    one_rank = _json(
        cli, "cost", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--seq", "4096", "--moe-dispatcher", "deepep"
    )
    assert one_rank["layers"]["transformer"]["moe_all_to_all_ms"] == 0 and one_rank["moe_dispatcher"] == "alltoall"


def test_cost_as_megatron_runs_it_counts_its_moe_layer_ops(cli):
    """`--runtime megatron` on DeepEP prices the MoE block at Megatron's own MoE-layer op count
    (kernel_counts.megatron_moe_block): at Qwen3-235B's TP 4 / EP 8 shard the forward is the
    host's, the count times the H100 preset's per-op times."""
    job = (
        "cost",
        "--model",
        "qwen3-235b-a22b",
        "--gpu",
        "h100",
        "--tp",
        "4",
        "--sp",
        "--ep",
        "8",
        "--etp",
        "1",
        "--seq",
        "4096",
        "--moe-dispatcher",
        "deepep",
    )
    default, megatron = _json(cli, *job), _json(cli, *job, "--runtime", "megatron")
    assert (default["runtime"], megatron["runtime"]) == (None, "megatron")
    spec, eff = resolve_model("qwen3-235b-a22b"), resolve_gpu("h100").efficiency
    counts = megatron_moe_block(op_counts(spec, "transformer"), spec.num_experts // 8)
    host_forward_ms = host_times(counts, eff)[0] * 1e3
    assert megatron["layers"]["transformer"]["forward_ms"] == pytest.approx(host_forward_ms)
    assert default["layers"]["transformer"]["forward_ms"] < host_forward_ms
    code, out, err = cli(*job, "--runtime", "torch")
    assert code == 2 and "--moe-dispatcher deepep: torch sends tokens" in err


@pytest.mark.parametrize(
    "command",
    [
        ("plan", *JOB),
        ("evaluate", *JOB),
        ("sweep", *JOB[:2], "--global-batch", "256", "--seq", "4096", "--vary", "gpus", "--values", "64"),
        ("cost", "--model", "qwen3-30b-a3b", "--seq", "4096"),
    ],
)
def test_a_bad_dispatcher_is_one_error_line(cli, command):
    code, out, err = cli(*command, "--moe-dispatcher", "nccl")
    assert code == 2
    assert err.strip().startswith("error:") and len(err.strip().splitlines()) == 1
    assert "--moe-dispatcher 'nccl'" in err and "alltoall, deepep" in err


@pytest.mark.parametrize(
    "runtime, options, words",
    [
        ("torchtitan", ("--moe-ep-overlap",), "--moe-ep-overlap: torchtitan has no equivalent"),
        ("torch", ("--moe-dispatcher", "deepep"), "--moe-dispatcher deepep: torch sends tokens"),
        ("deepspeed", ("--moe-ep-overlap",), "--moe-ep-overlap: deepspeed has no equivalent"),
    ],
)
def test_a_runtime_without_the_mechanism_is_refused_up_front(cli, runtime, options, words):
    code, out, err = cli("plan", *JOB, "--runtime", runtime, *options)
    assert code == 2 and err.strip().startswith("error:") and len(err.strip().splitlines()) == 1
    assert words in err


def test_megatron_runtime_plans_with_the_overlap(cli):
    plans = _json(cli, "plan", *JOB, *SPACE, "--runtime", "megatron", "--moe-ep-overlap", "--top", "1")["plans"]
    assert plans[0]["moe_ep_overlap"] and "megatron" in plans[0]["runtimes"]
    assert "torchtitan" not in plans[0]["runtimes"]  # its exporter refuses what it does not run


def test_a_dense_model_is_unchanged_by_the_moe_options(cli):
    job = ("--model", "llama3-8b", "--gpus", "16", "--gpu", "h100", "--global-batch", "64", "--seq", "2048")
    layout = ("--tp", "2", "--pp", "2", "--vpp", "2", "--mbs", "1")
    plain = _json(cli, "evaluate", *job, *layout)["plans"][0]
    moe = _json(cli, "evaluate", *job, *layout, "--moe-dispatcher", "deepep", "--moe-ep-overlap")["plans"][0]
    assert moe == plain and (moe["moe_dispatcher"], moe["moe_ep_overlap"]) == ("alltoall", False)
    space = ("--pp", "1,2", "--mbs", "1", "--top", "3")
    searched = [
        _json(cli, "plan", *job, *space, *extra)["plans"]
        for extra in ((), ("--moe-dispatcher", "deepep", "--moe-ep-overlap"))
    ]
    assert searched[0] == searched[1]
    # nothing to refuse for a runtime without DeepEP: the dense plans do not use it
    code, out, err = cli("plan", *job, *space, "--runtime", "torch", "--moe-dispatcher", "deepep", "--json")
    assert code == 0, err
    assert all(p["moe_dispatcher"] == "alltoall" and "torch" in p["runtimes"] for p in json.loads(out)["plans"])


def test_explain_says_what_the_dispatcher_and_the_overlap_change(cli):
    code, out, err = cli("plan", *JOB, *SPACE, "--ep", "32", "--top", "1", "--explain")
    assert code == 0, err
    table = rows(out.split("why not something else")[1])
    assert re.match(r"[\d.]+% faster: MoE all-to-all -[\d.]+ s", table["dispatcher deepep"])
    assert re.match(r"[\d.]+% faster: MoE all-to-all -[\d.]+ s", table["EP overlap on"])
    code, out, err = cli(
        "plan",
        *JOB,
        "--tp",
        "1",
        "--pp",
        "2",
        "--schedules",
        "1f1b",
        "--mbs",
        "1",
        "--ep",
        "32",
        "--etp",
        "1",
        "--top",
        "1",
        "--explain",
    )
    assert code == 0, err
    table = rows(out.split("why not something else")[1])
    assert "Megatron runs no combined 1F1B on this layout" in table["EP overlap on"]


def test_the_tables_say_what_the_plans_are_priced_with(cli):
    code, out, err = cli("evaluate", *JOB, *LAYOUT, "--moe-dispatcher", "deepep", "--moe-ep-overlap")
    assert code == 0, err
    assert "(analytic costs, DeepEP dispatch, combined-1F1B a2a overlap)" in out.splitlines()[0]
    code, out, err = cli("evaluate", *JOB, *LAYOUT)
    assert "(analytic costs)" in out.splitlines()[0]
