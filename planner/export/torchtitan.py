"""Plan -> a torchtitan 0.3 recipe (`planner_recipe.py`) and the planned schedule as CSV.

torchtitan 0.3 (the PyPI release) no longer reads TOML job files: `torchtitan.train` takes
`--module M --config F`, imports `M` (a module path on PYTHONPATH works) and calls `F()` for a
`Trainer.Config`, which it then re-validates and lets the command line override. The recipe
starts from torchtitan's stock `llama3_8b` training settings (optimizer, LR schedule, data,
checkpointing: the plan does not choose them), replaces the model by the planned shape built
from torchtitan's own Llama-3 components, and sets every parallelism field from the plan.

Stage cuts are given as `module_fqns_per_model_part` (one list of module names per virtual
stage, in model order; torchtitan places them looped or V-shaped from the schedule class).
With pipeline parallelism the planner's per-rank action order is written as `schedule.csv`
and named by `pipeline_parallel_schedule_csv`, so torchtitan runs exactly the simulated
order (its `_PipelineScheduleRuntime`); `pipeline_parallel_schedule` still names a torch
schedule class with the same stage placement, which torchtitan uses to place stages.

Data parallelism maps to torchtitan's FSDP2 / HSDP: ZeRO-0 is `data_parallel_replicate_degree`
(DDP-like replication), ZeRO-1/2 shard with `fsdp_reshard_after_forward="never"` (gradients
and optimizer state sharded, parameters kept gathered between forward and backward: ZeRO-2,
which holds no more memory than ZeRO-1 for the same communication), ZeRO-3 reshards always.

The model is the planned one: RoPE base and scaling (Llama 3.1's on the dense model, YaRN on
latent attention), norm epsilon (set on every RMSNorm the recipe builds), QK-norm, the router's
score function, renormalisation, scale and groups. What torchtitan 0.3's models cannot express
(biases, LayerNorm, non-SwiGLU MLPs, partial RoPE, other scalings, a shared-expert gate) is
refused with the feature named, never exported as another model. torchtitan's expert-bias
balancing (`load_balance_coeff`, its MoE's only load balancing) is on only for a model whose
router has the bias (DeepSeek-V3); an aux-loss model (Mixtral, Qwen3) trains unbalanced unless
the recipe's MODEL["load_balance_coeff"] is set (torchtitan's default 1e-3), which adds that bias
to its routing.

A mixture of experts with GQA is built from torchtitan's Qwen3 blocks (QK-norm where the model
has it; per layer a dense SwiGLU MLP or torchtitan's MoE: top-k router, grouped experts, shared
experts, all-to-all token dispatch); one with latent attention is torchtitan's DeepSeek-V3
model (dense first layers, MLA, MTP blocks and loss). Both train with `expert_parallel_degree` = the plan's
ep. torchtitan 0.3 has no expert-tensor-parallel degree: with EP its experts are whole on
each rank (etp 1) and EP borrows ranks from dp_shard x cp x tp; without EP they are sharded
like the dense MLP over tp (etp = tp). Plans outside that are refused.
"""

from __future__ import annotations

import pprint

from planner.errors import ExportError
from planner.export.common import (
    PROVENANCE_FILE,
    Files,
    check_attention_kernel,
    check_moe_mechanisms,
    check_positions,
    comment_block,
    provenance_readme,
    replan_for,
    require_model,
    select_plan,
    summary_lines,
    torchrun_script,
    uniform_recompute,
)
from planner.plan import PlanEntry, PlanFile
from planner.spec import ModelSpec

RUNTIME = "torchtitan"
LAUNCH_FILE = "launch_torchtitan.sh"
RECIPE_FILE = "planner_recipe.py"
CSV_FILE = "schedule.csv"
CONFIG_FUNCTION = "planner_plan"
TORCHTITAN_VERSION = "0.3.0"

LOOP_CLASS_FOR_CSV = {1: "1F1B", 2: "Interleaved1F1B"}
"""Schedule class named beside a CSV for a schedule torch has no class for: only its stage
placement (looped) and its single/multi-stage kind matter then."""


