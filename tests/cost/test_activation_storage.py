"""Saved activations under FP8 GEMMs, Megatron-LM's recompute modules, DeepSeek-V3's FP8
activation caching and DualPipe's parameter copies, each against a closed form written from
its source (Transformer Engine's Linear, Megatron-Core's MoE layer, the DeepSeek-V3 report's
sections 3.2.1, 3.2.3 and 3.3.3), not from the planner's tensor list."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.memory import (
    ActivationOptions,
    activation_bytes,
    activation_options_for,
    transformer_param_count,
)
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.fidelity.published import build, cost_options, evaluate_run, load_runs
from planner.layout import Layout, even_stage_layers
from planner.predict import chunk_costs, layout_memory, predict
from planner.schedule import generate, peak_held_counts
from planner.spec import Cluster

DATA = Path(__file__).parents[1] / "bench" / "published_runs.toml"
FLASH = ActivationOptions(flash_attention=True, dropout=False)


def llama_te_bytes(spec, s, b, t, linear_input_bytes, fp8_proj_copy):
    """One Llama block (flash attention, SwiGLU, TP t with sequence parallelism) as Megatron-LM
    with Transformer Engine saves it: the two norms' inputs (bf16) and, per Linear, its input
    (`linear_input_bytes`); q, k, v, the attention output and its log-sum-exp for the flash
    backward; the SwiGLU input (bf16). Under FP8 the output projection keeps its own FP8 copy
    of the attention output beside the attention's bf16 one (`fp8_proj_copy`)."""
    h, a, d, f = spec.hidden_size, spec.num_attention_heads, spec.kv_channels, spec.ffn_hidden_size
    kv = spec.num_kv_heads
    per_rank_token = (2 + linear_input_bytes + 2 + linear_input_bytes) * h / t  # norms' inputs, qkv and fc1 inputs
    per_token = ((a + 2 * kv) * d * 2 + a * d * 2 + a * 4 + (a * d if fp8_proj_copy else 0)) / t
    per_token += (2 * f * 2 + f * linear_input_bytes) / t  # SwiGLU input, fc2's input
    return s * b * (per_rank_token + per_token)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_fp8_gemms_save_each_linear_input_as_one_fp8_copy(tp):
    spec = resolve_model("llama3-70b")
    s, b = 8192, 1
    shard = Shard(mbs=b, seq=s, tp=tp, sequence_parallel=tp > 1)
    bf16 = activation_bytes(spec, "transformer", shard, "none", FLASH)
    fp8 = activation_bytes(spec, "transformer", shard, "none", replace(FLASH, fp8_linear_inputs=True))
    assert bf16 == pytest.approx(llama_te_bytes(spec, s, b, tp, 2, False), rel=1e-12)
    assert fp8 == pytest.approx(llama_te_bytes(spec, s, b, tp, 1, True), rel=1e-12)
    assert fp8 < bf16


def test_fp8_precision_plans_save_fp8_linear_inputs_and_bf16_plans_do_not():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 8)
    shard = Shard(mbs=1, seq=4096)
    bf16 = CostModel(spec, cluster, CostOptions()).layer_costs("transformer", shard).activation_bytes
    fp8 = CostModel(spec, cluster, CostOptions.of(precision="fp8")).layer_costs("transformer", shard).activation_bytes
    assert bf16 == pytest.approx(llama_te_bytes(spec, 4096, 1, 1, 2, False), rel=1e-12)
    assert fp8 == pytest.approx(llama_te_bytes(spec, 4096, 1, 1, 1, True), rel=1e-12)


def test_moe_layer_saves_what_megatron_core_keeps_and_no_combine_buffer():
    """Qwen3-235B's MoE block, bf16, per token on one GPU (TP 1): the attention part as for a
    dense block, and QK-norm's inputs (q and k, bf16) with an fp32 1/rms per head; the router's
    input (bf16) and fp32 scores over E experts; per routed copy on
    the busiest rank (k x imbalance of them) the grouped fc1's input (h), its probability
    (fp32), the SwiGLU input (2f) and fc2's input (f). The combine (unpermute without probs:
    they are applied in the activation) keeps nothing."""
    spec = resolve_model("qwen3-235b-a22b")
    h, a, kv, d = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.kv_channels
    e, k, f = spec.num_experts, spec.moe_top_k, spec.expert_ffn_hidden_size
    s, imbalance = 4096, 1.25
    options = replace(FLASH, moe_imbalance=imbalance)
    got = activation_bytes(spec, "transformer", Shard(mbs=1, seq=s, ep=8), "none", options)
    attention = 2 * h + 2 * h + (a + 2 * kv) * d * 2 + (a + kv) * (d * 2 + 4) + a * d * 2 + a * 4
    mlp = 2 * h + 2 * h + 4 * e + k * imbalance * (2 * h + 4 + 2 * 2 * f + 2 * f)
    assert got == pytest.approx(s * (attention + mlp), rel=1e-12)


