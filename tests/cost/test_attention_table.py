"""Fused attention measured by sequence length (planner/cost/attention_table.py): the B200's
table against the benchmark artifact it transcribes, the preset's rates against the table, and
the cost model's attention time against the measured times at the benchmark's own shape."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.attention_table import forward_flops, load_attention_table, parse_attention_table
from planner.cost.compute import AnalyticCompute
from planner.cost.shapes import Shard, layer_work
from planner.errors import ConfigError
from planner.job import default_attention
from planner.runtimes import resolve
from tests.cost.burst_rates import burst_rates

B200 = burst_rates("b200")
TABLE = load_attention_table("attention_b200_cudnn_frontend.toml")

# The artifact's own TFLOP/s columns (fwd_tflops_per_sec, bwd_tflops_per_sec), per sequence
# length, of the two backends kept (sdpa_bf16_benchmark_results_NVIDIA_B200.csv at
# NVIDIA/cudnn-frontend@0b1577c8), computed there from unrounded times.
ARTIFACT_TFLOPS = {
    "cudnn": {
        1024: (254.501, 308.529),
        2048: (478.921, 371.486),
        4096: (855.678, 701.265),
        8192: (1171.278, 942.509),
        16384: (1332.415, 1074.776),
        32768: (1419.000, 1108.688),
        65536: (1382.330, 1073.059),
        131072: (1355.418, 1047.843),
    },
    "flash2": {
        1024: (165.535, 107.669),
        2048: (242.386, 186.284),
        4096: (324.899, 256.427),
        8192: (373.392, 298.867),
        16384: (394.495, 319.979),
        32768: (403.739, 330.801),
        65536: (408.739, 335.402),
        131072: (410.988, 336.043),
    },
}

# The benchmark's layer: Llama 3.1 405B's attention (128 query heads, 8 key/value heads of 128).
BENCH = resolve_model("llama3-8b").model_copy(
    update=dict(hidden_size=128 * 128, num_attention_heads=128, num_kv_heads=8)
)


@pytest.mark.parametrize("kernel", ["cudnn", "flash2"])
def test_table_rates_are_the_artifacts(kernel):
    """The times kept, with the FLOP count, give the artifact's TFLOP/s (the times are rounded to
    a microsecond, so within 0.5 % from 1k tokens up)."""
    for seq, (fwd, bwd) in ARTIFACT_TFLOPS[kernel].items():
        assert TABLE.rate(kernel, seq, backward=False) / 1e12 == pytest.approx(fwd, rel=0.005), seq
        assert TABLE.rate(kernel, seq, backward=True) / 1e12 == pytest.approx(bwd, rel=0.005), seq


def test_flop_count_is_the_benchmarks():
    """4 b s^2 h d halved under the causal mask: at 16k, 8.796 TFLOP for the forward."""
    assert forward_flops(1, 16384, 128, 128, causal=True) == 4 * 16384**2 * 128 * 128 / 2
    assert forward_flops(1, 16384, 128, 128, causal=False) == 2 * forward_flops(1, 16384, 128, 128, causal=True)


def test_preset_rates_are_the_tables_at_its_reference_length():
    eff = resolve_gpu("b200").efficiency
    peak = resolve_gpu("b200").peak_flops("bf16")
    ref = TABLE.reference_seq
    pairs = [
        (eff.cudnn_fwd, TABLE.rate("cudnn", ref, False)),
        (eff.cudnn_bwd, TABLE.rate("cudnn", ref, True)),
        (eff.attention_fwd, TABLE.rate("flash2", ref, False)),
        (eff.attention_bwd, TABLE.rate("flash2", ref, True)),
    ]
    for stated, measured in pairs:
        assert stated == pytest.approx(measured / peak, abs=5e-5)


@pytest.mark.parametrize("kernel", ["cudnn", "flash2"])
@pytest.mark.parametrize("seq", [2048, 4096, 8192, 16384, 32768])
def test_attention_core_takes_the_measured_time(kernel, seq):
    """At the benchmark's shape the model's attention core runs in the measured milliseconds."""
    work = layer_work(BENCH, "transformer", Shard(mbs=1, seq=seq), attention=kernel)
    fwd, bwd = AnalyticCompute(B200).attention_core_times(work, kernel)
    assert work.attention_flops == forward_flops(1, seq, 128, 128, causal=True)
    fwd_tflops, bwd_tflops = ARTIFACT_TFLOPS[kernel][seq]
    assert work.attention_flops / fwd / 1e12 == pytest.approx(fwd_tflops, rel=0.01)
    assert 2.5 * work.attention_flops / bwd / 1e12 == pytest.approx(bwd_tflops, rel=0.01)


def test_between_and_beyond_the_measured_lengths():
    """Between two lengths the rate lies between theirs; beyond the ends it is held."""
    for backward in (False, True):
        lo, hi = TABLE.rate("cudnn", 8192, backward), TABLE.rate("cudnn", 16384, backward)
        assert lo < TABLE.rate("cudnn", 12288, backward) < hi
        assert TABLE.rate("cudnn", 256, backward) == TABLE.rate("cudnn", 512, backward)
        assert TABLE.rate("cudnn", 1 << 20, backward) == TABLE.rate("cudnn", 131072, backward)
    assert TABLE.falloff("cudnn", TABLE.reference_seq, False) == pytest.approx(1.0)
    assert TABLE.falloff("flash3", 8192, False) is None


def test_cudnn_runs_three_times_flash2_on_blackwell():
    """The measurement's point: on B200 PyTorch's FlashAttention-2 reaches a sixth of the peak,
    cuDNN's fused attention more than half (FlashAttention-3 does not run there)."""
    shard = Shard(mbs=1, seq=8192)
    times = {
        kernel: sum(AnalyticCompute(B200).attention_core_times(layer_work(BENCH, "transformer", shard), kernel))
        for kernel in ("flash2", "cudnn")
    }
    assert 2.5 < times["flash2"] / times["cudnn"] < 3.5