def export_torchtitan(plan_file: PlanFile, index: int = 0) -> Files:
    """`planner_recipe.py`, `schedule.csv` (pipeline parallel plans) and the provenance."""
    entry = select_plan(plan_file, index)
    check_attention_kernel(entry, RUNTIME)
    spec = require_model(plan_file, RUNTIME)
    _check_model(entry, spec)
    settings = recipe_settings(entry, spec)
    files = {RECIPE_FILE: _recipe(plan_file, entry, index, spec, settings)}
    files[LAUNCH_FILE] = _launch_file(plan_file, entry, index)
    described = {
        RECIPE_FILE: f"torchtitan {TORCHTITAN_VERSION} recipe (`--module planner_recipe --config {CONFIG_FUNCTION}`)",
        LAUNCH_FILE: "torchrun launch of torchtitan.train with the recipe, on every node",
    }
    if entry.pp > 1:
        from planner.schedule import generate, to_csv

        files[CSV_FILE] = to_csv(generate(entry.schedule, entry.pp, entry.num_microbatches, entry.vpp))
        described[CSV_FILE] = "the planned per-rank action order (torch compute-only CSV) the recipe names"
    files[PROVENANCE_FILE] = provenance_readme(plan_file, entry, index, "torchtitan", described, RUNTIME)
    return files


def recipe_settings(entry: PlanEntry, spec: ModelSpec) -> dict[str, dict]:
    """Field values of the recipe's config sections (`training`, `parallelism`) and the
    activation-checkpoint choice, as plain data."""
    ac = {"none": None, "selective": "SelectiveAC", "full": "FullAC"}[uniform_recompute(entry, RUNTIME)]
    training = {
        "local_batch_size": entry.mbs * (entry.num_microbatches if entry.pp > 1 else 1),
        "global_batch_size": entry.global_batch,
        "seq_len": entry.seq,
        "mixed_precision_param": "bfloat16" if entry.dtype == "bf16" else "float32",
        # torchtitan's CUDA graphs need neither PP nor EP's all-to-all (its CPU-synchronising splits)
        "disable_cuda_graphs": entry.pp > 1 or entry.ep > 1,
    }
    parallelism = {
        "tensor_parallel_degree": entry.tp,
        "enable_sequence_parallel": entry.sequence_parallel and entry.tp > 1,
        "context_parallel_degree": entry.cp,
        "pipeline_parallel_degree": entry.pp,
    }
    if spec.is_moe:
        parallelism["expert_parallel_degree"] = entry.ep
    if entry.zero_stage == 0:
        parallelism |= {"data_parallel_replicate_degree": entry.dp, "data_parallel_shard_degree": 1}
    else:
        parallelism |= {
            "data_parallel_replicate_degree": 1,
            "data_parallel_shard_degree": entry.dp,
            "fsdp_reshard_after_forward": "always" if entry.zero_stage == 3 else "never",
        }
    if entry.pp > 1:
        parallelism |= {
            "pipeline_parallel_schedule": _schedule_class(entry),
            "pipeline_parallel_schedule_csv": CSV_FILE,
            "pipeline_parallel_microbatch_size": entry.mbs,
            "module_fqns_per_model_part": module_fqns_per_stage(entry, spec),
        }
    return {"training": training, "parallelism": parallelism, "activation_checkpoint": {"policy": ac}}


def module_fqns_per_stage(entry: PlanEntry, spec: ModelSpec) -> list[list[str]]:
    """torchtitan module names of each virtual stage in model order: the embedding with the
    first stage, the final norm and LM head with the last."""
    ranges = entry.ranges_in_model_order()
    parts = []
    for i, (start, end) in enumerate(ranges):
        names = ["tok_embeddings"] if i == 0 else []
        names += [f"layers.{layer}" for layer in range(start, end)]
        names += ["norm", "lm_head"] if i == len(ranges) - 1 else []
        parts.append(names)
    return parts


def _schedule_class(entry: PlanEntry) -> str:
    from planner.schedule import TORCH_SCHEDULE_CLASS

    name = TORCH_SCHEDULE_CLASS[entry.schedule]
    if name is None or (entry.schedule == "zb_h1" and entry.vpp == 1):
        name = LOOP_CLASS_FOR_CSV[min(entry.vpp, 2)]
    return name


