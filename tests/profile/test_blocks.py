"""`planner profile --block`: the runtimes' own transformer blocks at TP-sharded shapes,
against the analytic model of the runtime that runs them.

What each block keeps for backward (bf16, recompute none), measured here on CPU:
- planner's block: the analytic fused model (Megatron-LM + TE) plus the two RMSNorms'
  1/rms (4 B a token each, not modelled; 0.1% for tiny-llama);
- torchtitan's Llama3TransformerBlock: the same plus silu's output, because torchtitan runs
  SwiGLU eager (`eager_swiglu`, set by `--runtime torchtitan`); 14-18% above the fused model
  for tiny-llama, within 0.2% of the torchtitan model;
- megatron-core's local-spec layer builds on CPU (parameters checked) but its attention
  allocates on CUDA, so its saved bytes are measured only on a GPU (marked test below).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.catalog import resolve_model  # noqa: E402
from planner.cost import memory  # noqa: E402
from planner.cost.shapes import Shard  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.job import runtime_cost_options  # noqa: E402
from planner.profile.blocks import build_transformer, check_block  # noqa: E402
from planner.profile.measure import Settings, measure_shape, param_count  # noqa: E402
from planner.profile.schema import ShapeKey  # noqa: E402

RUNTIME_AGREEMENT = 0.05


def _activation_options(runtime: str | None, **extra) -> memory.ActivationOptions:
    """The analytic model's activation options for plans `runtime` runs (as CostModel builds them)."""
    options = runtime_cost_options(runtime)
    kernels = options.kernels
    return memory.ActivationOptions(
        flash_attention=kernels.flash_attention,
        dropout=kernels.dropout,
        selective_policy=options.recompute.selective_policy,
        eager_swiglu=kernels.eager_swiglu,
        **extra,
    )


def _measure(block: str, tp: int, recompute: str = "none", model: str = "tiny-llama"):
    row = measure_shape(
        resolve_model(model),
        ShapeKey("transformer", tp, 2, 64, recompute),
        Settings(device="cpu", dtype="bf16", warmup=0, repeats=1, block=block),
    )
    assert row.status == "ok", row.message
    return row


@pytest.mark.parametrize("block", ["planner", "torchtitan", "megatron"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_block_holds_the_analytic_parameters_of_its_shard(block, tp):
    spec = resolve_model("tiny-llama")
    layer = build_transformer(block, spec, tp, 64, "cpu")
    assert sum(p.numel() for p in layer.parameters()) == memory.transformer_param_count(spec, tp)


@pytest.mark.parametrize("block", ["planner", "torchtitan"])
def test_parameter_count_on_the_meta_device_for_a_large_model(block):
    spec = resolve_model("llama3-70b")  # 0.86 B parameters a block at tp=1: meta only
    assert param_count(spec, "transformer", 8, block) == memory.transformer_param_count(spec, 8)


@pytest.mark.parametrize("tp", [1, 2])
def test_torchtitan_block_saves_what_the_torchtitan_model_says(one_thread, tp):
    row = _measure("torchtitan", tp)
    shard = Shard(mbs=2, seq=64, tp=tp)
    spec = resolve_model("tiny-llama")
    runtime = memory.activation_bytes(spec, "transformer", shard, "none", _activation_options("torchtitan"))
    fused = memory.activation_bytes(spec, "transformer", shard, "none", _activation_options(None))
    assert row.activation_bytes == pytest.approx(runtime, rel=RUNTIME_AGREEMENT)
    # where it differs from the fused model: exactly silu's output (bf16, FFN shard wide)
    # plus each RMSNorm's fp32 1/rms per token, which neither model counts
    silu = 2 * shard.local_tokens * spec.ffn_hidden_size / tp
    rstd = 2 * 4 * shard.local_tokens
    assert row.activation_bytes - fused == silu + rstd


def test_planner_block_differs_from_the_fused_model_only_by_the_norms(one_thread):
    row = _measure("planner", 2)
    shard = Shard(mbs=2, seq=64, tp=2)
    fused = memory.activation_bytes(resolve_model("tiny-llama"), "transformer", shard, "none")
    assert row.activation_bytes - fused == 2 * 4 * shard.local_tokens


@pytest.mark.parametrize("block", ["planner", "torchtitan"])
def test_full_recompute_keeps_the_block_input(one_thread, block):
    row = _measure(block, 2, "full")
    spec = resolve_model("tiny-llama")
    assert row.activation_bytes == memory.activation_bytes(spec, "transformer", Shard(mbs=2, seq=64, tp=2), "full")


@pytest.mark.parametrize("block", ["planner", "torchtitan"])
@pytest.mark.parametrize("tp", [1, 2])
def test_flops_of_each_phase_are_the_linear_layers(one_thread, block, tp):
    # On a CPU torch has no FLOP formula for its flash attention: every counted FLOP is a
    # matrix multiply. Forward: 2 x tokens x weights; I (input gradients) and W (weight
    # gradients) one such product each; the full backward is I + W.
    spec = resolve_model("tiny-llama")
    row = _measure(block, tp)
    norms = 2 * spec.hidden_size
    linear = 2 * (2 * 64) * (memory.transformer_param_count(spec, tp) - norms)
    assert row.forward_flops == row.backward_input_flops == row.backward_weight_flops == linear
    assert row.backward_flops == row.backward_input_flops + row.backward_weight_flops


def test_operator_counts_are_deterministic_and_differ_by_block(one_thread):
    first, again = _measure("torchtitan", 2), _measure("torchtitan", 2)
    counts = ("forward_ops", "backward_input_ops", "backward_weight_ops", "backward_ops")
    assert [getattr(first, c) for c in counts] == [getattr(again, c) for c in counts]
    assert all(getattr(first, c) > 0 for c in counts)
    planner = _measure("planner", 2)
    # torchtitan fuses the QKV projection (one GEMM) where planner's block runs three
    assert first.forward_ops < planner.forward_ops


def test_blocks_that_cannot_run_are_refused_before_measuring():
    llama, gpt = resolve_model("tiny-llama"), resolve_model("tiny-gpt")
    with pytest.raises(PlannerError, match="not a dense Llama-style model"):
        check_block("torchtitan", gpt, "cpu")
    with pytest.raises(PlannerError, match="needs --device cuda"):
        check_block("megatron", llama, "cpu")
    with pytest.raises(PlannerError, match="unknown 'tvm'"):
        check_block("tvm", llama, "cpu")
    check_block("megatron", llama, "cuda")  # the GPU path is open


def test_megatron_block_builds_on_cpu_but_its_attention_needs_cuda():
    layer = build_transformer("megatron", resolve_model("tiny-llama"), 2, 64, "cpu")
    x = torch.randn(2, 64, 256, requires_grad=True)
    with pytest.raises(Exception, match="CUDA|cuda"):
        layer(x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_block_saves_what_the_unfused_attention_model_says(tp):
    # the local spec's DotProductAttention materialises softmax(QK^T): the non-flash model
    spec = resolve_model("tiny-llama")
    row = measure_shape(
        spec,
        ShapeKey("transformer", tp, 2, 64, "none"),
        Settings(device="cuda", dtype="bf16", warmup=0, repeats=1, block="megatron"),
    )
    assert row.status == "ok", row.message
    options = memory.ActivationOptions(flash_attention=False)
    expected = memory.activation_bytes(spec, "transformer", Shard(mbs=2, seq=64, tp=tp), "none", options)
    print(f"megatron local block tp={tp}: measured {row.activation_bytes} B, analytic {expected:.0f} B")
    assert row.activation_bytes == pytest.approx(expected, rel=0.10)
