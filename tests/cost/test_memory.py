"""Parameter counts against published sizes; activations against Korthikanti et al. 2022."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_model
from planner.cost.memory import (
    ActivationOptions,
    activation_bytes,
    state_bytes_per_param,
    total_param_count,
)
from planner.cost.shapes import Shard


def test_parameter_count_matches_published_size(preset):
    if preset.published_params is None:
        pytest.skip("test model without a published size")
    assert total_param_count(preset) == pytest.approx(preset.published_params, rel=0.01)


KORTHIKANTI = ActivationOptions(flash_attention=False, dropout=True)


def korthikanti_bytes(s, b, h, a, t, *, sp, recompute):
    """Table 2 of Korthikanti et al. 2022, activation bytes of one GPT layer."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    if recompute == "selective":
        return s * b * h * (34 / t if sp else 10 + 24 / t)
    if sp:
        return s * b * h / t * (34 + 5 * a * s / h)
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


@pytest.mark.parametrize("model", ["gpt3-175b", "tiny-gpt"])
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpt_layer_activations_match_korthikanti(model, tp, sp, recompute):
    spec = resolve_model(model)
    if spec.num_attention_heads % tp:
        pytest.skip("tp must divide the heads")
    s, b = 2048 if model == "gpt3-175b" else 256, 2
    shard = Shard(mbs=b, seq=s, tp=tp, sequence_parallel=sp)
    got = activation_bytes(spec, "transformer", shard, recompute, KORTHIKANTI)
    want = korthikanti_bytes(s, b, spec.hidden_size, spec.num_attention_heads, tp, sp=sp, recompute=recompute)
    assert got == pytest.approx(want, rel=1e-12)


def test_flash_attention_drops_the_quadratic_term():
    spec = resolve_model("gpt3-175b")
    small, large = Shard(mbs=1, seq=2048), Shard(mbs=1, seq=8192)
    flash = ActivationOptions(flash_attention=True, dropout=False)
    ratio = activation_bytes(spec, "transformer", large, "none", flash) / activation_bytes(
        spec, "transformer", small, "none", flash
    )
    assert ratio == pytest.approx(4.0, rel=0.01)  # linear in sequence length


def test_llama_layer_activations_by_tensor():
    """Llama-3-8B block with flash attention, one sequence of s tokens, no TP, in units of
    s*h bytes: norm inputs and outputs 2+2+2+2, Q/K/V 2*(1 + 2*8/32), attention output 2,
    SwiGLU gate+up 4*f/h and its output 2*f/h; plus fp32 softmax statistics 4*a per token."""
    spec = resolve_model("llama3-8b")
    s, h, f, a = 4096, spec.hidden_size, spec.ffn_hidden_size, spec.num_attention_heads
    expected_per_token = h * (8 + 2 * 1.5 + 2) + 6 * f + 4 * a
    got = activation_bytes(spec, "transformer", Shard(mbs=1, seq=s), "none")
    assert got == pytest.approx(s * expected_per_token)


def test_distributed_optimizer_bytes_match_megatron_docs():
    """Megatron-LM docs: 18 bytes/param without, 6 + 12/d with the distributed optimizer."""
    full = state_bytes_per_param(0, 8)
    assert full.weights + full.grads + full.optimizer == 18
    sharded = state_bytes_per_param(1, 8)
    assert sharded.weights + sharded.grads + sharded.optimizer == pytest.approx(6 + 12 / 8)
