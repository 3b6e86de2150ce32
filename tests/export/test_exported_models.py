"""The exported model is the model: every preset and every examples/models config.json,
exported to each runtime and built by that runtime on the meta device at its real size, is
compared with the source config field by field, and its parameters with planner's own count
(planner/cost/memory.py: total_param_count, plus mtp_param_count where the runtime builds the
multi-token-prediction modules).

- Megatron-LM: the exported arguments through Megatron's parse_args / validate_args /
  TransformerConfig, then megatron-core's GPTModel from its local (non-Transformer-Engine)
  layer specs, with the vocabulary Megatron pads the null tokenizer's to.
- torchtitan: the recipe through torchtitan's ConfigManager, its model config, the model built.
- torch: the exported training script imported, its BlockConfig and `build_full_model`.
- DeepSpeed: the exported pipeline module imported, its BlockConfig and blocks.

RoPE is compared by its frequencies (and YaRN's magnitude and softmax scale), each runtime's
own tables against planner/torch_blocks.py's. An exporter may refuse a model, but only as
REFUSED says, the refusal naming the features its runtime cannot express, on one line.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import pytest
from export_helpers import imported, make_plan, write_files
from test_megatron import megatron, megatron_validate  # noqa: F401 (megatron: the fixture)

from planner.catalog import model_presets, resolve_model
from planner.cost.memory import mtp_param_count, total_param_count
from planner.errors import ExportError
from planner.export import export_deepspeed, export_megatron, export_torch, export_torchtitan
from planner.export.megatron import vocab_divisor
from planner.spec import ModelSpec

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples" / "models"
MODELS = sorted(model_presets()) + sorted(f"examples/models/{folder.name}" for folder in EXAMPLES.iterdir())
"""Every preset, and every example config.json (by its folder)."""

REFUSED = [
    ("megatron", r"bloom-176b.*", "uses ALiBi positions"),
    (
        "torchtitan",
        r"bloom-176b.*",
        (
            "it has LayerNorm, a gelu MLP, alibi positions, QKV biases, MLP and output "
            "biases, a norm after the embedding"
        ),
    ),
    (
        "torchtitan",
        r"gpt2|gpt3-175b|megatron-gpt-.*|tiny-gpt",
        ("it has LayerNorm, a gelu MLP, learned positions, QKV biases, MLP and output biases"),
    ),
    ("torchtitan", r"mpt-.*", "it has LayerNorm, a gelu MLP, learned positions"),
    ("torchtitan", r"nemotron4-340b", "it has LayerNorm, a squared_relu MLP"),
    ("torchtitan", r"qwen2\.5-72b", "it has QKV biases"),
    (
        "torch",
        r"deepseek-v3",
        ("has latent attention, multi-token prediction, group-limited routing, a routing expert bias"),
    ),
    ("deepspeed", r"deepseek-v3|mixtral-.*|qwen3-.*|tiny-moe", "is a mixture of experts"),
]
"""(runtime, model names, the features the refusal names): every refusal these tests accept."""


def source(name: str) -> ModelSpec:
    """The model of a preset name or an examples/models folder."""
    return resolve_model(str(EXAMPLES.parent.parent / name) if name.startswith("examples/") else name)


def plan_of(name: str, pp: int = 1):
    """A one-plan file for model `name`: one GPU per stage, `pp` stages, the sequence its
    positions and attention window allow (4096 at most)."""
    spec = source(name)
    seq = min(
        4096,
        spec.sliding_window or 4096,
        spec.max_position_embeddings if spec.position_embedding == "learned" else 4096,
    )
    half = spec.num_layers // 2
    stages = [[0, spec.num_layers]] if pp == 1 else [[0, half], [half, spec.num_layers]]
    plan_file = make_plan(pp=pp, stage_layers=stages, seq=seq, num_microbatches=pp)
    return plan_file.model_copy(update={"model": spec})


def exported(runtime: str, export, plan_file) -> dict[str, str] | None:
    """The exporter's files, or None where REFUSED expects a refusal (checked: one line,
    naming the features)."""
    name = plan_file.model.name
    words = next((w for r, pattern, w in REFUSED if r == runtime and re.fullmatch(pattern, name)), None)
    if words is None:
        return export(plan_file)
    with pytest.raises(ExportError, match=re.escape(words)) as refused:
        export(plan_file)
    assert "\n" not in str(refused.value)
    return None


def rope_reference(spec: ModelSpec, rotary_dim: int) -> tuple[torch.Tensor, float]:
    """(frequencies, cos/sin magnitude) of the model's RoPE over `rotary_dim` channels, from
    planner/torch_blocks.py's tables (the angle and length at positions 1 and 0)."""
    from planner.torch_blocks import rope_tables

    scaling = spec.rope_scaling.model_dump() if spec.rope_scaling else None
    cos, sin = rope_tables(rotary_dim, 2, spec.rope_theta, scaling)
    return torch.atan2(sin[1], cos[1]), float(cos[0, 0])


