"""FLOP counts against the 6 * N * tokens rule plus the attention term."""

from __future__ import annotations

import pytest

from planner.cost.memory import transformer_param_count
from planner.cost.shapes import Shard, attention_core_flops, layer_work, model_flops_per_token


def matmul_params(spec) -> float:
    """Weights that take part in a matmul, counted from the parameter formulas (not from
    the GEMM list): everything but embedding tables, norms and biases; MoE counts the
    top-k routed experts (the ones a token actually passes through), the shared ones and
    the router, dense layers their own MLP; MLA its down- and up-projections."""
    h, d, a = spec.hidden_size, spec.kv_channels, spec.num_attention_heads
    if spec.kv_lora_rank:
        qk, v = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.v_head_dim
        attn = h * spec.q_lora_rank + spec.q_lora_rank * a * qk + h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        attn += spec.kv_lora_rank * a * (spec.qk_nope_head_dim + v) + a * v * h
    else:
        attn = h * a * d * 2 + 2 * h * spec.num_kv_heads * d
    up = 3 if spec.activation == "swiglu" else 2
    dense = up * h * spec.ffn_hidden_size
    moe = 0
    if spec.is_moe:
        moe = spec.moe_top_k * up * h * spec.expert_ffn_hidden_size + h * spec.num_experts
        moe += up * h * spec.shared_ffn_width
    moe_layers = spec.num_moe_layers
    return spec.num_layers * attn + moe_layers * moe + (spec.num_layers - moe_layers) * dense + spec.vocab_size * h


def test_training_flops_match_six_n_plus_attention(preset):
    seq = 2048
    shard = Shard(mbs=1, seq=seq)
    attention = attention_core_flops(preset, shard, flash=False) * preset.num_layers
    six_n = 6 * matmul_params(preset) * seq
    a = preset.num_attention_heads
    if preset.kv_lora_rank:  # QK^T over nope + rope, AV over v
        twelve_lhs = (
            6
            * preset.num_layers
            * a
            * (preset.qk_nope_head_dim + preset.qk_rope_head_dim + preset.v_head_dim)
            * seq
            * seq
        )
    else:
        twelve_lhs = 12 * preset.num_layers * a * preset.kv_channels * seq * seq
    if preset.num_moe_layers in (0, preset.num_layers):  # every block alike
        gemm = sum(g.flops for g in layer_work(preset, "transformer", shard).gemms) * preset.num_layers
        gemm += sum(g.flops for g in layer_work(preset, "head", shard).gemms)
        assert 3 * gemm == pytest.approx(six_n, rel=1e-3)
    assert 3 * attention == pytest.approx(twelve_lhs, rel=1e-12)
    assert model_flops_per_token(preset, seq) * seq == pytest.approx(six_n + twelve_lhs, rel=1e-3)


def test_flash_attention_executes_half_the_causal_square(preset):
    shard = Shard(mbs=2, seq=4096)
    assert attention_core_flops(preset, shard, flash=True) * 2 == attention_core_flops(preset, shard, flash=False)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_splits_gemm_flops_evenly(tp):
    from planner.catalog import resolve_model

    spec = resolve_model("llama3-70b")
    whole = layer_work(spec, "transformer", Shard(mbs=1, seq=4096)).gemm_flops
    shard = layer_work(spec, "transformer", Shard(mbs=1, seq=4096, tp=tp)).gemm_flops
    assert shard * tp == pytest.approx(whole, rel=1e-9)


def test_context_parallel_splits_attention_flops():
    from planner.catalog import resolve_model

    spec = resolve_model("llama3-8b")
    whole = attention_core_flops(spec, Shard(mbs=1, seq=8192), flash=True)
    assert attention_core_flops(spec, Shard(mbs=1, seq=8192, cp=4), flash=True) * 4 == pytest.approx(whole)


def test_parameter_formulas_agree_with_gemm_shapes(preset):
    """The GEMMs' weight sizes (k * n) add up to the matmul parameters of the block."""
    shard = Shard(mbs=1, seq=128)
    gemms = layer_work(preset, "transformer", shard).gemms
    weights = sum(g.n * g.k * (preset.num_experts if g.name.startswith("expert") else 1) for g in gemms)
    h, d = preset.hidden_size, preset.kv_channels
    norms = 2 * h * (2 if preset.norm == "layernorm" else 1)
    if preset.kv_lora_rank:  # MLA normalises its compressed q and kv
        norms += (preset.q_lora_rank or 0) + preset.kv_lora_rank
    if preset.qk_norm:  # Qwen3's q_norm and k_norm, one head-wide weight each
        norms += 2 * d
    biases = 0
    if preset.qkv_bias:
        biases += (preset.num_attention_heads + 2 * preset.num_kv_heads) * d
    if preset.linear_bias:
        biases += h + preset.ffn_hidden_size + h
    assert transformer_param_count(preset) - weights == norms + biases
