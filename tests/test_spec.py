"""Model and GPU specs: presets, Hugging Face configs, validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import gpu_presets, model_presets, resolve_gpu, resolve_model
from planner.errors import ConfigError, LayoutError, UnknownPresetError
from planner.spec import Cluster

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "models"

REQUIRED_MODELS = {"llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mistral-7b", "qwen2.5-72b"}
REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100", "h200", "b200", "mi300x"}


def test_required_presets_exist():
    assert set(model_presets()) >= REQUIRED_MODELS
    assert set(gpu_presets()) >= REQUIRED_GPUS
    tiny = [m for m in model_presets().values() if m.published_params is None]
    assert len(tiny) >= 2


@pytest.mark.parametrize(
    "name",
    ["llama3-8b", "mistral-7b", "qwen2.5-72b", "mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"],
)
def test_hf_config_matches_preset(name):
    from_file = resolve_model(str(EXAMPLES / name / "config.json"))
    preset = resolve_model(name)
    fields = [
        "family",
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "kv_channels",
        "ffn_hidden_size",
        "vocab_size",
        "tie_embeddings",
        "qkv_bias",
        "num_experts",
        "moe_top_k",
        "expert_ffn_hidden_size",
        "num_shared_experts",
        "shared_ffn_width",
        "first_dense_layers",
        "moe_layer_freq",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "mtp_depth",
        "norm",
        "norm_eps",
        "activation",
        "rope_theta",
        "rope_scaling",
        "rotary_percent",
        "qk_norm",
        "sliding_window",
        "linear_bias",
        "moe_score_function",
        "moe_norm_topk_prob",
        "moe_routed_scaling_factor",
        "moe_router_num_groups",
        "moe_router_group_topk",
        "moe_router_group_score",
        "moe_router_expert_bias",
        "moe_shared_expert_gate",
    ]
    assert {f: getattr(from_file, f) for f in fields} == {f: getattr(preset, f) for f in fields}
    assert from_file.name == name


def test_hf_config_hyperparameters_beyond_the_shapes():
    """What a runtime needs to build the same network, as the configs state it: Llama 3's RoPE
    base, Qwen3's QK-norm and epsilon, Mistral's window, DeepSeek-V3's YaRN and router."""
    llama, qwen3, mistral, deepseek = (
        resolve_model(str(EXAMPLES / name)) for name in ("llama3-8b", "qwen3-30b-a3b", "mistral-7b", "deepseek-v3")
    )
    assert (llama.rope_theta, llama.norm_eps, llama.qk_norm, llama.rope_scaling) == (500000.0, 1e-5, False, None)
    assert (qwen3.rope_theta, qwen3.norm_eps, qwen3.qk_norm, qwen3.moe_norm_topk_prob) == (1e6, 1e-6, True, True)
    assert mistral.sliding_window == 4096
    yarn = deepseek.rope_scaling
    assert (yarn.rope_type, yarn.factor, yarn.original_max_position_embeddings, yarn.mscale_all_dim) == (
        "yarn",
        40,
        4096,
        1.0,
    )
    assert (
        deepseek.moe_score_function,
        deepseek.moe_routed_scaling_factor,
        deepseek.moe_router_num_groups,
        deepseek.moe_router_group_topk,
        deepseek.moe_router_expert_bias,
    ) == ("sigmoid", 2.5, 8, 4, True)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_scaling type 'longrope'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_hf_config_features_the_planner_does_not_model_are_refused(tmp_path, change, words):
    config = json.loads((EXAMPLES / "qwen3-30b-a3b" / "config.json").read_text()) | change
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=words):
        resolve_model(str(path))


def test_llama31_rope_scaling_is_read(tmp_path):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text()) | {"rope_scaling": scaling}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert resolve_model(str(path)).rope_scaling.model_dump() == resolve_model("llama3-405b").rope_scaling.model_dump()


def test_gpt2_config_reads_gpt_keys():
    spec = resolve_model(str(EXAMPLES / "gpt2" / "config.json"))
    assert (spec.family, spec.num_layers, spec.hidden_size, spec.num_attention_heads) == ("gpt", 12, 768, 12)
    assert spec.ffn_hidden_size == 4 * 768  # n_inner null means 4 * n_embd
    assert spec.max_position_embeddings == 1024 and spec.tie_embeddings
    from planner.cost.memory import total_param_count

    assert total_param_count(spec) == pytest.approx(124.44e6, rel=0.001)  # GPT-2 small


def test_config_failing_validation_names_the_field(tmp_path):
    bad = json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text())
    bad["num_key_value_heads"] = 5  # 32 heads are not a multiple of 5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="num_attention_heads"):
        resolve_model(str(path))
    bad["hidden_size"] = -1
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="field 'hidden_size'"):
        resolve_model(str(path))


def test_missing_required_key_is_named(tmp_path):
    config = json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text())
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        resolve_model(str(path))


def test_unknown_names():
    with pytest.raises(UnknownPresetError, match="llama3-8b"):
        resolve_model("llama9")
    with pytest.raises(UnknownPresetError, match="h100"):
        resolve_gpu("tpu")


def test_cluster_must_fill_nodes():
    with pytest.raises(LayoutError, match="whole nodes"):
        Cluster.of(resolve_gpu("h100"), 12)
    assert Cluster.of(resolve_gpu("h100"), 4).gpus_per_node == 4
    assert Cluster.of(resolve_gpu("h100"), 64).num_nodes == 8


def test_gpu_presets_have_datasheet_peaks(gpu):
    assert gpu.peak_tflops["bf16"] >= gpu.peak_tflops["tf32"] > gpu.peak_tflops["fp32"]
    assert 0 < gpu.efficiency.gemm <= 1