@pytest.mark.parametrize("module", ["layernorm", "mla_up_proj", "moe_act"])
def test_each_recompute_module_drops_exactly_its_outputs(module):
    """DeepSeek-V3's block in bf16 at TP 1: "layernorm" drops the two norms' outputs (the
    attention's down-projection input and the MoE input), "mla_up_proj" the up-projections'
    normed latent inputs and q, k, v, "moe_act" the routed experts' SwiGLU output."""
    spec = resolve_model("deepseek-v3")
    s, imbalance = 4096, 1.25
    shard = Shard(mbs=1, seq=s, ep=64)
    options = replace(FLASH, moe_imbalance=imbalance, recompute_modules=frozenset({module}))
    dropped = activation_bytes(spec, "transformer", shard, "none", options) - activation_bytes(
        spec, "transformer", shard, "selective", options
    )
    h, heads = spec.hidden_size, spec.num_attention_heads
    latents = spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    want = {
        "layernorm": 2 * 2 * h,
        "mla_up_proj": 2 * latents + 2 * heads * (2 * qk + spec.v_head_dim),
        "moe_act": 2 * spec.moe_top_k * imbalance * spec.expert_ffn_hidden_size,
    }[module]
    assert dropped == pytest.approx(s * want, rel=1e-12)


def test_default_recompute_modules_keep_the_core_attention_behaviour():
    spec = resolve_model("gpt3-175b")
    shard = Shard(mbs=1, seq=2048)
    unfused = ActivationOptions(flash_attention=False, dropout=True)
    none = activation_bytes(spec, "transformer", shard, "none", unfused)
    selective = activation_bytes(spec, "transformer", shard, "selective", unfused)
    a, s, h = spec.num_attention_heads, 2048, spec.hidden_size
    assert none - selective == pytest.approx(5 * a * s * s, rel=1e-12)  # Korthikanti's 5as/h term
    # with a flash kernel nothing of the core is saved: Korthikanti's 34sh less the two 1-byte
    # dropout masks, plus the kernel's fp32 log-sum-exp per head and token
    assert (
        activation_bytes(spec, "transformer", shard, "selective", FLASH)
        == activation_bytes(spec, "transformer", shard, "none", FLASH)
        == pytest.approx(32 * s * h + 4 * a * s, rel=1e-12)
    )


def deepseek_v3_layer_bytes(spec, s, imbalance):
    """One DeepSeek-V3 MoE block per the report, TP 1, micro-batch 1, with its RMSNorm, MLA
    up-projection and SwiGLU-output recompute (sections 3.2.3, 3.3.3): kept are the block's input
    and the residual before the MoE (bf16, the recomputed norms' inputs), the compressed latents
    (bf16, the recomputed up-projections' input), the attention output once in E5M6 (1.5 B) and
    its fp32 log-sum-exp, the router's fp32 scores, and in FP8 with a 4-byte scale per 128
    values: the dispatched tokens and the routed and shared SwiGLU inputs; the routed copies'
    fp32 probabilities; the shared expert's down-projection input (Megatron's moe_act
    recomputes the routed experts' activation only)."""
    h, heads, e = spec.hidden_size, spec.num_attention_heads, spec.num_experts
    k, f, shared = spec.moe_top_k, spec.expert_ffn_hidden_size, spec.shared_ffn_width
    fp8 = 1 + 4 / 128
    latents = spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim
    routed = k * imbalance
    per_token = (
        2 * h
        + 2 * latents
        + 1.5 * heads * spec.v_head_dim
        + 4 * heads
        + 2 * h
        + 4 * e
        + routed * (fp8 * h + 4 + fp8 * 2 * f)
        + fp8 * 2 * shared
        + fp8 * shared
    )
    return s * per_token