def test_transformer_engines_runtimes_pick_cudnn_on_blackwell():
    gpu = resolve_gpu("b200")
    assert default_attention(resolve("megatron"), gpu) == "cudnn"
    assert default_attention(resolve("nemo"), gpu) == "cudnn"
    assert default_attention(resolve("torchtitan"), gpu) == "flash2"


def test_a_malformed_table_is_refused():
    text = """source = "x"
batch = 1
query_heads = 1
head_dim = 64
causal = true
reference_seq = 1024
[kernels.cudnn]
points = [[1024, 1.0, 2.0], [1024, 1.0, 2.0]]
"""
    with pytest.raises(ConfigError, match="repeated"):
        parse_attention_table(text, "bad.toml")


GH100 = load_attention_table("attention_gh100_cudnn_frontend.toml")
# The H200 results file's own cuDNN bf16 causal TFLOP/s (fwd_tflops, bwd_tflops), per length
# (results/h200_919_only_cudnn/llama3.1_20260227_034703.csv at NVIDIA/cudnn-frontend@df73764a).
H200_CUDNN_TFLOPS = {
    2048: (484.0, 370.0),
    4096: (591.0, 474.0),
    8192: (644.0, 541.0),
    16384: (673.0, 579.0),
    32768: (688.0, 581.0),
}


def test_gh100_table_rates_are_the_results_files():
    for seq, (fwd, bwd) in H200_CUDNN_TFLOPS.items():
        assert GH100.rate("cudnn", seq, backward=False) / 1e12 == pytest.approx(fwd, rel=0.005), seq
        assert GH100.rate("cudnn", seq, backward=True) / 1e12 == pytest.approx(bwd, rel=0.005), seq


@pytest.mark.parametrize("gpu", ["h100", "h800", "h200", "h100-96gb"])
def test_the_h100_familys_cudnn_follows_the_measured_falloff(gpu):
    """Every GH100 preset keeps its cuDNN rate at 16k tokens and runs shorter sequences at the
    share of it the H200 measured; FlashAttention-2 keeps the GEMM-style falloff."""
    preset = burst_rates(gpu)
    shape = BENCH.model_copy(update=dict(hidden_size=64 * 128, num_attention_heads=64))
    times = {}
    for seq in (4096, 16384):
        work = layer_work(shape, "transformer", Shard(mbs=1, seq=seq), attention="cudnn")
        fwd, bwd = AnalyticCompute(preset).attention_core_times(work, "cudnn")
        times[seq] = (work.attention_flops / fwd, 2.5 * work.attention_flops / bwd)
    peak = preset.peak_flops("bf16")
    assert times[16384][0] == pytest.approx(preset.efficiency.cudnn_fwd * peak)
    assert times[16384][1] == pytest.approx(preset.efficiency.cudnn_bwd * peak)
    assert times[4096][0] / times[16384][0] == pytest.approx(591 / 673, rel=0.01)
    assert times[4096][1] / times[16384][1] == pytest.approx(474 / 579, rel=0.01)
    flash2 = AnalyticCompute(preset)
    assert flash2.attention_time(1e12, 4096, False, "flash2") == pytest.approx(
        1e12 / (peak * preset.efficiency.attention_fwd * 4096 / (4096 + preset.efficiency.gemm_half_dim))
    )