def _unsupported_features(spec: ModelSpec) -> list[str]:
    """The model's features that torchtitan 0.3's Llama-style models (Llama-3, Qwen3,
    DeepSeek-V3: RMSNorm, SwiGLU, RoPE, no biases) do not have."""
    return [
        what
        for present, what in (
            (spec.norm != "rmsnorm", spec.norm.replace("layernorm", "LayerNorm")),
            (spec.activation != "swiglu", f"a {spec.activation} MLP"),
            (spec.position_embedding != "rope", f"{spec.position_embedding} positions"),
            (spec.qkv_bias, "QKV biases"),
            (spec.linear_bias, "MLP and output biases"),
            (spec.embedding_norm, "a norm after the embedding"),
        )
        if present
    ]


def _check_model(entry: PlanEntry, spec: ModelSpec) -> None:
    features = _unsupported_features(spec)
    if features:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} is not a Llama-style decoder: it has {', '.join(features)}, "
            "which torchtitan 0.3's models (RMSNorm, SwiGLU, RoPE, no biases) do not have"
        )
    _check_rope(spec)
    check_positions(entry, spec, RUNTIME)
    check_moe_mechanisms(entry, RUNTIME)
    if spec.is_moe:
        _check_moe(entry, spec)
    elif entry.ep > 1:
        raise ExportError(f"{RUNTIME}: ep {entry.ep} on the dense model {spec.name}; {replan_for(RUNTIME)}")
    if spec.tie_embeddings and entry.pp > 1:
        raise ExportError(
            f"{RUNTIME}: tied input/output embeddings with pipeline parallelism "
            f"(pp={entry.pp}); torchtitan refuses weight tying under PP; {replan_for(RUNTIME)}"
        )
    if entry.dtype not in ("bf16", "fp32"):
        raise ExportError(f"{RUNTIME}: dtype '{entry.dtype}': torchtitan trains in bfloat16 mixed precision or float32")
    if entry.tp > 1 and (spec.num_attention_heads % entry.tp or spec.num_kv_heads % entry.tp):
        raise ExportError(
            f"{RUNTIME}: tp {entry.tp} must divide the attention heads "
            f"({spec.num_attention_heads}) and KV heads ({spec.num_kv_heads}); {replan_for(RUNTIME)}"
        )


def _check_rope(spec: ModelSpec) -> None:
    """What torchtitan 0.3's RoPE cannot express: a partly rotated head, Llama 3.1's scaling
    outside the dense Llama model (Qwen3 blocks use CosSinRoPE, which refuses it), YaRN
    outside latent attention (its GQA leaves YaRN's attention scale out), or YaRN whose cos/sin
    tables are scaled (mscale other than mscale_all_dim: torchtitan scales the softmax only)."""
    scaling = spec.rope_scaling
    why = None
    if spec.rotary_percent != 1.0:
        why = f"RoPE on {spec.rotary_percent:.0%} of each head (torchtitan rotates whole heads)"
    elif scaling is not None and scaling.rope_type == "llama3" and (spec.is_moe or spec.is_mla):
        why = "Llama 3.1 RoPE scaling in a mixture of experts (torchtitan's Qwen3 and DeepSeek-V3 RoPE have none)"
    elif scaling is not None and scaling.rope_type == "yarn" and not spec.is_mla:
        why = "YaRN RoPE scaling without latent attention (torchtitan's GQA leaves out YaRN's attention scale)"
    elif scaling is not None and scaling.rope_type == "yarn" and scaling.mscale != scaling.mscale_all_dim:
        why = (
            f"YaRN with mscale {scaling.mscale} != mscale_all_dim {scaling.mscale_all_dim} (torchtitan scales "
            "the softmax, never the cos/sin tables)"
        )
    if why is not None:
        raise ExportError(f"{RUNTIME}: model {spec.name} has {why}")


