"""MoE and MLA parameter counts against the model authors' published totals and active
counts, and against closed forms written out here from the Hugging Face configs."""

from __future__ import annotations

import pytest

from planner.catalog import model_presets
from planner.cost.memory import active_param_count, mtp_param_count, total_param_count, transformer_param_count
from planner.spec import ModelSpec

MOE = ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"]


@pytest.mark.parametrize("name", MOE)
def test_total_and_active_match_the_published_sizes(name):
    spec = model_presets()[name]
    # published figures are rounded to 3 significant digits (1 for the small active counts)
    assert total_param_count(spec) == pytest.approx(spec.published_params, rel=0.005)
    assert active_param_count(spec) == pytest.approx(spec.published_active_params, rel=0.03)


def test_deepseek_v3_closed_form():
    """Written out from deepseek-ai/DeepSeek-V3 config.json: MLA attention, 3 dense layers of
    width 18432, 58 MoE layers of 256 routed + 1 shared expert of width 2048, untied vocab."""
    h, L, vocab = 7168, 61, 129280
    q = h * 1536 + 1536 + 1536 * 128 * (128 + 64)
    kv = h * (512 + 64) + 512 + 512 * 128 * (128 + 128)
    attention = q + kv + 128 * 128 * h + 2 * h  # o_proj, two norms
    expert = 3 * h * 2048
    dense = 3 * h * 18432
    moe = 256 * expert + expert + 256 * h  # routed, shared, router
    total = L * attention + 3 * dense + 58 * moe + 2 * vocab * h + h
    active = L * attention + 3 * dense + 58 * (9 * expert + 256 * h) + 2 * vocab * h + h
    spec = model_presets()["deepseek-v3"]
    assert total_param_count(spec) == total
    assert active_param_count(spec) == active
    assert round(total / 1e9) == 671 and active / 1e9 == pytest.approx(37, rel=0.02)  # the report: 671B / 37B
    # MTP: three norms (enorm, hnorm, the shared head's), the 2h -> h projection and one MoE
    # block (embedding and head weights shared)
    assert mtp_param_count(spec) == 3 * h + 2 * h * h + attention + moe


def test_mixtral_closed_form():
    h, ffn, L = 4096, 14336, 32
    attention = h * (4096 + 2 * 1024) + 4096 * h
    block = attention + 8 * 3 * h * ffn + 8 * h + 2 * h
    spec = model_presets()["mixtral-8x7b"]
    assert total_param_count(spec) == L * block + 2 * 32000 * h + h
    assert active_param_count(spec) == L * (block - 6 * 3 * h * ffn) + 2 * 32000 * h + h


def test_experts_shard_over_ep_and_etp():
    spec = model_presets()["qwen3-30b-a3b"]
    whole = transformer_param_count(spec, tp=1, ep=1, etp=1)
    routed = 128 * 3 * 2048 * 768
    assert transformer_param_count(spec, tp=1, ep=8, etp=1) == whole - routed + routed / 8
    assert transformer_param_count(spec, tp=1, ep=4, etp=2) == whole - routed + routed / 8
    # etp unset is tp (Megatron's default): the old all-experts-split-by-TP count
    assert transformer_param_count(spec, tp=2) == transformer_param_count(spec, tp=2, ep=1, etp=2)


def test_layer_pattern():
    spec = model_presets()["deepseek-v3"]
    assert [spec.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert spec.num_moe_layers == 58
    every_other = ModelSpec(
        family="llama",
        num_layers=8,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=128,
        vocab_size=100,
        max_position_embeddings=64,
        num_experts=4,
        moe_top_k=1,
        moe_layer_freq=2,
    )
    assert every_other.num_moe_layers == 4 and every_other.is_moe_layer(1) and not every_other.is_moe_layer(0)