def yarn_softmax_scale(spec: ModelSpec, head_dim: int) -> float:
    """The attention's softmax scale with YaRN: 1/sqrt(d) x (0.1 mscale_all_dim ln(factor) + 1)^2."""
    scaling = spec.rope_scaling
    mscale = 0.1 * scaling.mscale_all_dim * math.log(scaling.factor) + 1.0 if scaling else 1.0
    return mscale * mscale / math.sqrt(head_dim)


def split(fields: dict[str, tuple]) -> tuple[dict, dict]:
    """{name: (built, expected)} as ({name: built}, {name: expected}), for one comparison."""
    return {k: v[0] for k, v in fields.items()}, {k: v[1] for k, v in fields.items()}


def param_count(model: torch.nn.Module) -> int:
    """Parameters of `model`, a tied tensor once."""
    return sum(p.numel() for p in model.parameters())


# ---- Megatron-LM ----


@pytest.fixture(scope="module")
def megatron_core(request):
    """tests/export/test_megatron.py's `megatron` fixture: Megatron-LM's argument module,
    parallel state and layer placement functions."""
    return request.getfixturevalue("megatron")


@pytest.fixture(scope="module")
def megatron_groups(megatron_core, tmp_path_factory):
    """A one-rank process group and megatron-core's model-parallel groups (all of size 1),
    which its layers read their parallel sizes from."""
    import torch.distributed as dist

    parallel_state = megatron_core[1]
    store = tmp_path_factory.mktemp("process_group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


class _CoreAttention(torch.nn.Module):
    """Stand-in for latent attention's core attention, which holds no parameters: megatron-core
    0.19's local DotProductAttention takes no `k_channels`, so MLA builds only with Transformer
    Engine's, which does not install on a CPU machine."""

    def __init__(self, *args, **kwargs):
        super().__init__()


def megatron_model(megatron_core, plan_file, tmp_path, monkeypatch):
    """megatron-core's GPT model of the exported arguments on the meta device, as
    pretrain_gpt.py builds it, with its config and arguments."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    args, config = megatron_validate(megatron_core, plan_file, tmp_path, monkeypatch)
    # CPU stand-ins, none of which changes a parameter: Apex's persistent LayerNorm kernel and
    # fused weight-gradient accumulation and the all-to-all dispatcher's CUDA stream are GPU-only;
    # weights are made on the CPU path (then meta) and left uninitialised; latent attention builds
    # its YaRN tables on the current CUDA device, here the CPU.
    config.persist_layer_norm = config.gradient_accumulation_fusion = config.perform_initialization = False
    config.use_cpu_initialization = True
    config.moe_token_dispatcher_type = "allgather"
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    if args.num_experts:
        layers = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=args.normalization, vp_stage=None
        )
        layer_specs = layers.layer_specs
    else:
        layers = get_gpt_layer_local_spec(
            args.num_experts,
            args.moe_grouped_gemm,
            args.qk_layernorm,
            args.multi_latent_attention,
            normalization=args.normalization,
        )
        layer_specs = [layers]
    if args.multi_latent_attention:
        for layer in layer_specs:
            layer.submodules.self_attention.submodules.core_attention = _CoreAttention
    mtp = get_gpt_mtp_block_spec(config, layers, use_transformer_engine=False) if args.mtp_num_layers else None
    with torch.device("meta"):
        model = GPTModel(
            config=config,
            transformer_layer_spec=layers,
            mtp_block_spec=mtp,
            vocab_size=vocab_size_with_padding(args.vocab_size, args, logging_enabled=False),
            max_sequence_length=args.max_position_embeddings,
            pre_process=True,
            post_process=True,
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type,
            rotary_percent=args.rotary_percent,
            rotary_base=args.rotary_base,
            rope_scaling=args.use_rope_scaling,
            rope_scaling_factor=args.rope_scaling_factor,
        )
    return model, config


def megatron_fields(spec: ModelSpec, model, config) -> dict[str, tuple]:
    """{field: (Megatron's, the model's)} of everything the model specifies."""
    from megatron.core.activations import squared_relu

    activation = {"swiglu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "squared_relu": squared_relu}[
        spec.activation
    ]
    fields = {
        "layers": (config.num_layers, spec.num_layers),
        "hidden": (config.hidden_size, spec.hidden_size),
        "heads": (config.num_attention_heads, spec.num_attention_heads),
        "ffn": (config.ffn_hidden_size, spec.ffn_hidden_size),
        "norm": (config.normalization, {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[spec.norm]),
        "norm eps": (config.layernorm_epsilon, spec.norm_eps),
        "gated MLP": (config.gated_linear_unit, spec.activation == "swiglu"),
        "activation": (config.activation_func, activation),
        "qk norm (MLA: its latents' norms)": (config.qk_layernorm, spec.qk_norm or spec.is_mla),
        "linear biases": (config.add_bias_linear, spec.linear_bias),
        "qkv bias": (config.add_qkv_bias or config.add_bias_linear, spec.qkv_bias),
        "tied embeddings": (model.share_embeddings_and_output_weights, spec.tie_embeddings),
        "vocab (Megatron's padded size)": (model.embedding.word_embeddings.weight.shape[0], spec.vocab_size),
        "positions": (
            model.position_embedding_type,
            "rope" if spec.position_embedding == "rope" else "learned_absolute",
        ),
        "mtp depth": (config.mtp_num_layers or 0, spec.mtp_depth),
    }
    if spec.position_embedding == "learned":
        fields["learned positions"] = (
            model.embedding.position_embeddings.weight.shape[0],
            spec.max_position_embeddings,
        )
    if spec.is_mla:
        fields |= {
            "latent ranks": ((config.q_lora_rank, config.kv_lora_rank), (spec.q_lora_rank, spec.kv_lora_rank)),
            "head widths": (
                (config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim),
                (spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim),
            ),
        }
    else:
        fields |= {
            "kv heads": (config.num_query_groups or config.num_attention_heads, spec.num_kv_heads),
            "head dim": (config.kv_channels, spec.kv_channels),
        }
    if spec.is_moe:
        fields |= megatron_moe_fields(spec, config)
    return fields


def megatron_moe_fields(spec: ModelSpec, config) -> dict[str, tuple]:
    """{field: (Megatron's, the model's)} of the experts and their router."""
    pattern = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else [1] * spec.num_layers
    return {
        "experts": (config.num_moe_experts, spec.num_experts),
        "top-k": (config.moe_router_topk, spec.moe_top_k),
        "expert ffn": (config.moe_ffn_hidden_size, spec.expert_ffn_hidden_size),
        "shared ffn": (config.moe_shared_expert_intermediate_size or 0, spec.shared_ffn_width),
        "MoE layers": (pattern, [int(spec.is_moe_layer(i)) for i in range(spec.num_layers)]),
        "score function": (config.moe_router_score_function, spec.moe_score_function),
        "softmax before top-k (no renormalisation)": (
            config.moe_router_pre_softmax,
            spec.moe_score_function == "softmax" and not spec.moe_norm_topk_prob,
        ),
        "routed scaling": (config.moe_router_topk_scaling_factor or 1.0, spec.moe_routed_scaling_factor),
        "groups": (
            (config.moe_router_num_groups, config.moe_router_group_topk),
            (spec.moe_router_num_groups, spec.moe_router_group_topk),
        ),
        "expert bias": (config.moe_router_enable_expert_bias, spec.moe_router_expert_bias),
        "shared expert gate": (config.moe_shared_expert_gate, spec.moe_shared_expert_gate),
    }


def check_megatron_rope(spec: ModelSpec, model) -> None:
    """Megatron's RoPE frequencies (and YaRN's magnitude and softmax scale) against the model's."""
    if spec.is_mla:
        attention = model.decoder.layers[0].self_attention
        rotary = attention.rotary_pos_emb
        angles = rotary.get_emb(2)
        angles, magnitude = angles if isinstance(angles, tuple) else (angles, 1.0)
        frequencies = angles[1].flatten()[: spec.qk_rope_head_dim // 2]
        want, want_magnitude = rope_reference(spec, spec.qk_rope_head_dim)
        assert magnitude == pytest.approx(want_magnitude)
        qk_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        assert attention.softmax_scale == pytest.approx(yarn_softmax_scale(spec, qk_head))
    else:
        frequencies = model.rotary_pos_emb.inv_freq
        want, _ = rope_reference(spec, int(spec.kv_channels * spec.rotary_percent))
    torch.testing.assert_close(frequencies.float().cpu(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", MODELS)
def test_megatron_builds_the_model(name, megatron_core, megatron_groups, tmp_path, monkeypatch):
    plan_file = plan_of(name)
    spec = plan_file.model
    if exported("megatron", export_megatron, plan_file) is None:
        return
    model, config = megatron_model(megatron_core, plan_file, tmp_path, monkeypatch)
    built, expected = split(megatron_fields(spec, model, config))
    assert built == expected
    if spec.position_embedding == "rope":
        check_megatron_rope(spec, model)
    assert param_count(model) == total_param_count(spec) + mtp_param_count(spec)


@pytest.mark.parametrize(
    "vocab, tp, padded",
    [(50257, 1, 50257), (50257, 2, 50258), (151936, 8, 151936), (128256, 8, 128256), (51200, 8, 51200)],
)
def test_megatron_pads_the_vocabulary_only_where_tp_does_not_divide_it(vocab, tp, padded, megatron_core):
    """Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by x tp: the
    exported divisor leaves it as the model has it unless tp does not divide it, and then pads
    it to the next multiple of tp (GPT-2's 50257 at tp 2: one row)."""
    from argparse import Namespace

    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    args = Namespace(make_vocab_size_divisible_by=vocab_divisor(vocab, tp), tensor_model_parallel_size=tp, rank=0)
    assert vocab_size_with_padding(vocab, args, logging_enabled=False) == padded


# ---- torchtitan ----


@pytest.fixture
def load_recipe(tmp_path, monkeypatch):
    """Export a plan and load it the way `torchtitan.train` does (module path + function)."""
    from torchtitan.config import ConfigManager

    def load(files):
        folder = write_files(files, tmp_path / "titan")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.chdir(folder)
        sys.modules.pop("planner_recipe", None)
        return ConfigManager().parse_args(["--module", "planner_recipe", "--config", "planner_plan"])

    return load


def norm_eps_values(config) -> set[float]:
    """The epsilons of every RMSNorm config under torchtitan's model config."""
    from torchtitan.models.common import RMSNorm

    if isinstance(config, RMSNorm.Config):
        return {config.eps}
    if isinstance(config, list):
        return set().union(*(norm_eps_values(item) for item in config))
    if dataclasses.is_dataclass(config):
        return set().union(*(norm_eps_values(getattr(config, f.name)) for f in dataclasses.fields(config)))
    return set()


def torchtitan_fields(spec: ModelSpec, model) -> dict[str, tuple]:
    """{field: (torchtitan's, the model's)} of everything the model specifies."""
    attention = model.layers[0].attention
    dense = (
        next(layer for layer in model.layers if layer.feed_forward is not None)
        if any(layer.feed_forward is not None for layer in model.layers)
        else None
    )
    fields = {
        "layers": (len(model.layers), spec.num_layers),
        "hidden": (model.dim, spec.hidden_size),
        "heads": (attention.n_heads, spec.num_attention_heads),
        "vocab": (model.vocab_size, spec.vocab_size),
        "tied embeddings": (model.enable_weight_tying, spec.tie_embeddings),
        "norm eps (every RMSNorm)": (norm_eps_values(model), {spec.norm_eps}),
        "mtp depth": (len(getattr(model, "mtp_layers", None) or []), spec.mtp_depth),
    }
    if dense is not None:
        fields["ffn"] = (dense.feed_forward.w1.out_features, spec.ffn_hidden_size)
    if spec.is_mla:
        fields |= {
            "latent ranks": (
                (attention.q_lora_rank or None, attention.kv_lora_rank),
                (spec.q_lora_rank, spec.kv_lora_rank),
            ),
            "head widths": (
                (attention.qk_nope_head_dim, attention.qk_rope_head_dim, attention.v_head_dim),
                (spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim),
            ),
        }
    else:
        fields |= {
            "kv heads": (attention.n_kv_heads, spec.num_kv_heads),
            "head dim": (attention.head_dim, spec.kv_channels),
            "qk norm": (
                attention.qk_norm is not None and attention.qk_norm.normalized_shape,
                spec.qk_norm and spec.kv_channels,
            ),
        }
    if spec.is_moe:
        fields |= torchtitan_moe_fields(spec, model)
    return fields


def torchtitan_moe_fields(spec: ModelSpec, model) -> dict[str, tuple]:
    """{field: (torchtitan's, the model's)} of the experts and their router."""
    moe = next(layer.moe for layer in model.layers if layer.moe is not None)
    router, shared = moe.router, moe.shared_experts
    return {
        "MoE layers": (
            [layer.moe is not None for layer in model.layers],
            [spec.is_moe_layer(i) for i in range(spec.num_layers)],
        ),
        "experts": (moe.num_experts, spec.num_experts),
        "top-k": (router.top_k, spec.moe_top_k),
        "expert ffn": (moe.routed_experts.inner_experts.hidden_dim, spec.expert_ffn_hidden_size),
        "shared ffn": (shared.w1.out_features if shared is not None else 0, spec.shared_ffn_width),
        "score function": (router.score_func, spec.moe_score_function),
        "renormalised top-k": (router.route_norm, spec.moe_norm_topk_prob),
        "routed scaling": (router.route_scale, spec.moe_routed_scaling_factor),
        "groups": (
            (router.num_expert_groups, router.num_limited_groups),
            (spec.moe_router_num_groups, spec.moe_router_group_topk),
        ),
        "expert bias": (moe.load_balance_coeff is not None, spec.moe_router_expert_bias),
    }


def check_torchtitan_rope(spec: ModelSpec, model) -> None:
    """torchtitan's RoPE frequencies (and with latent attention its softmax scale) against the model's."""
    attention = model.layers[0].attention
    rope = dataclasses.replace(attention.rope, max_seq_len=2).build()
    if rope.cache.is_complex():  # ComplexRoPE: cis(position x frequency)
        frequencies = rope.cache[1].angle()
    else:  # CosSinRoPE: [cos, cos, sin, sin] of position x frequency, each half of the head wide
        half = attention.rope.dim // 2
        frequencies = torch.atan2(rope.cache[1, 2 * half : 3 * half], rope.cache[1, :half])
    want, _ = rope_reference(spec, attention.rope.dim)
    torch.testing.assert_close(frequencies, want, rtol=1e-5, atol=1e-7)
    if spec.is_mla:
        with torch.device("meta"):
            built = attention.build()
        assert built.softmax_scale == pytest.approx(
            yarn_softmax_scale(spec, spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        )


@pytest.mark.parametrize("name", MODELS)
def test_torchtitan_builds_the_model(name, load_recipe):
    plan_file = plan_of(name)
    spec = plan_file.model
    files = exported("torchtitan", export_torchtitan, plan_file)
    if files is None:
        return
    config = load_recipe(files)
    model = config.model_spec.model
    built, expected = split(torchtitan_fields(spec, model))
    assert built == expected
    check_torchtitan_rope(spec, model)
    with torch.device("meta"):
        assert param_count(model.build()) == total_param_count(spec) + mtp_param_count(spec)


# ---- the torch script and DeepSpeed's module (planner/torch_blocks.py) ----


def block_fields(spec: ModelSpec, cfg) -> dict[str, tuple]:
    """{field: (the blocks', the model's)} of everything the model specifies."""
    fields = {
        "layers": (cfg.num_layers, spec.num_layers),
        "hidden": (cfg.hidden_size, spec.hidden_size),
        "heads": (cfg.num_heads, spec.num_attention_heads),
        "kv heads": (cfg.num_kv_heads, spec.num_kv_heads),
        "head dim": (cfg.head_dim, spec.kv_channels),
        "ffn": (cfg.ffn_hidden_size, spec.ffn_hidden_size),
        "vocab": (cfg.vocab_size, spec.vocab_size),
        "norm": ((cfg.norm, cfg.norm_eps), (spec.norm, spec.norm_eps)),
        "activation": (cfg.activation, spec.activation),
        "positions": (cfg.position_embedding, spec.position_embedding),
        "rope": (
            (cfg.rope_theta, cfg.rope_scaling, cfg.rotary_percent),
            (spec.rope_theta, spec.rope_scaling and spec.rope_scaling.model_dump(), spec.rotary_percent),
        ),
        "qk norm": (cfg.qk_norm, spec.qk_norm),
        "biases": ((cfg.qkv_bias, cfg.linear_bias), (spec.qkv_bias, spec.linear_bias)),
        "embedding norm": (cfg.embedding_norm, spec.embedding_norm),
        "tied embeddings": (cfg.tie_embeddings, spec.tie_embeddings),
        "experts": ((cfg.num_experts, cfg.moe_top_k), (spec.num_experts, spec.moe_top_k)),
    }
    if spec.position_embedding == "learned":
        fields["learned positions"] = (cfg.max_seq_len, spec.max_position_embeddings)
    if spec.is_moe:
        fields |= {
            "expert ffn": (
                (cfg.expert_ffn_hidden_size, cfg.shared_ffn_hidden_size),
                (spec.expert_ffn_hidden_size, spec.shared_ffn_width),
            ),
            "MoE layers": (
                [cfg.is_moe_layer(i) for i in range(cfg.num_layers)],
                [spec.is_moe_layer(i) for i in range(spec.num_layers)],
            ),
            "router": (
                (
                    cfg.moe_score_function,
                    cfg.moe_norm_topk_prob,
                    cfg.moe_routed_scaling_factor,
                    cfg.moe_shared_expert_gate,
                ),
                (
                    spec.moe_score_function,
                    spec.moe_norm_topk_prob,
                    spec.moe_routed_scaling_factor,
                    spec.moe_shared_expert_gate,
                ),
            ),
        }
    return fields


@pytest.mark.parametrize("name", MODELS)
def test_torch_script_builds_the_model(name, tmp_path, monkeypatch):
    plan_file = plan_of(name)
    spec = plan_file.model
    files = exported("torch", export_torch, plan_file)
    if files is None:
        return
    script = imported(write_files(files, tmp_path) / "train_pipeline.py", "planner_exported_script", monkeypatch)
    built, expected = split(block_fields(spec, script.BlockConfig(**script.MODEL)))
    assert built == expected
    with torch.device("meta"):
        assert param_count(script.build_full_model(0)) == total_param_count(spec)


@pytest.mark.parametrize("name", MODELS)
def test_deepspeed_module_builds_the_model(name, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed not installed")
    plan_file = plan_of(name, pp=2)
    spec = plan_file.model
    files = exported("deepspeed", export_deepspeed, plan_file)
    if files is None:
        return
    module = imported(write_files(files, tmp_path) / "deepspeed_pipeline.py", "planner_exported_pipeline", monkeypatch)
    cfg = module.BlockConfig(**module.MODEL)
    built, expected = split(block_fields(spec, cfg))
    assert built == expected
    with torch.device("meta"):
        assert param_count(module.Transformer(cfg)) == total_param_count(spec)
