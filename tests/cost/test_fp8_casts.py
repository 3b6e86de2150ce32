"""Transformer Engine's FP8 quantization kernels (CostOptions `fp8_casts`, planner/cost/fp8_casts.py).

The expected bytes are counted here by hand from the kernels transformer_engine/pytorch/module/
{linear,layernorm_linear,layernorm_mlp,base}.py (v1.0) run around a GPT block's four linears,
element counts written out per tensor; the model's own arithmetic is not reused."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.fp8_casts import block_casts, te_block_casts, te_weight_casts, torchao_block_casts
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.predict import predict
from planner.runtimes import resolve as resolve_runtime
from planner.spec import Cluster
from tests.cost.layouts import even_1f1b

H = 12288  # GPT-3 175B
TOKENS = 2048  # micro-batch 1 x sequence 2048


def test_gpt3_block_under_sequence_parallelism_by_hand():
    """TP 4 with sequence parallelism: each GPU's norms see 512 tokens, its GEMMs 2048."""
    casts = te_block_casts(resolve_model("gpt3-175b"), Shard(mbs=1, seq=TOKENS, tp=4, sequence_parallel=True))
    local = TOKENS // 4
    forward = (
        4 * TOKENS * (H // 4)  # fp8_cast_transpose_fused of the output projection's input (attention heads / 4)
        - 1 * local * H  # the attention LayerNorm writes fp8 (layernorm_fwd_fp8)
        - 1 * local * H  # the MLP LayerNorm writes fp8
        - 1 * TOKENS * (4 * H // 4)  # GeLU writes fp8 (fp8_gelu)
    )
    row_parallel_grad = 3 * local * H + 2 * TOKENS * H + 2 * local * H  # cast, gather, transpose; bias pass
    backward = (
        4 * TOKENS * (3 * H // 4)  # QKV's output gradient: fp8_cast_transpose_bgrad_fused
        + 2 * TOKENS * H  # fp8_transpose of the gathered attention LayerNorm output
        + row_parallel_grad  # the output projection's output gradient
        + row_parallel_grad  # the down projection's output gradient
        + 2 * TOKENS * (4 * H // 4)  # fp8_transpose of GeLU's output
        + 2 * TOKENS * H  # fp8_transpose of the gathered MLP LayerNorm output
        # the up projection's gradient: fp8_cast_transpose_bgrad_dgelu_fused, as bf16's dgelu moves
    )
    assert casts.bytes_fwd == forward
    assert casts.bytes_bwd == backward
    assert (casts.kernels_fwd, casts.kernels_bwd) == (1, 2 + 3 + 2 + 3)


def test_without_sequence_parallelism_the_row_parallel_gradients_take_one_fused_kernel():
    spec = resolve_model("gpt3-175b")
    with_sp = te_block_casts(spec, Shard(mbs=1, seq=TOKENS, tp=4, sequence_parallel=True))
    without = te_block_casts(spec, Shard(mbs=1, seq=TOKENS, tp=4))
    local = TOKENS // 4
    fused, split = 4 * TOKENS * H, 3 * local * H + 2 * TOKENS * H + 2 * local * H
    assert without.bytes_bwd - with_sp.bytes_bwd == 2 * (fused - split)
    assert with_sp.kernels_bwd - without.kernels_bwd == 2 * (3 - 1)


def test_swiglu_casts_the_up_projections_gradient_separately():
    """TE v1.0 fuses only GeLU's backward with the cast: SwiGLU's gradient (2 x ffn wide) is cast
    and transposed by a kernel of its own."""
    spec = resolve_model("llama3-8b")
    shard = Shard(mbs=1, seq=TOKENS, tp=1)
    gelu = te_block_casts(spec.model_copy(update={"activation": "gelu"}), shard)
    swiglu = te_block_casts(spec, shard)
    ffn = spec.ffn_hidden_size
    # beside the extra cast, SwiGLU's down projection input (ffn wide) is what GeLU's is
    assert swiglu.bytes_bwd - gelu.bytes_bwd == 4 * TOKENS * 2 * ffn
    assert swiglu.kernels_bwd - gelu.kernels_bwd == 1


def test_weights_are_cast_and_transposed_once_per_step():
    """4 B per weight of the block's four linears (read 2, write 1 + 1), at TP 8."""
    spec = resolve_model("llama3-8b")
    h, ffn, kv = spec.hidden_size, spec.ffn_hidden_size, spec.num_kv_heads * spec.kv_channels
    weights = (h * (h + 2 * kv) + h * h + h * 2 * ffn + ffn * h) / 8
    assert te_weight_casts(spec, Shard(mbs=1, seq=1, tp=8)) == (4 * weights, 4)


def test_latent_attention_is_not_priced():
    assert te_block_casts(resolve_model("deepseek-v3"), Shard(mbs=1, seq=TOKENS, tp=1)).bytes_bwd == 0


def _predict(precision: str, fp8_casts: str, tp: int = 8, sp: bool = True):
    spec = resolve_model("llama3-70b")
    model = CostModel(
        spec, Cluster.of(resolve_gpu("h100"), tp * 2), CostOptions.of(precision=precision, fp8_casts=fp8_casts)
    )
    layout = even_1f1b(spec, tp=tp, pp=2, micro_batches=8, recompute="full", sp=sp)
    return model, predict(model, layout, 8, 4096)


def test_the_casts_add_their_bytes_to_each_block_and_the_weights_once_per_step():
    model, unpriced = _predict("fp8", "none")
    _, priced = _predict("fp8", "transformer_engine")
    shard = Shard(mbs=1, seq=4096, tp=8, sequence_parallel=True)
    casts = te_block_casts(model.spec, shard)
    per_layer = model.analytic.elementwise_time(casts.bytes_fwd, casts.kernels_fwd) + model.analytic.elementwise_time(
        casts.bytes_bwd, casts.kernels_bwd
    )
    layers = model.spec.num_layers // 2
    # full recompute runs each forward twice
    forward_s = model.analytic.elementwise_time(casts.bytes_fwd, casts.kernels_fwd)
    compute = priced.time_breakdown_s["compute"] - unpriced.time_breakdown_s["compute"]
    assert compute == pytest.approx(8 * layers * (per_layer + forward_s), rel=0.02)
    assert "fp8_weight_casts" not in unpriced.time_breakdown_s
    weights = te_weight_casts(model.spec, shard)[0] * layers
    one_kernel_per_weight = 4 * layers * model.analytic.overhead_s
    expected = weights / model.analytic.mem_bw + one_kernel_per_weight
    assert priced.time_breakdown_s["fp8_weight_casts"] == pytest.approx(expected, rel=0.01)


def test_sequence_parallel_all_gathers_move_one_byte_per_element_under_fp8():
    """The block's all-gathers carry the fp8 copies: TP communication drops; its reduce-scatters
    and, without sequence parallelism, its all-reduces stay bf16."""
    _, unpriced = _predict("fp8", "none")
    _, priced = _predict("fp8", "transformer_engine")
    assert priced.time_breakdown_s["tp_cp_comm"] < unpriced.time_breakdown_s["tp_cp_comm"]
    _, unpriced_ar = _predict("fp8", "none", sp=False)
    _, priced_ar = _predict("fp8", "transformer_engine", sp=False)
    assert priced_ar.time_breakdown_s["tp_cp_comm"] == pytest.approx(unpriced_ar.time_breakdown_s["tp_cp_comm"])


def test_bf16_training_is_unchanged():
    _, te = _predict("bf16", "transformer_engine")
    _, none = _predict("bf16", "none")
    assert te.step_time_s == none.step_time_s


@pytest.mark.parametrize(
    ("runtime", "casts"),
    [
        ("megatron@0.19", "transformer_engine"),
        ("nemo@2024", "transformer_engine"),
        ("torchtitan@0.3", "torchao"),
        ("torch@2.13", "torchao"),
        ("hai-llm@2024", "none"),
    ],
)
def test_runtimes_on_transformer_engine_price_its_casts(runtime, casts):
    """megatron-core and NeMo run FP8 through Transformer Engine, torchtitan and torch through
    torchao's float8; DeepSeek's framework through kernels of its own, which are not priced."""
    assert resolve_runtime(runtime).costs.get("fp8_casts", "transformer_engine") == casts


def test_where_fp8_gemms_take_any_layout_each_operand_is_written_once_and_nothing_is_transposed():
    """Blackwell (compute capability 10.0): Transformer Engine 2.x writes no transposed copy."""
    spec = resolve_model("gpt3-175b")
    shard = Shard(mbs=1, seq=TOKENS, tp=4, sequence_parallel=True)
    casts = te_block_casts(spec, shard, transposes=False)
    local = TOKENS // 4
    forward = 3 * TOKENS * (H // 4) - local * H - local * H - TOKENS * H
    row_parallel_grad = 3 * local * H + 2 * local * H  # cast on the shard, gathered; the bias pass
    backward = 3 * TOKENS * (3 * H // 4) + 2 * row_parallel_grad
    assert (casts.bytes_fwd, casts.bytes_bwd) == (forward, backward)
    assert (casts.kernels_fwd, casts.kernels_bwd) == (1, 1 + 2 + 2)
    assert te_weight_casts(spec, shard, transposes=False)[0] == 3 / 4 * te_weight_casts(spec, shard)[0]


def test_only_blackwell_presets_take_any_fp8_layout():
    layouts = {name: resolve_gpu(name).fp8_gemm_layouts for name in ("h100", "h800", "h200", "h100-96gb", "b200")}
    assert layouts == {"h100": "tn", "h800": "tn", "h200": "tn", "h100-96gb": "tn", "b200": "any"}


def test_torchao_tensorwise_by_hand():
    """torchao's roofline of its compiled float8 kernels (roofline_utils.py at 104f01a): per linear,
    input and output gradient 4 B per element with the amax fused into their producer, 6 B without
    (middle 5); the weight 2 + 3 forward, 3 backward; kernels 3 + 3 forward, 3 + 1 backward."""
    spec = resolve_model("llama3-8b")  # TP 1: one fused QKV, the output, the gate+up, the down
    shard = Shard(mbs=1, seq=TOKENS, tp=1)
    h, ffn, kv = spec.hidden_size, spec.ffn_hidden_size, spec.num_kv_heads * spec.kv_channels
    shapes = [(h, h + 2 * kv), (h, h), (h, 2 * ffn), (ffn, h)]  # (in, out) per linear
    forward = sum(5 * TOKENS * k + 5 * k * n for k, n in shapes)
    backward = sum(5 * TOKENS * n + 3 * k * n for k, n in shapes)
    casts = torchao_block_casts(spec, shard)
    assert (casts.bytes_fwd, casts.bytes_bwd) == (forward, backward)
    assert (casts.kernels_fwd, casts.kernels_bwd) == (4 * 6, 4 * 4)
    assert block_casts("torchao", spec, shard) == casts
    assert block_casts("none", spec, shard).bytes_fwd == 0


def test_torchtitan_fp8_pays_torchaos_casts_and_bf16_does_not():
    spec = resolve_model("llama3-8b")
    layout = even_1f1b(spec, dp=8, micro_batches=1, zero=3)

    def step(precision, fp8_casts):
        options = CostOptions.of(fsdp2=True, precision=precision, fp8_casts=fp8_casts)
        model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 8), options)
        return model, predict(model, layout, 8, 8192)

    model, none = step("fp8", "none")
    _, torchao = step("fp8", "torchao")
    casts = torchao_block_casts(spec, Shard(mbs=1, seq=8192, tp=1))
    per_block = model.analytic.elementwise_time(casts.bytes_fwd, casts.kernels_fwd) + model.analytic.elementwise_time(
        casts.bytes_bwd, casts.kernels_bwd
    )
    added = torchao.time_breakdown_s["compute"] - none.time_breakdown_s["compute"]
    assert added == pytest.approx(spec.num_layers * per_block, rel=0.02)
    assert "fp8_weight_casts" not in torchao.time_breakdown_s  # cast every micro-batch, inside the blocks
    assert step("bf16", "torchao")[1].step_time_s == step("bf16", "none")[1].step_time_s


def test_tensorwise_gpt3_block_under_sequence_parallelism_by_hand():
    """Per-tensor current scaling (TE 2.x Float8CurrentScaling, read at v2.8): every standalone
    cast follows an amax pass over its bf16 input; the LayerNorms and GeLU write bf16 with their
    amax, and a cast follows (on the norm's shard, gathered and transposed as before; GeLU's output
    cast and transposed at once); GeLU's backward is no longer fused with its cast."""
    casts = te_block_casts(
        resolve_model("gpt3-175b"), Shard(mbs=1, seq=TOKENS, tp=4, sequence_parallel=True), recipe="tensorwise"
    )
    local = TOKENS // 4
    forward = (
        (2 + 4) * TOKENS * (H // 4)  # amax pass, then cast-transpose of the output projection's input
        + 3 * local * H  # the attention LayerNorm's bf16 shard cast to fp8 (read 2, write 1) before its gather
        + 3 * local * H  # the MLP LayerNorm's, likewise
        + 4 * TOKENS * (4 * H // 4)  # GeLU's bf16 output cast and transposed (read 2, write 1 + 1)
    )
    row_parallel_grad = (2 + 3) * local * H + 2 * TOKENS * H + 2 * local * H  # amax, cast, gather, transpose; bias
    backward = (
        (2 + 4) * TOKENS * (3 * H // 4)  # QKV's output gradient: amax pass, cast-transpose
        + 2 * TOKENS * H  # transpose of the gathered attention LayerNorm output
        + row_parallel_grad  # the output projection's output gradient
        + row_parallel_grad  # the down projection's output gradient
        + 2 * TOKENS * H  # transpose of the gathered MLP LayerNorm output
        + (2 + 4) * TOKENS * (4 * H // 4)  # dGeLU's bf16 output: amax pass, cast-transpose
    )
    assert casts.bytes_fwd == forward
    assert casts.bytes_bwd == backward
    # forward: output projection input (amax, scale, cast), two norms and GeLU (scale, cast) each
    # backward: QKV and up gradients (amax, scale, cast); two row-parallel gradients (amax, scale,
    # cast, transpose, bias); two norm-output transposes
    assert (casts.kernels_fwd, casts.kernels_bwd) == (3 + 3 * 2, 2 * 3 + 2 * 5 + 2)


def test_tensorwise_without_gathers_casts_the_norm_outputs_with_their_transposes():
    """Without sequence parallelism a norm's output is not gathered: under current scaling it is cast
    and transposed at once after the norm (4 B), with no transpose left for the backward; delayed
    scaling's norm writes fp8 (1 B less than bf16) and transposes it in the backward (2 B)."""
    spec = resolve_model("llama3-8b")
    shard = Shard(mbs=1, seq=TOKENS, tp=1)
    delayed, tensorwise = te_block_casts(spec, shard), te_block_casts(spec, shard, recipe="tensorwise")
    h, ffn, q, kv = spec.hidden_size, spec.ffn_hidden_size, spec.hidden_size, 2 * spec.num_kv_heads * spec.kv_channels
    norms, act = 2 * TOKENS * h, TOKENS * ffn
    assert tensorwise.bytes_fwd - delayed.bytes_fwd == (
        (4 + 1) * norms  # cast-transpose, and the norms write bf16 instead of fp8
        + (4 + 1) * act  # SwiGLU's output likewise
        + 2 * TOKENS * q  # the amax pass before the output projection's input cast
    )
    amax_passes = TOKENS * (q + kv) + TOKENS * 2 * ffn + 2 * TOKENS * h  # QKV, up, output and down gradients
    assert tensorwise.bytes_bwd - delayed.bytes_bwd == 2 * amax_passes - 2 * (norms + act)


def test_tensorwise_weights_take_an_amax_pass_before_their_cast():
    spec = resolve_model("llama3-8b")
    shard = Shard(mbs=1, seq=1, tp=8)
    delayed_bytes, delayed_kernels = te_weight_casts(spec, shard)
    tensorwise_bytes, tensorwise_kernels = te_weight_casts(spec, shard, recipe="tensorwise")
    assert tensorwise_bytes == delayed_bytes * (2 + 4) / 4
    assert tensorwise_kernels == 3 * delayed_kernels


def test_tensorwise_reduces_the_gathered_amaxes_over_the_tensor_parallel_group():
    """Four 4-byte all-reduces per block over TP under sequence parallelism (the two gathered norm
    outputs forward, the two row-parallel output gradients backward), none without it; delayed
    scaling reduces its amaxes once per step, outside the block."""
    from planner.cost.fp8_casts import amax_reductions

    spec = resolve_model("llama3-70b")
    sp = Shard(mbs=1, seq=4096, tp=8, sequence_parallel=True)
    assert amax_reductions(spec, sp, "tensorwise") == 2
    assert amax_reductions(spec, sp, "delayed") == 0
    assert amax_reductions(spec, Shard(mbs=1, seq=4096, tp=8), "tensorwise") == 0
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 16), CostOptions.of(precision="fp8"))
    current = CostModel(
        spec, Cluster.of(resolve_gpu("h100"), 16), CostOptions.of(precision="fp8", fp8_recipe="tensorwise")
    )
    layout = even_1f1b(spec, tp=8, pp=2, micro_batches=8, recompute="none", sp=True)
    delayed_comm = predict(model, layout, 8, 4096).time_breakdown_s["tp_cp_comm"]
    current_comm = predict(current, layout, 8, 4096).time_breakdown_s["tp_cp_comm"]
    per_block = 2 * 2 * model.network.all_reduce(4, 8, 1)
    assert current_comm - delayed_comm == pytest.approx(8 * spec.num_layers // 2 * per_block, rel=1e-6)


def test_unknown_fp8_recipe_is_refused():
    with pytest.raises(ValueError, match="fp8_recipe"):
        CostOptions.of(fp8_recipe="mxfp8")


def test_the_recipe_reaches_the_prediction():
    spec = resolve_model("llama3-70b")
    layout = even_1f1b(spec, tp=8, pp=2, micro_batches=8, recompute="none", sp=True)
    runs = {
        recipe: predict(
            CostModel(spec, Cluster.of(resolve_gpu("h100"), 16), CostOptions.of(precision="fp8", fp8_recipe=recipe)),
            layout,
            8,
            4096,
        ).time_breakdown_s
        for recipe in ("delayed", "tensorwise")
    }
    assert runs["tensorwise"]["compute"] > runs["delayed"]["compute"]
    assert runs["tensorwise"]["fp8_weight_casts"] > runs["delayed"]["fp8_weight_casts"]