def _check_moe(entry: PlanEntry, spec: ModelSpec) -> None:
    """What torchtitan 0.3's MoE models (Qwen3 blocks for GQA, DeepSeek-V3 for latent
    attention; standard all-to-all dispatcher) cannot run."""
    if spec.moe_capacity_factor is not None:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} caps tokens per expert (capacity factor "
            f"{spec.moe_capacity_factor}); torchtitan's standard token dispatcher is dropless"
        )
    if spec.moe_shared_expert_gate:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} gates its shared experts (Qwen2-MoE); torchtitan's MoE adds them ungated"
        )
    if spec.moe_router_num_groups is not None and spec.moe_router_group_score != "top2_sum":
        raise ExportError(
            f"{RUNTIME}: model {spec.name} ranks its expert groups by their best score; torchtitan's "
            "group-limited routing ranks them by the sum of their two best (DeepSeek-V3's)"
        )
    if spec.is_mla:
        if spec.moe_layer_freq != 1 or spec.shared_ffn_width != spec.num_shared_experts * spec.expert_ffn_hidden_size:
            raise ExportError(
                f"{RUNTIME}: model {spec.name}: torchtitan's DeepSeek-V3 model makes every layer "
                "after the dense ones MoE, with shared experts as wide as num_shared_experts routed ones"
            )
        if spec.mtp_depth and (entry.pp > 1 or entry.cp > 1):
            raise ExportError(
                f"{RUNTIME}: multi-token prediction (model {spec.name}) with pp {entry.pp}, cp "
                f"{entry.cp}: torchtitan 0.3's MTP supports neither pipeline nor context "
                f"parallelism; {replan_for(RUNTIME)}"
            )
    elif spec.mtp_depth:
        raise ExportError(
            f"{RUNTIME}: multi-token prediction without latent attention (model {spec.name}) is "
            "not in torchtitan's models"
        )
    etp = entry.etp or entry.tp
    if (entry.ep > 1 and etp != 1) or (entry.ep == 1 and etp != entry.tp):
        raise ExportError(
            f"{RUNTIME}: expert tensor parallel {etp} with ep {entry.ep}, tp {entry.tp}: torchtitan "
            "0.3 keeps experts whole under expert parallelism (etp 1) and shards them over tp "
            f"without it (etp = tp); {replan_for(RUNTIME)}"
        )
    dp_shard = 1 if entry.zero_stage == 0 else entry.dp
    if spec.num_experts % entry.ep or (dp_shard * entry.cp * entry.tp) % entry.ep:
        raise ExportError(
            f"{RUNTIME}: ep {entry.ep} must divide the experts ({spec.num_experts}) and "
            f"dp_shard x cp x tp ({dp_shard} x {entry.cp} x {entry.tp}), the ranks torchtitan's "
            f"expert parallelism borrows (ZeRO-0 replicas are not among them); {replan_for(RUNTIME)}"
        )
    if entry.ep > 1 and entry.seq % (entry.cp * entry.tp):
        raise ExportError(
            f"{RUNTIME}: seq {entry.seq} must divide by cp x tp ({entry.cp * entry.tp}): torchtitan's "
            f"expert parallelism splits each sequence's tokens over them; {replan_for(RUNTIME)}"
        )


LOAD_BALANCE_COEFF = 1e-3
"""torchtitan's expert-bias update rate (its MoE.Config default), for a router with the bias."""


def moe_model_fields(spec: ModelSpec) -> dict:
    """The recipe's MODEL entries of a mixture of experts: experts, top-k, widths, the router,
    and which layers are MoE; with latent attention its ranks and head widths, YaRN's softmax
    mscale and the MTP depth."""
    fields = {
        "num_experts": spec.num_experts,
        "top_k": spec.moe_top_k,
        "moe_hidden_dim": spec.expert_ffn_hidden_size,
        "shared_hidden_dim": spec.shared_ffn_width,
        "score_func": spec.moe_score_function,
        "route_norm": spec.moe_norm_topk_prob,
        "route_scale": spec.moe_routed_scaling_factor,
        "num_expert_groups": spec.moe_router_num_groups,
        "num_limited_groups": spec.moe_router_group_topk,
        "load_balance_coeff": LOAD_BALANCE_COEFF if spec.moe_router_expert_bias else None,
    }
    if not spec.is_mla:
        return fields | {"moe_layers": [i for i in range(spec.num_layers) if spec.is_moe_layer(i)]}
    return fields | {
        "num_shared_experts": spec.num_shared_experts,
        "first_dense_layers": spec.first_dense_layers,
        "q_lora_rank": spec.q_lora_rank or 0,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "mtp_depth": spec.mtp_depth,
        "mscale": spec.rope_scaling.mscale_all_dim if spec.rope_scaling else 1.0,
    }


