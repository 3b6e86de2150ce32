"""The attention implementation as a choice: fused kernels at their published rates, unfused
attention as batched GEMMs plus softmax passes and its quadratic saved memory, the runtimes'
defaults and the CLI option."""

from __future__ import annotations

import json

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard, layer_work
from planner.errors import PlannerError
from planner.job import default_attention, runtime_cost_options
from planner.runtimes import resolve
from planner.spec import Cluster
from tests.cost.burst_rates import burst_rates

H100 = burst_rates("h100")
"""The H100's component rates, without the measured-layer anchor and the sustained clock that
multiply them (tests/cost/burst_rates.py): these tests check the kernels against their own sources."""
LLAMA = resolve_model("llama3-8b")
# The FlashAttention-3 paper's benchmark shape: 16k tokens per batch, 16 heads of dimension 128.
BENCH = LLAMA.model_copy(update=dict(hidden_size=2048, num_attention_heads=16, num_kv_heads=16))


def _core(attention: str, seq: int, spec=BENCH, gpu=H100) -> tuple[float, float, float]:
    """(forward s, backward s, forward FLOPs executed: the causal half for fused kernels, the
    full square for unfused attention) of the attention core at the paper's shape."""
    shard = Shard(mbs=16384 // seq, seq=seq)
    work = layer_work(spec, "transformer", shard, attention=attention)
    fwd, bwd = AnalyticCompute(gpu).attention_core_times(work, attention)
    return fwd, bwd, work.attention_flops


@pytest.mark.parametrize(
    "attention, fwd_tflops, bwd_tflops",
    [("flash2", 335, 322 * 335 / 370), ("cudnn", 539, 516 * 539 / 595), ("flash3", 616, 561 * 616 / 648)],
)
def test_fused_kernels_run_at_the_fa3_papers_h100_rates(attention, fwd_tflops, bwd_tflops):
    """At 16k tokens the sequence falloff is small: the rate is the paper's within 2%."""
    fwd, bwd, flops = _core(attention, 16384)
    assert flops / fwd / 1e12 == pytest.approx(fwd_tflops, rel=0.02)
    assert 2.5 * flops / bwd / 1e12 == pytest.approx(bwd_tflops, rel=0.02)


def test_faster_kernels_are_faster_on_hopper():
    times = [sum(_core(a, 8192)[:2]) for a in ("unfused", "flash2", "cudnn", "flash3")]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("seq, fwd_tflops, bwd_tflops", [(4096, 133, 174), (8192, 139, 181)])
def test_unfused_attention_is_near_the_papers_standard_attention(seq, fwd_tflops, bwd_tflops):
    """FA3 paper figs. 4 and 6 (H100, head dim 128, non-causal, 16k tokens): standard attention
    (PyTorch, scores materialised) runs at fwd_tflops forward and bwd_tflops backward. Unfused
    attention computes the full square whether masked or not, so its rate over full-square
    FLOPs is comparable. Tolerance: 35% forward, 50% backward (the model's softmax passes are
    bf16 fused kernels, the paper's eager softmax is not)."""
    fwd, bwd, full = _core("unfused", seq)
    assert full / fwd / 1e12 == pytest.approx(fwd_tflops, rel=0.35)
    assert 2.5 * full / bwd / 1e12 == pytest.approx(bwd_tflops, rel=0.50)


def test_unfused_attention_saves_korthikantis_quadratic_term():
    """With dropout, unfused attention keeps the softmax output (2 B), the dropout mask (1 B)
    and its output (2 B) per score: 5 a s^2 b / t bytes (Korthikanti et al. 2022, Table 2),
    instead of flash attention's fp32 log-sum-exp (4 b s a / t)."""
    cluster = Cluster.of(H100, 8)
    shard = Shard(mbs=2, seq=4096, tp=4, sequence_parallel=True)
    saved = {
        a: CostModel(LLAMA, cluster, CostOptions.of(attention=a, dropout=True))
        .layer_costs("transformer", shard)
        .activation_bytes
        for a in ("unfused", "flash2")
    }
    b, s, heads = shard.mbs, shard.seq, LLAMA.num_attention_heads // shard.tp
    assert saved["unfused"] - saved["flash2"] == pytest.approx(5 * heads * s * s * b - 4 * b * s * heads)


def test_selective_recompute_reruns_the_unfused_core_and_drops_its_memory():
    cluster = Cluster.of(H100, 8)
    shard = Shard(mbs=1, seq=4096, tp=8, sequence_parallel=True)
    model = CostModel(LLAMA, cluster, CostOptions.of(attention="unfused", cuda_graphs=True))
    none, selective = (
        model.layer_costs("transformer", shard, "none"),
        model.layer_costs("transformer", shard, "selective"),
    )
    core_fwd = model.analytic.attention_core_times(
        layer_work(LLAMA, "transformer", shard, attention="unfused"), "unfused"
    )[0]
    assert selective.recompute_s == pytest.approx(core_fwd)
    assert none.activation_bytes - selective.activation_bytes == pytest.approx(2 * 4 * 4096 * 4096)


def test_a_kernel_the_gpu_lacks_is_refused():
    with pytest.raises(PlannerError, match="flash3"):
        CostModel(LLAMA, Cluster.of(resolve_gpu("a100-80gb"), 8), CostOptions.of(attention="flash3"))
    with pytest.raises(ValueError, match="attention"):
        CostOptions.of(attention="flash4")


def test_runtime_defaults():
    assert default_attention(None, H100) == "cudnn"  # Megatron-LM + TE on Hopper
    assert default_attention(resolve("megatron"), resolve_gpu("h200")) == "cudnn"
    assert default_attention(resolve("megatron"), resolve_gpu("a100-80gb")) == "flash2"
    assert default_attention(resolve("torchtitan"), H100) == "flash2"  # torch SDPA flash backend
    assert default_attention(resolve("nemo"), H100) == "cudnn"  # NeMo 2024 over TE >= 1.2
    assert runtime_cost_options("torch", H100, "unfused").kernels.attention == "unfused"
    assert CostOptions().kernels.flash_attention and not CostOptions.of(attention="unfused").kernels.flash_attention


def _evaluate(cli, *extra: str) -> dict:
    code, out, err = cli(
        "evaluate",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--seq",
        "4096",
        "--tp",
        "8",
        "--json",
        *extra,
    )
    assert code == 0, err
    return json.loads(out)["plans"][0]["predicted"]


def test_cli_attention_option_moves_time_and_memory(cli):
    default, cudnn = _evaluate(cli), _evaluate(cli, "--attention", "cudnn")
    assert default == cudnn  # Megatron's default on H100
    flash2, unfused = _evaluate(cli, "--attention", "flash2"), _evaluate(cli, "--attention", "unfused")
    assert cudnn["step_time_s"] < flash2["step_time_s"] < unfused["step_time_s"]
    assert unfused["memory_breakdown_gb"]["activations"] > flash2["memory_breakdown_gb"]["activations"]


def test_cli_refuses_an_unknown_or_missing_kernel(cli):
    code, _, err = cli("cost", "--model", "llama3-8b", "--seq", "2048", "--attention", "xformers")
    assert code == 2 and "flash2, flash3, cudnn, triton_fa1, unfused" in err
    code, _, err = cli("cost", "--model", "llama3-8b", "--seq", "2048", "--gpu", "a100-80gb", "--attention", "flash3")
    assert code == 2 and "no measured flash3" in err
