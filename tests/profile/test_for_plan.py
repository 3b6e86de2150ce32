"""Profile one node, plan the cluster: `profile --for-plan` measures exactly the shapes the
search asks for, and `plan --profile` answers every request, measured where the profile
spans a shape and calibrated elsewhere, saying which per layer kind."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from profile_factories import make_profile, ok_row

from planner.catalog import resolve_gpu, resolve_model
from planner.cli.options import space_of
from planner.cost.calibrate import fit, fit_file
from planner.cost.compute import AnalyticCompute
from planner.cost.model import CostModel
from planner.cost.shapes import Shard, layer_work
from planner.job import build_cost_model
from planner.profile import store
from planner.profile.lookup import MeasuredFirst, ProfiledCompute
from planner.search.profile_shapes import cheapest, plan_shapes
from planner.search.search import search
from planner.search.space import SearchSpace
from planner.spec import Cluster

FAST = ["--dtype", "fp32", "--device", "cpu", "--warmup", "0", "--repeats", "1"]
TINY = ["--model", "tiny-llama", "--gpus", "4", "--global-batch", "16", "--seq", "256"]
H100 = resolve_gpu("h100")
TRUE = H100.efficiency.model_copy(
    update=dict(  # the analytic form a fit recovers, not the preset's GEMM table
        gemm=0.62,
        gemm_half_dim=150.0,
        attention_fwd=0.48,
        attention_bwd=0.36,
        hbm=0.7,
        kernel_overhead_us=7.0,
        gemm_table=None,
    )
)


def _asked(spec, cluster, global_batch, seq, space):
    """Every (kind, shard, recompute) the search asks the cost model for."""
    model = CostModel(spec, cluster)
    asked, real = set(), model.layer_costs

    def record(kind, shard, recompute="none", paired=False):  # paired: DualPipeV's hidden all-to-all
        asked.add((kind, shard, recompute))
        return real(kind, shard, recompute, paired)

    model.layer_costs = record
    search(model, global_batch, seq, space, top=3)
    return asked


def test_shapes_are_exactly_those_the_search_asks_for():
    spec, cluster = resolve_model("tiny-llama"), Cluster.of(H100, 4)
    asked = _asked(spec, cluster, 16, 256, SearchSpace())
    rows = {(kind, s.tp, s.mbs, s.seq, "full" if rc == "full" else "none") for kind, s, rc in asked}
    plan = plan_shapes(spec, cluster, 16, 256, SearchSpace())
    assert {s.key for s in plan.shapes} == rows and plan.unmeasurable == ()
    assert {(k[1], k[2]) for k in rows} == {(tp, mbs) for tp in (1, 2, 4) for mbs in (1, 2, 4, 8)}


def test_context_parallel_shards_map_to_rows_of_the_same_tokens_and_attention_length():
    spec, cluster = resolve_model("tiny-llama"), Cluster.of(H100, 4)
    space = SearchSpace(tp=(1,), cp=(2,), mbs=(1, 2), recompute=("none",))
    plan = plan_shapes(spec, cluster, 8, 256, space)
    # embedding and head see seq / cp tokens per sequence; a block under CP 2 with mbs 2 attends
    # 256 local queries to 256 keys, the work of one whole sequence; with mbs 1 no row has its shape
    assert {s.key for s in plan.shapes} == {
        ("embedding", 1, 1, 128, "none"),
        ("head", 1, 1, 128, "none"),
        ("embedding", 1, 2, 128, "none"),
        ("head", 1, 2, 128, "none"),
        ("transformer", 1, 1, 256, "none"),
    }
    assert plan.unmeasurable == ("transformer tp=1 mbs=1 seq=256 cp=2 (128 tokens attending to 256)",)
    profile = make_profile([ok_row(kind=k.kind, tp=k.tp, mbs=k.mbs, seq=k.seq) for k in (s.key for s in plan.shapes)])
    source = MeasuredFirst(ProfiledCompute(profile, "p"), None, "calibrated")
    for kind, shard, _ in _asked(spec, cluster, 8, 256, space):
        unmeasurable = kind == "transformer" and shard.mbs < shard.cp
        assert source.source_of(kind, shard) == ("calibrated" if unmeasurable else "measured"), (kind, shard)


def test_largest_first_and_the_cheapest_under_a_cap():
    spec, cluster = resolve_model("llama3-8b"), Cluster.of(H100, 64)
    shapes = plan_shapes(spec, cluster, 512, 8192, SearchSpace()).shapes
    estimates = [s.estimate_s for s in shapes]
    assert estimates == sorted(estimates, reverse=True)
    assert {s.key.tp for s in shapes} == {1, 2, 4, 8}  # TP within the 8-GPU node
    three = cheapest(shapes, 3)
    assert sorted(s.estimate_s for s in three) == sorted(estimates)[:3]
    assert list(three) == [s for s in shapes if s in three]
    assert three[-1].key == ("embedding", 8, 1, 8192, "none")  # the smallest vocabulary shard


def test_fit_moves_only_what_its_samples_identify():
    spec, compute = resolve_model("llama3-8b"), AnalyticCompute(H100, "bf16", TRUE)
    rows = []
    for tp in (1, 8):
        for mbs in (1, 4):
            t = compute.layer_times(layer_work(spec, "embedding", Shard(mbs=mbs, seq=4096, tp=tp)))
            rows.append(
                ok_row(
                    kind="embedding",
                    tp=tp,
                    mbs=mbs,
                    seq=4096,
                    forward_ms=t.forward_s * 1e3,
                    backward_input_ms=0.0,
                    backward_weight_ms=t.backward_s * 1e3,
                )
            )
    efficiency = fit([make_profile(rows, model="llama3-8b", device="NVIDIA H100", device_type="cuda")], H100).efficiency
    assert efficiency.hbm == pytest.approx(TRUE.hbm, rel=0.03)
    assert efficiency.kernel_overhead_us == pytest.approx(TRUE.kernel_overhead_us, rel=0.03)
    prior = H100.efficiency  # no GEMM or attention in an embedding: the prior's shape, rescaled as one
    assert efficiency.gemm_half_dim == pytest.approx(prior.gemm_half_dim)
    assert efficiency.attention_fwd / efficiency.gemm == pytest.approx(prior.attention_fwd / prior.gemm)
    assert efficiency.attention_bwd / efficiency.gemm == pytest.approx(prior.attention_bwd / prior.gemm)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_unmeasured_shapes_get_the_model_fitted_to_the_profile(tmp_path, dtype):
    spec = resolve_model("llama3-8b")
    compute = AnalyticCompute(H100, dtype, TRUE)  # the profile's times: TRUE efficiencies at its dtype
    rows = []
    for kind in ("embedding", "transformer", "head"):
        for mbs in (1, 2):
            for seq in (1024, 4096):
                t = compute.layer_times(layer_work(spec, kind, Shard(mbs=mbs, seq=seq, tp=1)))
                i, w = (0.0, t.backward_s) if kind == "embedding" else (t.backward_input_s, t.backward_weight_s)
                rows.append(
                    ok_row(
                        kind=kind,
                        mbs=mbs,
                        seq=seq,
                        forward_ms=t.forward_s * 1e3,
                        backward_input_ms=i * 1e3,
                        backward_weight_ms=w * 1e3,
                    )
                )
    path = tmp_path / "p.json"
    store.save(
        path, make_profile(rows, model="llama3-8b", device="NVIDIA H100 80GB HBM3", device_type="cuda", dtype=dtype)
    )
    model = build_cost_model(spec, Cluster.of(H100, 8), path)
    measured, elsewhere = Shard(mbs=2, seq=1024), Shard(mbs=4, seq=2048, tp=4)
    assert model.source.source_of("transformer", measured) == "measured"
    assert model.source.source_of("transformer", elsewhere) == "calibrated"
    for kind in ("transformer", "head"):
        expected = compute.layer_times(layer_work(spec, kind, elsewhere))
        got = model.source.layer_times(kind, elsewhere)
        assert got.forward_s == pytest.approx(expected.forward_s, rel=0.03)
        assert got.backward_s == pytest.approx(expected.backward_s, rel=0.03)
    # the cost model's own recompute estimate runs on the fitted efficiencies too
    costs = model.layer_costs("transformer", elsewhere, "selective")
    work = layer_work(spec, "transformer", elsewhere)
    assert costs.recompute_s == pytest.approx(
        compute.attention_time(work.attention_flops, work.attention_seq, False), rel=0.03
    )


def test_the_fit_is_cached_per_file_version(tmp_path):
    path = tmp_path / "p.json"
    profile = make_profile([ok_row(mbs=m, forward_ms=m) for m in (1, 2)])
    store.save(path, profile)
    first = fit_file(path, profile, H100)
    assert fit_file(path, profile, H100) is first
    changed = profile.with_row(ok_row(mbs=4, forward_ms=4))
    store.save(path, changed)
    assert fit_file(path, changed, H100) is not first


def test_for_plan_then_plan_on_a_fresh_profile(cli, tmp_path, one_thread):
    path = tmp_path / "prof.json"
    code, out, err = cli("profile", "--for-plan", *TINY, *FAST, "-o", str(path))
    assert code == 0, err
    spec, cluster = resolve_model("tiny-llama"), Cluster.of(H100, 4)
    space = space_of()
    expected = [s.key for s in plan_shapes(spec, cluster, 16, 256, space, dtype="fp32").shapes]
    assert [r.key for r in store.load(path).rows] == expected  # largest first, nothing else
    assert "48 shapes (48 ok)" in out
    code, out, err = cli("plan", *TINY, "--profile", str(path), "--json", "--top", "8")
    assert code == 0, err
    document = json.loads(out)
    assert document["cost_source"] == "profile:prof.json"
    assert all(
        p["cost_sources"] == dict.fromkeys(("embedding", "transformer", "head"), "measured") for p in document["plans"]
    )
    code, out, err = cli("plan", *TINY, "--profile", str(path))
    assert code == 0 and "costs of plans #1, #2, #3, #4, #5: all measured" in out


def _tiny_job(profile) -> list[str]:
    """tiny-llama on 4 GPUs, global batch 16 x seq 128, costed from `profile` (the CPU profile spans
    tp 1,2 x mbs 1,2 x seq 64,128)."""
    return ["--model", "tiny-llama", "--gpus", "4", "--global-batch", "16", "--seq", "128", "--profile", str(profile)]


def test_plan_on_a_partial_profile_calibrates_the_rest(cli, cpu_profile):
    # cpu_profile measured tp 1,2 x mbs 1,2 x seq 64,128: the search also tries tp 4 and mbs 4, 8
    job = _tiny_job(cpu_profile)
    code, out, err = cli("plan", *job, "--json", "--top", "40")
    assert code == 0, err
    for p in json.loads(out)["plans"]:
        inside = p["tp"] in (1, 2) and p["mbs"] in (1, 2)
        assert set(p["cost_sources"].values()) == {"measured" if inside else "calibrated"}, p
    for restriction, sources in (
        (["--tp", "2", "--mbs", "2"], "measured"),
        (["--tp", "2", "--mbs", "4"], "calibrated"),
        (["--tp", "4", "--mbs", "1"], "calibrated"),
    ):
        code, out, err = cli("plan", *job, *restriction, "--json")
        assert code == 0, err
        assert {s for p in json.loads(out)["plans"] for s in p["cost_sources"].values()} == {sources}
    code, out, err = cli("plan", *job, "--tp", "4")
    assert code == 0, err
    assert "all calibrated" in out and "calibrated: the analytic model fitted to 64 measured times" in out


def test_profile_only_keeps_the_search_to_measured_shapes(cli, cpu_profile):
    base = ["plan", *_tiny_job(cpu_profile)]
    code, out, err = cli(*base, "--profile-only", "--json", "--top", "3")
    assert code == 0, err
    only = json.loads(out)["plans"]
    code, out, _ = cli(*base, "--tp", "1,2", "--mbs", "1,2", "--json", "--top", "3")
    restricted = json.loads(out)["plans"]  # the space of exactly the measured shapes
    assert only == restricted
    code, out, _ = cli(*base, "--profile-only")
    # the summary counts the simulated layouts it dropped; how many reach simulation depends on the
    # CPU profile's measured times (the step-time bound may cut every unmeasured one first)
    dropped = int(out.split(" dropped by --profile-only")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert code == 0 and dropped >= 0
    # a space the profile does not span at all: the error is the command that measures it into the same file
    code, _, err = cli(*base, "--tp", "4", "--profile-only")
    assert code == 2
    [command] = re.findall(r"`planner profile ([^`]*)`", err)
    words = shlex.split(command)
    assert {"--for-plan", "--resume", "--tp"} <= set(words) and words[words.index("-o") + 1] == str(cpu_profile)
    code, out, err = cli("profile", *words, "--dry-run")
    assert code == 0, err
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    assert rows and all(row[2] == "4" and row[-1] == "measure" for row in rows)  # tp 4, none of it in the file


def test_evaluate_and_sweep_say_where_costs_came_from(cli, cpu_profile):
    job = _tiny_job(cpu_profile)
    code, out, err = cli("evaluate", *job, "--tp", "2", "--mbs", "2", "--json")
    assert code == 0 and json.loads(out)["plans"][0]["cost_sources"]["transformer"] == "measured"
    code, out, err = cli("evaluate", *job, "--tp", "4", "--mbs", "2", "--profile-only")
    assert code == 2 and "does not span the embedding, transformer, head shape" in err and err.count("\n") == 1
    code, out, err = cli(
        "sweep",
        *job[:2],
        "--gpus",
        "4",
        "--seq",
        "128",
        "--profile",
        str(cpu_profile),
        "--vary",
        "global-batch",
        "--values",
        "8,16",
        "--json",
    )
    assert code == 0, err
    assert all(
        set(p["plan"]["cost_sources"]) == {"embedding", "transformer", "head"} for p in json.loads(out)["points"]
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--for-plan", "--model", "tiny-llama", "--seq", "256"], "--gpus, --global-batch and --seq are required"),
        (["--for-plan", *TINY[:-1], "128,256"], "takes one sequence length"),
        (["--for-plan", *TINY, "--max-shapes", "0"], "--max-shapes must be at least 1"),
        (["--for-plan", *TINY, "--tp", "8"], "nothing to profile"),
        (["--model", "tiny-llama", "--gpus", "4", "--dry-run"], "--gpus, --dry-run: options of --for-plan"),
    ],
)
def test_user_errors_are_one_line(cli, tmp_path, argv, message):
    code, _, err = cli("profile", *argv, "-o", str(tmp_path / "x.json"))
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_profile_only_needs_a_profile(cli):
    code, _, err = cli("plan", *TINY, "--profile-only")
    assert code == 2 and "--profile-only needs --profile FILE" in err


def test_llama3_8b_on_64_gpus_from_one_measured_shape(cli, tmp_path, one_thread):
    """The large-model path on a CPU: the dry run lists what the request can ask for, a capped
    run measures the cheapest real shape (the embedding's smallest vocabulary shard, about a
    second of CPU), and plan calibrates everything else on it."""
    request = ["--model", "llama3-8b", "--gpus", "64", "--global-batch", "512", "--seq", "8192"]
    path = tmp_path / "cpu-llama3-8b.json"
    code, out, err = cli("profile", "--for-plan", *request, "--max-shapes", "1", "--dry-run", *FAST, "-o", str(path))
    assert code == 0 and not path.exists(), err
    assert "dry run: 1 shapes to measure" in out and "for 63 shapes beyond --max-shapes" in out
    code, out, err = cli("profile", "--for-plan", *request, "--max-shapes", "1", *FAST, "-o", str(path))
    assert code == 0, err
    assert [r.key for r in store.load(path).rows] == [("embedding", 8, 1, 8192, "none")]
    code, out, err = cli("plan", *request, "--profile", str(path), "--tp", "8", "--mbs", "1", "--json")
    assert code == 0, err
    assert all(
        p["cost_sources"] == {"embedding": "measured", "transformer": "calibrated", "head": "calibrated"}
        for p in json.loads(out)["plans"]
    )
    code, out, err = cli("plan", *request, "--profile", str(path))
    assert code == 0, err
    assert "calibrated: the analytic model fitted to 2 measured times of embedding in cpu-llama3-8b.json" in out


def test_shapes_that_ran_out_of_memory_when_profiled_are_infeasible(cli, tmp_path):
    rows = [
        ok_row(kind=kind, mbs=mbs, seq=256, forward_ms=mbs, backward_input_ms=mbs, backward_weight_ms=mbs)
        for kind in ("embedding", "transformer", "head")
        for mbs in (1, 2, 4)
    ]
    oom = ok_row(mbs=8, seq=256).model_copy(update={"status": "oom", "message": "out of memory"})
    path = tmp_path / "capped.json"
    store.save(path, make_profile([*rows, oom]))
    job = [*TINY, "--tp", "1", "--recompute", "none", "--profile", str(path)]
    code, out, err = cli("plan", *job, "--json", "--top", "30")
    assert code == 0, err
    assert {p["mbs"] for p in json.loads(out)["plans"]} == {1, 2, 4}
    # --top above the number of layouts keeps every one in contention (the step-time bounds pass
    # over none), so the search reaches those at the shape that ran out of memory and says why
    code, out, err = cli("plan", *job, "--top", "1000")
    assert code == 0 and "refused: a layer ran out of memory at their shape when profiled" in out
    code, out, err = cli(
        "evaluate",
        "--model",
        "tiny-llama",
        "--gpus",
        "2",
        "--global-batch",
        "16",
        "--seq",
        "256",
        "--mbs",
        "8",
        "--profile",
        str(path),
    )
    assert code == 0 and "ran out of memory when profiled (capped.json): it does not fit" in err


def test_an_interrupted_for_plan_run_resumes_where_it_stopped(cli, tmp_path, one_thread, monkeypatch):
    import planner.profile.measure as measure

    calls, real = [], measure.measure_shape

    def measure_shape(spec, key, settings):
        calls.append(key)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(spec, key, settings)

    monkeypatch.setattr(measure, "measure_shape", measure_shape)
    path = tmp_path / "p.json"
    argv = [
        "profile",
        "--for-plan",
        "--model",
        "tiny-llama",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--seq",
        "64",
        "--tp",
        "1",
        "--mbs",
        "1,2",
        "--recompute",
        "none",
        *FAST,
        "-o",
        str(path),
    ]
    assert cli(*argv)[0] == 130
    assert [r.key for r in store.load(path).rows] == calls[:2]  # the two largest shapes are kept
    code, out, err = cli(*argv, "--resume")
    assert code == 0, err
    assert len(calls) == 6 + 1 and "6 shapes (6 ok); 2 were already in" in out