def rope_config_fields(spec: ModelSpec) -> dict:
    """torchtitan's RoPE.Config fields of the model's RoPE (dim and length aside): its base and
    Llama 3.1's ("llama") or YaRN's scaling."""
    fields: dict = {"theta": spec.rope_theta}
    scaling = spec.rope_scaling
    if scaling is None:
        return fields
    if scaling.rope_type == "llama3":
        return fields | {
            "scaling": "llama",
            "scaling_factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return fields | {
        "scaling": "yarn",
        "rope_factor": scaling.factor,
        "beta_fast": scaling.beta_fast,
        "beta_slow": scaling.beta_slow,
        "original_seq_len": scaling.original_max_position_embeddings,
    }


def comm_backend(entry: PlanEntry) -> str:
    """torchtitan's `moe_comm_backend` for the dispatcher the plan was priced with: "deepep"
    (torchtitan's DeepEPTokenDispatcher, DeepEP's kernels; needs deep_ep installed) or
    "standard" (its all-to-all collectives)."""
    return "deepep" if entry.moe_dispatcher == "deepep" else "standard"


def _model_source(spec: ModelSpec) -> tuple[str, str]:
    """(imports, model functions) of the recipe: Llama-3 (dense), Qwen3 blocks (MoE with
    GQA) or DeepSeek-V3 (MoE with latent attention)."""
    if spec.is_mla:
        return _MLA_IMPORTS, _MLA_MODEL
    return (_MOE_IMPORTS, _MOE_MODEL) if spec.is_moe else (_DENSE_IMPORTS, _DENSE_MODEL)


def _recipe(plan_file: PlanFile, entry: PlanEntry, index: int, spec: ModelSpec, settings: dict[str, dict]) -> str:
    model = {
        "dim": spec.hidden_size,
        "n_layers": spec.num_layers,
        "n_heads": spec.num_attention_heads,
        "n_kv_heads": spec.num_kv_heads,
        "head_dim": spec.kv_channels,
        "ffn_hidden_dim": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "max_seq_len": max(spec.max_position_embeddings, entry.seq),
        "tie_embeddings": spec.tie_embeddings,
        "norm_eps": spec.norm_eps,
        "qk_norm": spec.qk_norm,
        "rope": rope_config_fields(spec),
    }
    if spec.is_moe:
        model |= moe_model_fields(spec) | {"comm_backend": comm_backend(entry)}
    policy = settings["activation_checkpoint"]["policy"]
    ac_line = "None" if policy is None else f"{policy}.Config()"
    imports, function = _model_source(spec)
    return f'''"""torchtitan {TORCHTITAN_VERSION} recipe for a planned layout, written by `planner export --to torchtitan`.

    bash {LAUNCH_FILE}      # on every node, with NODE_RANK and MASTER_ADDR set

It runs torchrun with `torchtitan.train --module planner_recipe --config {CONFIG_FUNCTION}` from
this folder (the schedule CSV path is relative). Optimizer, LR schedule, data and
checkpointing come from torchtitan's stock llama3_8b recipe; override them on the command
line (e.g. --hf_assets_path, --dataloader.dataset) or below.
"""

{comment_block(summary_lines(plan_file, entry, index, RUNTIME)).rstrip()}

import dataclasses
from functools import partial

from torch import nn
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer
{imports.rstrip()}

# The planned model's shape.
MODEL = {pprint.pformat(model, sort_dicts=False, compact=True)}

# Batch and sequence (local batch: one data-parallel rank's sequences per optimizer step, split
# into pipeline micro-batches with PP; without PP, global / (local x dp) steps accumulate).
TRAINING = {pprint.pformat(settings["training"], sort_dicts=False)}

# Parallel layout: degrees, data-parallel sharding, pipeline schedule and stage cuts.
PARALLELISM = {pprint.pformat(settings["parallelism"], sort_dicts=False, width=100)}

# Initialisation (torchtitan's per-parameter `param_init`): normal(0.02) weights, zero biases.
LINEAR_INIT = {{"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}}
NORM_INIT = {{"weight": nn.init.ones_}}
EMBEDDING_INIT = {{"weight": partial(nn.init.normal_, std=0.02)}}


{function.strip()}


def {CONFIG_FUNCTION}() -> Trainer.Config:
    """The planned layout on torchtitan's stock llama3_8b training settings."""
    config = llama3_8b()
    config.model_spec = planner_model_spec()
    config.loss = planner_loss()
    for key, value in TRAINING.items():
        setattr(config.training, key, value)
    for key, value in PARALLELISM.items():
        setattr(config.parallelism, key, value)
    # Activation recomputation: {settings["activation_checkpoint"]["policy"] or "none"}.
    config.activation_checkpoint = {ac_line}
    return config
'''