def test_deepseek_fp8_caching_matches_the_reports_list():
    spec = resolve_model("deepseek-v3")
    s, imbalance = 4096, 1.25
    options = activation_options_for(
        "deepseek_fp8",
        True,
        moe_imbalance=imbalance,
        recompute_modules=frozenset({"layernorm", "mla_up_proj", "moe_act"}),
    )
    got = activation_bytes(spec, "transformer", Shard(mbs=1, seq=s, ep=64), "selective", options)
    assert got == pytest.approx(deepseek_v3_layer_bytes(spec, s, imbalance), rel=1e-12)
    bf16_none = activation_bytes(
        spec, "transformer", Shard(mbs=1, seq=s, ep=64), "none", replace(FLASH, moe_imbalance=imbalance)
    )
    assert got < 0.4 * bf16_none


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_dualpipev_holds_pp_plus_one_stages_as_deepseek_table_2(pp):
    """DualPipe's README / DeepSeek-V3 Table 2, "based on the same number of PP stages":
    DualPipeV runs PP stages on PP/2 devices and holds PP + 1 stage activations per device;
    1F1B's first device holds PP."""
    stages = 2 * pp
    for m in (stages, stages + 3, 3 * stages):
        held = peak_held_counts(generate("dualpipev", pp, m, 2), 2)
        assert [max(sum(v) for v in per_rank) for per_rank in held] == [stages + 1] * pp
    one_f_one_b = peak_held_counts(generate("1f1b", pp, 4 * pp, 1), 1)
    assert max(sum(v) for v in one_f_one_b[0]) == pp


def test_parameter_copies_repeat_the_layers_state_not_the_ends():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 32)
    layout = Layout(
        tp=1,
        pp=4,
        dp=8,
        mbs=1,
        num_microbatches=8,
        schedule="1f1b",
        stage_layers=even_stage_layers(spec.num_layers, 4, 1, "1f1b"),
        recompute=("full",) * 4,
        zero_stage=1,
    )
    one, two = (
        layout_memory(
            CostModel(spec, cluster, CostOptions.of(parameter_copies=c)),
            layout,
            chunk_costs(CostModel(spec, cluster, CostOptions.of(parameter_copies=c)), layout, 4096),
            (0.0,) * 4,
        )
        for c in (1, 2)
    )
    per_layer = transformer_param_count(spec)
    for rank in range(4):
        layers = sum(end - start for start, end in layout.stage_layers[rank])
        state = 2 + 4 + 12 / 8  # bf16 weight, fp32 grad, Adam sharded over DP 8 (ZeRO-1)
        extra = (
            two[rank].weights
            + two[rank].grads
            + two[rank].optimizer
            - one[rank].weights
            - one[rank].grads
            - one[rank].optimizer
        )
        assert extra == pytest.approx(layers * per_layer * state, rel=1e-9)


def test_deepseek_v3_published_run_fits_its_80gb_gpus():
    """The report's run (2,048 H800 of 80 GB) ran: with its own memory mechanisms the planner
    must not say it does not fit."""
    run = next(r for r in load_runs(DATA) if r.name == "deepseek-v3-pretrain-2048xh800")
    result = evaluate_run(run)
    assert result.fits, result.peak_memory_gib
    without = evaluate_run(
        run.model_copy(
            update={
                "settings": {
                    **run.settings,
                    "activation_storage": "default",
                    "recompute_modules": ["core_attn"],
                    "parameter_copies": 1,
                }
            }
        )
    )
    assert not without.fits  # what the planner said before these mechanisms
    assert cost_options(run).memory.parameter_copies == 2
    model, layout = build(run)
    assert predict(model, layout, run.global_batch, run.seq).peak_memory_bytes == pytest.approx(
        result.peak_memory_gib * 2**30
    )


def test_pipeline_stage_outputs_are_not_held_as_megatron_deallocates_them():
    """Megatron-LM's training sets `deallocate_pipeline_outputs = True`
    (megatron/training/argument_utils.py) and `deallocate_output_tensor` frees a stage's output
    once sent; Llama 3 (section 3.3.2) deallocates stage inputs and outputs it will not use. A
    middle 1F1B rank r of P then holds P - r micro-batches of its layers' saved tensors and
    nothing per micro-batch beyond them (its input is its first norm's saved input)."""
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 32)
    model = CostModel(spec, cluster, CostOptions())
    pp = 4
    layout = Layout(
        tp=1,
        pp=pp,
        dp=8,
        mbs=1,
        num_microbatches=16,
        schedule="1f1b",
        stage_layers=even_stage_layers(spec.num_layers, pp, 1, "1f1b"),
        recompute=("none",) * pp,
        zero_stage=1,
    )
    memory = predict(model, layout, 128, 4096).memory
    block = activation_bytes(spec, "transformer", Shard(mbs=1, seq=4096), "none", FLASH)
    for rank in (1, 2):
        layers = sum(end - start for start, end in layout.stage_layers[rank])
        assert memory[rank].activations == pytest.approx((pp - rank) * layers * block, rel=1e-12)
