"""The weight-gradient GEMM's output traffic: a fresh 16-bit gradient written once, or the main
gradient read and written in place under Megatron's gradient-accumulation fusion
(planner/cost/grad_accum.py `wgrad_output_bytes`)."""

from pathlib import Path

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.model import CostModel, CostOptions, analytic_compute
from planner.cost.shapes import Gemm, Shard
from planner.fidelity.published import cost_options, load_runs
from planner.job import runtime_cost_options
from planner.spec import Cluster
from tests.cost.roofline import closed_form_gemm_s

RUNS = Path(__file__).parents[1] / "bench" / "published_runs.toml"

TOKENS, ROWS, COLS = 64, 4096, 4096
"""A weight gradient over few tokens: 2 * 4096 * 4096 * 64 FLOPs against 32-134 MB of output."""

GPU = "a100-80gb"
"""A GPU without a measured GEMM table: its GEMM rate is the closed-form roofline."""


@pytest.mark.parametrize("output_bytes", [2.0, 4.0, 8.0])
def test_weight_gradient_moves_its_output_bytes(output_bytes):
    compute = AnalyticCompute(resolve_gpu(GPU), wgrad_output_bytes=output_bytes)
    assert compute.eff.gemm_table is None and compute.eff.sustained_compute == 1.0
    weight_s = compute.gemms_times([Gemm("linear", TOKENS, COLS, ROWS)]).backward_weight_s
    assert weight_s == pytest.approx(closed_form_gemm_s(compute, ROWS, COLS, TOKENS, output_bytes), rel=1e-12)


def test_output_bytes_leave_forward_and_data_gradient_alone():
    plain = AnalyticCompute(resolve_gpu(GPU))
    fused = AnalyticCompute(resolve_gpu(GPU), wgrad_output_bytes=8.0)
    gemms = [Gemm("linear", TOKENS, COLS, ROWS)]
    assert fused.gemms_times(gemms).forward_s == plain.gemms_times(gemms).forward_s
    assert fused.gemms_times(gemms).backward_input_s == plain.gemms_times(gemms).backward_input_s
    assert fused.gemms_times(gemms).backward_weight_s > 2 * plain.gemms_times(gemms).backward_weight_s


def test_many_tokens_hide_the_main_gradient_traffic():
    """8,192 tokens per weight: the GEMM's compute covers the fp32 read and write."""
    plain = AnalyticCompute(resolve_gpu(GPU))
    fused = AnalyticCompute(resolve_gpu(GPU), wgrad_output_bytes=8.0)
    gemms = [Gemm("linear", 8192, COLS, ROWS)]
    assert fused.gemms_times(gemms).backward_weight_s == plain.gemms_times(gemms).backward_weight_s


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (CostOptions(), 8.0),  # Megatron-LM: fused into fp32 main gradients
        (CostOptions.of(grad_reduce_bytes=2), 4.0),  # --grad-reduce-in-bf16: bf16 main gradients
        (CostOptions.of(wgrad_accumulation="autograd"), 2.0),
        (runtime_cost_options("megatron"), 8.0),
        (runtime_cost_options("torchtitan"), 2.0),
        (runtime_cost_options("deepspeed"), 2.0),
        (runtime_cost_options("torch"), 2.0),
    ],
)
def test_options_choose_the_output_bytes(options, expected):
    assert analytic_compute(resolve_gpu("h100"), options).wgrad_output_bytes == expected


def test_published_runs_take_their_runtimes_accumulation():
    runs = {run.name: run for run in load_runs(RUNS)}
    assert cost_options(runs["korthikanti-22b-full"]).data.wgrad_accumulation == "fused"
    assert cost_options(runs["torchtitan-llama3-8b-fsdp8"]).data.wgrad_accumulation == "none"
    assert cost_options(runs["megatron-sc21-gpt-1.7b"]).data.wgrad_accumulation == "autograd"  # named in the file
    # Megatron-FSDP's recipe passes --no-gradient-accumulation-fusion
    assert cost_options(runs["qwen3-235b-ep8-fsdp-256xh100"]).data.wgrad_accumulation == "none"


def _fused_and_fresh(model: str, shard: Shard):
    """One block's times with the weight gradients accumulated in place, and written fresh."""
    spec, cluster = resolve_model(model), Cluster.of(resolve_gpu("h100"), 256, gpus_per_node=8)
    fused = CostModel(spec, cluster, CostOptions()).source.layer_times("transformer", shard)
    fresh = CostModel(spec, cluster, CostOptions.of(wgrad_accumulation="none")).source.layer_times("transformer", shard)
    assert (fused.forward_s, fused.backward_input_s) == (fresh.forward_s, fresh.backward_input_s)
    return fused, fresh


def test_fine_grained_experts_pay_for_the_fused_accumulation():
    """Qwen3-235B at TP 4, EP 8: 16 local experts see ~630 tokens each per micro-batch, so their
    weight gradients' fp32 read and write shows."""
    fused, fresh = _fused_and_fresh(
        "qwen3-235b-a22b", Shard(mbs=1, seq=4096, tp=4, sequence_parallel=True, ep=8, etp=1)
    )
    assert fused.backward_weight_s > 1.02 * fresh.backward_weight_s


def test_dense_tokens_hide_the_fused_accumulation():
    """Llama 3 8B's 8,192 tokens per GEMM: every weight gradient stays compute-bound."""
    fused, fresh = _fused_and_fresh("llama3-8b", Shard(mbs=1, seq=8192))
    assert fused.backward_weight_s == fresh.backward_weight_s