_NORM_EPS = '''

def planner_norm_eps(config) -> None:
    """Every RMSNorm config under `config` (walked field by field) given the model's epsilon."""
    if isinstance(config, RMSNorm.Config):
        config.eps = MODEL["norm_eps"]
    elif isinstance(config, list):
        for item in config:
            planner_norm_eps(item)
    elif dataclasses.is_dataclass(config):
        for field in dataclasses.fields(config):
            planner_norm_eps(getattr(config, field.name))
'''
"""The recipe's `planner_norm_eps`, which every model function applies to its model config."""

_CHUNKED_LOSS = '''

def planner_loss():
    """Cross entropy over the vocabulary, computed in chunks."""
    return ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=MODEL["vocab_size"]))
'''
"""The recipe's `planner_loss` for models without multi-token prediction."""

_DENSE_IMPORTS = """
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.llama3 import Llama3Model, parallelize_llama
from torchtitan.models.llama3.model import Llama3TransformerBlock
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
"""

_DENSE_MODEL = (
    '''
def planner_model_spec() -> ModelSpec:
    """torchtitan's Llama-3 decoder at the planned shape (flex attention, complex RoPE, QK-norm
    where the model has it)."""
    m = MODEL
    rope = ComplexRoPE.Config(dim=m["head_dim"], max_seq_len=m["max_seq_len"], **m["rope"])
    qk_norm = RMSNorm.Config(normalized_shape=m["head_dim"], param_init=NORM_INIT) if m["qk_norm"] else None
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
            attention=make_gqa_config(
                dim=m["dim"], n_heads=m["n_heads"], n_kv_heads=m["n_kv_heads"], head_dim=m["head_dim"],
                wqkv_param_init=LINEAR_INIT, wo_param_init=LINEAR_INIT,
                inner_attention=get_attention_config("flex"), rope=rope, fuse_qkv=True, qk_norm=qk_norm),
            feed_forward=make_ffn_config(dim=m["dim"], hidden_dim=m["ffn_hidden_dim"],
                                         w1_param_init=LINEAR_INIT, w2w3_param_init=LINEAR_INIT),
        )
        for _ in range(m["n_layers"])
    ]
    model = Llama3Model.Config(
        dim=m["dim"], vocab_size=m["vocab_size"], enable_weight_tying=m["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=m["vocab_size"], embedding_dim=m["dim"],
                                        param_init=EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
        lm_head=Linear.Config(in_features=m["dim"], out_features=m["vocab_size"], param_init=LINEAR_INIT),
        layers=layers,
    )
    planner_norm_eps(model)
    return ModelSpec(name="llama3", flavor="planner", model=model, parallelize_fn=parallelize_llama,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=None,
                     state_dict_adapter=Llama3StateDictAdapter)
'''
    + _NORM_EPS
    + _CHUNKED_LOSS
)
"""The recipe's `planner_model_spec` for a dense Llama-style model."""

_MOE_IMPORTS = """
from torchtitan.components.optimizer import register_moe_load_balancing_hook
from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import (
    get_attention_config,
    make_ffn_config,
    make_gqa_config,
    make_moe_config,
    make_routed_experts_config,
    make_router_config,
)
from torchtitan.models.qwen3 import Qwen3Model, parallelize_qwen3
from torchtitan.models.qwen3.model import Qwen3TransformerBlock
from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
"""

