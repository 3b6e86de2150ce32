"""Stragglers: a step waits for the slowest of its GPUs, drawn from a measured per-GPU speed
population. The order-statistic formula against brute force and Monte Carlo, its limits, the
data file, and the switch that restores the predictions without it."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest

from planner.catalog import gpu_presets, resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute, LayerTimes
from planner.cost.model import CostModel, CostOptions, compute_slowdown
from planner.cost.shapes import Shard
from planner.cost.stragglers import (
    builtin_spreads,
    expected_slowest,
    far_out_trimmed,
    load_speed_spread,
    straggler_slowdown,
)
from planner.predict import predict
from planner.spec import Cluster
from tests.cost.layouts import even_1f1b


def test_expected_slowest_equals_brute_force_over_every_draw():
    times = (0.96, 1.0, 1.01, 1.08)
    mean = sum(times) / len(times)
    for n in range(1, 6):
        draws = list(itertools.product(times, repeat=n))  # every equally likely assignment
        brute = sum(max(d) for d in draws) / len(draws) / mean
        assert expected_slowest(times, n) == pytest.approx(brute, rel=1e-12)


def test_expected_slowest_agrees_with_monte_carlo_on_the_measured_population():
    times = builtin_spreads()["v100-longhorn-sgemm"].times
    rng, n, trials = random.Random(12), 64, 20_000
    maxima = [max(rng.choices(times, k=n)) for _ in range(trials)]
    mean = statistics.fmean(times)
    estimate = statistics.fmean(maxima) / mean
    stderr = statistics.stdev(maxima) / mean / trials**0.5
    assert abs(expected_slowest(times, n) - estimate) < 4 * stderr


def test_one_gpu_has_no_slowdown_and_more_gpus_never_less():
    for spread in builtin_spreads().values():
        assert straggler_slowdown(spread.name, 1) == 1.0
        assert expected_slowest(spread.times, 1) == pytest.approx(1.0, rel=1e-12)
        values = [spread.slowdown(n) for n in (1, 2, 3, 8, 64, 512, 4096, 16384)]
        assert values == sorted(values) and values[1] > 1.0
        # bounded by the slowest GPU kept, reached as N grows
        assert values[-1] <= max(spread.times) / statistics.fmean(spread.times) + 1e-12
        assert values[-1] == pytest.approx(max(spread.times) / statistics.fmean(spread.times), rel=1e-6)


def test_far_out_fence_is_tukeys_q3_plus_three_iqr():
    times = [1.0, 1.0, 1.02, 1.04, 1.06, 1.08, 2.1]  # inclusive quartiles 1.01 and 1.07: fence 1.25
    kept, dropped = far_out_trimmed(times)
    assert kept == tuple(times[:-1]) and dropped == 1
    assert far_out_trimmed([1.0, 1.0, 1.02, 1.04, 1.06, 1.08, 1.2])[1] == 0


def test_built_in_populations_are_the_sources_gpus_with_their_gross_outliers_dropped():
    sgemm, ls6 = builtin_spreads()["v100-longhorn-sgemm"], builtin_spreads()["a100-ls6-resnet50"]
    # the sources' counts: 392 Longhorn V100s (one 1.20x the median beyond the fence),
    # 219 Lonestar6 A100s of which two nodes (6 GPUs) run 2.1-2.2x the median
    assert (len(sgemm.times) + sgemm.dropped, sgemm.dropped) == (392, 1)
    assert (len(ls6.times) + ls6.dropped, ls6.dropped) == (219, 6)
    for spread in (sgemm, ls6):
        assert statistics.median(spread.times) == pytest.approx(1.0, abs=0.002)
        assert "github.com/hal-uw/blox-pal" in spread.source
    # two generations and two benchmarks give a slowest-of-N within 2 points of each other
    for n in (8, 64, 512, 16384):
        assert abs(sgemm.slowdown(n) - ls6.slowdown(n)) < 0.02


def test_every_gpu_preset_names_a_population_with_its_reason():
    for gpu in gpu_presets().values():
        assert gpu.speed_spread in builtin_spreads(), gpu.name
        assert gpu.speed_spread_source, gpu.name


def test_a_population_file_in_the_presets_format_loads(tmp_path):
    path = tmp_path / "my-cluster.toml"
    path.write_text('[my-cluster]\nsource = "measured"\ntimes = [10.0, 10.1, 10.2, 9.9, 30.0]\n')
    spread = load_speed_spread(str(path))
    assert spread.name == "my-cluster" and spread.dropped == 1
    assert spread.slowdown(2) == pytest.approx(expected_slowest([0.99, 1.0, 1.01, 1.02], 2))


def test_compute_bound_gemms_slow_by_the_factor_memory_bound_time_keeps_its_own():
    gpu = resolve_gpu("h100")
    base, slow = AnalyticCompute(gpu), AnalyticCompute(gpu, compute_slowdown=1.05)
    overhead = gpu.efficiency.kernel_overhead_us * 1e-6
    big = (base.gemm_time(8192, 8192, 8192) - overhead, slow.gemm_time(8192, 8192, 8192) - overhead)
    assert big[1] == pytest.approx(1.05 * big[0], rel=1e-12)
    a100 = resolve_gpu("a100-80gb")  # roofline without a table: 8 rows stream the 8192^2 weight from HBM
    skinny = (
        AnalyticCompute(a100).gemm_time(8, 8192, 8192),
        AnalyticCompute(a100, compute_slowdown=1.05).gemm_time(8, 8192, 8192),
    )
    assert skinny[1] == skinny[0]
    assert slow.attention_time(1e12, 8192, True) == pytest.approx(1.05 * base.attention_time(1e12, 8192, True))
    assert slow.elementwise_time(1e9, 4) == base.elementwise_time(1e9, 4)


def _layout(spec, dp):
    return even_1f1b(spec, tp=8, pp=2, dp=dp, micro_batches=8, sp=True)


def _prediction(spec, gpu, dp, options):
    return predict(CostModel(spec, Cluster.of(gpu, 16 * dp), options), _layout(spec, dp), 8 * dp, 4096)


def test_off_gives_the_predictions_of_a_gpu_without_a_population_exactly():
    spec, gpu = resolve_model("llama3-70b"), resolve_gpu("h100")
    without = gpu.model_copy(update={"speed_spread": None})
    for dp in (1, 8):
        off = _prediction(spec, gpu, dp, CostOptions.of(stragglers=False))
        none = _prediction(spec, without, dp, CostOptions())
        assert off.step_time_s == none.step_time_s
        assert off.time_breakdown_s == none.time_breakdown_s
        assert off.peak_memory_bytes == none.peak_memory_bytes


def test_on_slows_compute_more_with_more_gpus_and_leaves_memory_alone():
    spec, gpu = resolve_model("llama3-70b"), resolve_gpu("h100")
    factors = {}
    for dp in (1, 8, 64):
        on, off = (_prediction(spec, gpu, dp, CostOptions.of(stragglers=s)) for s in (True, False))
        factors[dp] = on.time_breakdown_s["compute"] / off.time_breakdown_s["compute"]
        assert 1.0 < factors[dp] < straggler_slowdown(gpu.speed_spread, 16 * dp)
        assert on.peak_memory_bytes == off.peak_memory_bytes
    assert factors[1] < factors[8] < factors[64]


def test_a_measured_source_is_scaled_whole_by_the_factor():
    class Fixed:
        name = "fixed"

        def layer_times(self, kind, shard):
            return LayerTimes(forward_s=1.0, backward_input_s=2.0, backward_weight_s=3.0)

    spec, gpu = resolve_model("llama3-8b"), resolve_gpu("h100")
    shard = Shard(mbs=1, seq=4096, tp=8, sequence_parallel=True)
    options = CostOptions.of(tp_comm_overlap=0.0)
    costs = CostModel(spec, Cluster.of(gpu, 512), options, source=Fixed()).layer_costs("transformer", shard)
    factor = compute_slowdown(gpu, options, 512)
    assert factor > 1.0
    assert (costs.forward_s, costs.backward_weight_s) == pytest.approx((factor, 3.0 * factor))


def test_cli_switch_and_population_choice(cli, tmp_path):
    args = [
        "evaluate",
        "--model",
        "llama3-8b",
        "--gpus",
        "64",
        "--gpu",
        "h100",
        "--global-batch",
        "256",
        "--seq",
        "4096",
        "--tp",
        "8",
        "--pp",
        "2",
        "--mbs",
        "1",
        "--json",
    ]
    steps = {}
    for name, extra in (("on", []), ("off", ["--no-stragglers"]), ("ls6", ["--gpu-speed-spread", "a100-ls6-resnet50"])):
        code, out, err = cli(*args, *extra)
        assert code == 0, err
        steps[name] = json.loads(out)["plans"][0]["predicted"]["step_time_s"]
    assert steps["off"] < steps["on"] < steps["ls6"]  # 64 GPUs: 1.049 (SGEMM) < 1.064 (LS6)
    code, out, err = cli(*args, "--gpu-speed-spread", str(tmp_path / "missing.toml"))
    assert code == 2 and err.strip().startswith("error:") and "missing.toml" in err


def test_options_default_on_and_replaceable():
    options = CostOptions()
    assert options.cluster.stragglers and options.cluster.speed_spread is None
    assert compute_slowdown(resolve_gpu("a100-80gb"), options.with_fields(stragglers=False), 4096) == 1.0
    assert compute_slowdown(
        resolve_gpu("a100-80gb"), options.with_fields(speed_spread="a100-ls6-resnet50"), 64
    ) == pytest.approx(builtin_spreads()["a100-ls6-resnet50"].slowdown(64))


def test_measured_node_records_collect_into_a_population_the_planner_reads(tmp_path):
    from planner.fidelity.gpu_speed import collect

    for host, times in (("node-a", (1.00, 1.02)), ("node-b", (0.99, 1.05))):
        records = [
            {
                "host": host,
                "index": i,
                "uuid": f"{host}-{i}",
                "name": "NVIDIA H100 80GB HBM3",
                "gemm_size": 8192,
                "windows": 100,
                "seconds_per_gemm": t * 1.6e-3,
                "tflops": 0.0,
            }
            for i, t in enumerate(times)
        ]
        (tmp_path / f"{host}.json").write_text(json.dumps(records))
    path = tmp_path / "cluster.toml"
    path.write_text(collect(tmp_path, "my-h100s"))
    spread = load_speed_spread(str(path))
    assert spread.name == "my-h100s" and spread.dropped == 0 and len(spread.times) == 4
    assert "4 GPUs of 2 nodes" in spread.source
    assert spread.slowdown(4) == pytest.approx(expected_slowest([0.99, 1.0, 1.02, 1.05], 4))


def test_collected_records_with_bursts_give_the_sustained_over_burst_ratio(tmp_path):
    """Each GPU's sustained rate over its burst rate (burst time over sustained time), the
    median over GPUs, written beside the population, which still loads."""
    import tomllib

    from planner.fidelity.gpu_speed import collect

    ratios = (0.86, 0.88, 0.90, 0.95)
    records = [
        {
            "host": "node-a",
            "index": i,
            "uuid": f"a-{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "gemm_size": 8192,
            "windows": 100,
            "seconds_per_gemm": 1.6e-3,
            "tflops": 0.0,
            "burst_seconds_per_gemm": 1.6e-3 * r,
        }
        for i, r in enumerate(ratios)
    ]
    (tmp_path / "node-a.json").write_text(json.dumps(records))
    text = collect(tmp_path, "bursts")
    assert tomllib.loads(text)["bursts"]["sustained_over_burst"] == pytest.approx(0.89, abs=5e-5)
    path = tmp_path / "bursts.toml"
    path.write_text(text)
    assert len(load_speed_spread(str(path)).times) == 4
    for r in records:
        del r["burst_seconds_per_gemm"]
    (tmp_path / "node-a.json").write_text(json.dumps(records))
    assert "sustained_over_burst" not in collect(tmp_path, "old")


def test_another_jobs_analytic_source_is_costed_at_this_jobs_pace():
    """`planner plan`'s hints re-cost a request at other GPU counts with the first model's source."""
    spec, gpu = resolve_model("llama3-8b"), resolve_gpu("h100")
    shard = Shard(mbs=1, seq=4096, tp=8, sequence_parallel=True)
    small = CostModel(spec, Cluster.of(gpu, 8), CostOptions())
    reused = CostModel(spec, Cluster.of(gpu, 4096), CostOptions(), small.source)
    fresh = CostModel(spec, Cluster.of(gpu, 4096), CostOptions())
    assert reused.layer_costs("transformer", shard) == fresh.layer_costs("transformer", shard)
    # (this shard's forward is host-bound, the same on any GPU; its backward is not)
    assert small.layer_costs("transformer", shard).backward_s < fresh.layer_costs("transformer", shard).backward_s