_MOE_MODEL = (
    '''
EXPERTS_INIT = {name: partial(nn.init.normal_, std=0.02) for name in ("w1_EFD", "w2_EDF", "w3_EFD")}


def planner_mlp(layer: int) -> dict:
    """The MLP of `layer`: dense SwiGLU, or routed experts (the model's router: score function,
    renormalised top-k or not, scale, groups, expert bias) plus the shared experts, tokens sent
    by the dispatcher the plan was priced with (torchtitan's all-to-all, or DeepEP's kernels)."""
    m = MODEL
    if layer not in m["moe_layers"]:
        return {"feed_forward": make_ffn_config(dim=m["dim"], hidden_dim=m["ffn_hidden_dim"],
                                                w1_param_init=LINEAR_INIT, w2w3_param_init=LINEAR_INIT)}
    shared = None
    if m["shared_hidden_dim"]:
        shared = make_ffn_config(dim=m["dim"], hidden_dim=m["shared_hidden_dim"],
                                 w1_param_init=LINEAR_INIT, w2w3_param_init=LINEAR_INIT)
    return {"moe": make_moe_config(
        num_experts=m["num_experts"],
        router=make_router_config(
            dim=m["dim"], num_experts=m["num_experts"], gate_param_init=LINEAR_INIT, top_k=m["top_k"],
            score_func=m["score_func"], route_norm=m["route_norm"], route_scale=m["route_scale"],
            num_expert_groups=m["num_expert_groups"], num_limited_groups=m["num_limited_groups"]),
        routed_experts=make_routed_experts_config(
            dim=m["dim"], hidden_dim=m["moe_hidden_dim"], num_experts=m["num_experts"], top_k=m["top_k"],
            param_init=EXPERTS_INIT, comm_backend=m["comm_backend"]),
        shared_experts=shared, load_balance_coeff=m["load_balance_coeff"])}


def planner_model_spec() -> ModelSpec:
    """torchtitan's Qwen3 blocks at the planned shape: GQA (QK-norm where the model has it),
    flex attention, RoPE, and per layer a dense MLP or a mixture of experts."""
    m = MODEL
    rope = CosSinRoPE.Config(dim=m["head_dim"], max_seq_len=m["max_seq_len"], **m["rope"])
    qk_norm = RMSNorm.Config(normalized_shape=m["head_dim"], param_init=NORM_INIT) if m["qk_norm"] else None
    layers = [
        Qwen3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
            attention=make_gqa_config(
                dim=m["dim"], n_heads=m["n_heads"], n_kv_heads=m["n_kv_heads"], head_dim=m["head_dim"],
                wqkv_param_init=LINEAR_INIT, wo_param_init=LINEAR_INIT,
                inner_attention=get_attention_config("flex"), rope=rope, fuse_qkv=True, qk_norm=qk_norm),
            **planner_mlp(layer),
        )
        for layer in range(m["n_layers"])
    ]
    model = Qwen3Model.Config(
        dim=m["dim"], vocab_size=m["vocab_size"], enable_weight_tying=m["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=m["vocab_size"], embedding_dim=m["dim"],
                                        param_init=EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
        lm_head=Linear.Config(in_features=m["dim"], out_features=m["vocab_size"], param_init=LINEAR_INIT),
        layers=layers,
    )
    planner_norm_eps(model)
    return ModelSpec(name="qwen3", flavor="planner", model=model, parallelize_fn=parallelize_qwen3,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=register_moe_load_balancing_hook,
                     state_dict_adapter=Qwen3StateDictAdapter)
'''
    + _NORM_EPS
    + _CHUNKED_LOSS
)
"""The recipe's `planner_model_spec` for a mixture of experts (torchtitan's Qwen3 blocks)."""

_MLA_IMPORTS = """
import copy

from torchtitan.components.optimizer import register_moe_load_balancing_hook
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.deepseek_v3 import DeepSeekV3Model, MTPLoss, MTPTransformerBlock, parallelize_deepseekv3
from torchtitan.models.deepseek_v3 import build_mla_moe_layers
from torchtitan.models.deepseek_v3.state_dict_adapter import DeepSeekV3StateDictAdapter
"""

_MLA_MODEL = (
    '''
EXPERTS_INIT = {name: partial(nn.init.normal_, std=0.02) for name in ("w1_EFD", "w2_EDF", "w3_EFD")}


def planner_mtp_layers(last) -> list:
    """MODEL["mtp_depth"] multi-token-prediction blocks shaped like the last layer, as
    torchtitan's DeepSeek-V3 flavours build them."""
    dim = MODEL["dim"]
    return [
        MTPTransformerBlock.Config(
            attention=copy.deepcopy(last.attention), feed_forward=copy.deepcopy(last.feed_forward),
            moe=copy.deepcopy(last.moe), attention_norm=copy.deepcopy(last.attention_norm),
            ffn_norm=copy.deepcopy(last.ffn_norm),
            enorm=RMSNorm.Config(normalized_shape=dim, param_init=NORM_INIT),
            hnorm=RMSNorm.Config(normalized_shape=dim, param_init=NORM_INIT),
            eh_proj=Linear.Config(in_features=2 * dim, out_features=dim, bias=False, param_init=LINEAR_INIT),
            mtp_norm=RMSNorm.Config(normalized_shape=dim, param_init=NORM_INIT),
        )
        for _ in range(MODEL["mtp_depth"])
    ]


def planner_model_spec() -> ModelSpec:
    """torchtitan's DeepSeek-V3 decoder at the planned shape: latent attention (YaRN RoPE and
    its softmax mscale where the model has them), dense first layers, routed + shared experts
    (the model's router: score function, renormalised top-k, route scale, groups, expert bias),
    multi-token prediction."""
    m = MODEL
    rope = ComplexRoPE.Config(dim=m["qk_rope_head_dim"], max_seq_len=m["max_seq_len"], **m["rope"])
    layers = build_mla_moe_layers(
        n_layers=m["n_layers"], n_dense_layers=m["first_dense_layers"], dim=m["dim"], n_heads=m["n_heads"],
        q_lora_rank=m["q_lora_rank"], kv_lora_rank=m["kv_lora_rank"], qk_nope_head_dim=m["qk_nope_head_dim"],
        qk_rope_head_dim=m["qk_rope_head_dim"], v_head_dim=m["v_head_dim"], mscale=m["mscale"],
        dense_hidden_dim=m["ffn_hidden_dim"], moe_hidden_dim=m["moe_hidden_dim"], num_experts=m["num_experts"],
        num_shared_experts=m["num_shared_experts"], router_top_k=m["top_k"], router_score_func=m["score_func"],
        router_num_expert_groups=m["num_expert_groups"], router_num_limited_groups=m["num_limited_groups"],
        router_route_scale=m["route_scale"], router_route_norm=m["route_norm"], attn_backend="flex",
        moe_comm_backend=m["comm_backend"], non_blocking_capacity_factor=None, linear_init=LINEAR_INIT,
        norm_init=NORM_INIT, depth_init=lambda layer: LINEAR_INIT, depth_experts_init=lambda layer: EXPERTS_INIT,
        rope=rope)
    for layer in layers:
        if layer.moe is not None:
            layer.moe.load_balance_coeff = m["load_balance_coeff"]
    model = DeepSeekV3Model.Config(
        dim=m["dim"], vocab_size=m["vocab_size"], enable_weight_tying=m["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=m["vocab_size"], embedding_dim=m["dim"],
                                        param_init=EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=m["dim"], param_init=NORM_INIT),
        lm_head=Linear.Config(in_features=m["dim"], out_features=m["vocab_size"], param_init=LINEAR_INIT),
        layers=layers, mtp_layers=planner_mtp_layers(layers[-1]),
    )
    planner_norm_eps(model)
    return ModelSpec(name="deepseek_v3", flavor="planner", model=model, parallelize_fn=parallelize_deepseekv3,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=register_moe_load_balancing_hook,
                     state_dict_adapter=DeepSeekV3StateDictAdapter)


def planner_loss():
    """Cross entropy, plus DeepSeek-V3's multi-token-prediction loss with MTP layers."""
    if MODEL["mtp_depth"]:
        return MTPLoss.Config(global_vocab_size=MODEL["vocab_size"])
    return ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=MODEL["vocab_size"]))
'''
    + _NORM_EPS
)
"""The recipe's `planner_model_spec` for latent attention (torchtitan's DeepSeek-V3 model)."""


def _launch_file(plan_file: PlanFile, entry: PlanEntry, index: int) -> str:
    """The torchrun launch of torchtitan's trainer with this folder's recipe, on every node."""
    header = comment_block(summary_lines(plan_file, entry, index, RUNTIME))
    setup = 'cd "$(dirname "${BASH_SOURCE[0]}")"\nexport PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"\n'
    return torchrun_script(
        plan_file,
        entry,
        header,
        f"torchtitan {TORCHTITAN_VERSION}'s trainer",
        setup,
        ["-m", "torchtitan.train", "--module", "planner_recipe", "--config", CONFIG_FUNCTION],
    )
