"""Plan -> Megatron-LM launch: the arguments (`megatron_args.sh`, bash arrays by topic) and a
torchrun launch script for `pretrain_gpt.py`.

Argument names are those of Megatron-LM's `megatron/training/arguments.py` as shipped in
megatron-core 0.19 (checked by its own `parse_args` / `validate_args` in tests/export).
Stage cuts are written as `--num-virtual-stages-per-pipeline-rank` when every virtual stage
holds the same number of layers, as `--decoder-first/last-pipeline-num-layers` when only the
first and last stage differ (V = 1), and otherwise as `--pipeline-model-parallel-layout`
(`E` embedding, `t` transformer layer, `L` loss, `|` between virtual stages in model order).

The model arguments build the planned model itself: widths, heads and groups, norm and its
epsilon, QK-norm, RoPE base, rotated share and scaling, biases, tying, the vocabulary (padded by
Megatron to a multiple of `--make-vocab-size-divisible-by` x tp, chosen so it pads none where tp
divides it), the experts and their router, latent-attention ranks (tests/export build Megatron's
GPT model from them and compare it with the model field by field).

Megatron-LM runs 1F1B and (with virtual stages) interleaved 1F1B; every other schedule is
refused, as are model features it has no argument for (ALiBi, an embedding norm, MLP biases
without QKV bias, RoPE scalings and routers its arguments cannot express) and ZeRO-2/3
sharding (Megatron-FSDP) together with pipeline parallelism.
"""

from __future__ import annotations

import shlex

from planner.errors import ExportError
from planner.export.common import (
    PROVENANCE_FILE,
    Files,
    check_attention_kernel,
    check_positions,
    check_rules,
    comment_block,
    provenance_readme,
    replan_for,
    require_model,
    select_plan,
    stage_sizes,
    summary_lines,
    torchrun_script,
    uniform_recompute,
)
from planner.hints import planner_command
from planner.plan import PlanEntry, PlanFile
from planner.schedule.generators import interleave_rounds
from planner.spec import ModelSpec

RUNTIME = "megatron"
ARGS_FILE = "megatron_args.sh"
LAUNCH_FILE = "launch_megatron.sh"

ArgGroup = tuple[str, str, list[str]]
"""(bash array name, comment saying what the block does, arguments)."""


def megatron_arguments(entry: PlanEntry, spec: ModelSpec) -> list[ArgGroup]:
    """The Megatron-LM arguments of the plan, grouped by topic; ExportError for what
    Megatron-LM cannot run (the message names the part of the plan)."""
    return [
        ("MODEL_ARGS", "Model shape and block style.", _model_args(entry, spec)),
        (
            "PARALLEL_ARGS",
            "Parallel layout: TP, PP (stage cuts, virtual stages), CP, SP, "
            "data-parallel sharding and communication overlap.",
            _parallel_args(entry, spec),
        ),
        (
            "BATCH_ARGS",
            "Micro-batch and global batch (micro-batches per step = global / (micro x data-parallel)).",
            ["--micro-batch-size", str(entry.mbs), "--global-batch-size", str(entry.global_batch)],
        ),
        ("RECOMPUTE_ARGS", "Activation recomputation.", _recompute_args(entry)),
        ("PRECISION_ARGS", "Training precision.", _precision_args(entry)),
        (
            "DATA_ARGS",
            "Placeholders, not part of the plan: synthetic data and a null tokenizer "
            "of the planned vocabulary. Replace with --data-path / your tokenizer.",
            ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(spec.vocab_size)],
        ),
        (
            "TRAINING_ARGS",
            "Placeholders, not part of the plan: optimizer schedule and run length.",
            [
                "--train-iters",
                "1000",
                "--lr",
                "3.0e-4",
                "--min-lr",
                "3.0e-5",
                "--lr-decay-style",
                "cosine",
                "--lr-warmup-iters",
                "100",
                "--weight-decay",
                "0.1",
                "--clip-grad",
                "1.0",
                "--adam-beta2",
                "0.95",
                "--init-method-std",
                "0.02",
                "--log-interval",
                "10",
                "--eval-iters",
                "0",
            ],
        ),
    ]


def export_megatron(plan_file: PlanFile, index: int = 0) -> Files:
    """`megatron_args.sh`, `launch_megatron.sh` and the provenance README for plan `index`."""
    entry = select_plan(plan_file, index)
    check_attention_kernel(entry, RUNTIME)
    spec = require_model(plan_file, RUNTIME)
    groups = megatron_arguments(entry, spec)
    header = comment_block(summary_lines(plan_file, entry, index, RUNTIME))
    files = {
        ARGS_FILE: _args_file(groups, header),
        LAUNCH_FILE: _launch_file(plan_file, entry, header),
    }
    files[PROVENANCE_FILE] = provenance_readme(
        plan_file,
        entry,
        index,
        "Megatron-LM",
        {
            ARGS_FILE: "the Megatron-LM arguments as bash arrays (source it; MEGATRON_ARGS holds all)",
            LAUNCH_FILE: "torchrun launch of Megatron-LM's pretrain_gpt.py with those arguments",
        },
        RUNTIME,
    )
    return files


def _model_args(entry: PlanEntry, spec: ModelSpec) -> list[str]:
    if spec.position_embedding == "alibi":
        raise ExportError(
            f"{RUNTIME}: model {spec.name} uses ALiBi positions; Megatron-LM's "
            "position embeddings (learned_absolute, rope, ...) have no ALiBi"
        )
    if spec.embedding_norm:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} has a norm after the word embedding "
            "(BLOOM style); Megatron-LM's GPT model has no such layer"
        )
    if spec.linear_bias and not spec.qkv_bias:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} has MLP/output biases but no QKV bias; "
            "Megatron-LM's bias switches (every linear layer, or QKV only) cannot express that"
        )
    check_positions(entry, spec, RUNTIME)
    args = [
        "--num-layers",
        str(spec.num_layers),
        "--hidden-size",
        str(spec.hidden_size),
        "--ffn-hidden-size",
        str(spec.ffn_hidden_size),
        "--num-attention-heads",
        str(spec.num_attention_heads),
    ]
    if not spec.is_mla:  # latent attention's head widths are its own arguments (below)
        args += ["--kv-channels", str(spec.kv_channels)]
    if spec.num_kv_heads != spec.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(spec.num_kv_heads)]
    args += [
        "--seq-length",
        str(entry.seq),
        "--max-position-embeddings",
        str(max(spec.max_position_embeddings, entry.seq)),
        "--position-embedding-type",
        "rope" if spec.position_embedding == "rope" else "learned_absolute",
    ]
    if spec.position_embedding == "rope":
        args += _rope_args(spec)
    args += [
        "--normalization",
        "RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm",
        "--norm-epsilon",
        str(spec.norm_eps),
    ]
    if spec.qk_norm or spec.is_mla:  # Megatron's MLA builds its latents' norms only with this switch
        args.append("--qk-layernorm")
    args += {"swiglu": ["--swiglu"], "squared_relu": ["--squared-relu"], "gelu": []}[spec.activation]
    if not spec.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not spec.linear_bias:
        args.append("--disable-bias-linear")
        if spec.qkv_bias:
            args.append("--add-qkv-bias")
    args += ["--make-vocab-size-divisible-by", str(vocab_divisor(spec.vocab_size, entry.tp))]
    if spec.is_moe:
        args += _moe_model_args(spec, entry)
    if spec.is_mla:
        args += [
            "--multi-latent-attention",
            "--kv-lora-rank",
            str(spec.kv_lora_rank),
            "--qk-head-dim",
            str(spec.qk_nope_head_dim),
            "--qk-pos-emb-head-dim",
            str(spec.qk_rope_head_dim),
            "--v-head-dim",
            str(spec.v_head_dim),
        ]
        if spec.q_lora_rank is not None:
            args += ["--q-lora-rank", str(spec.q_lora_rank)]
    if spec.mtp_depth:
        args += ["--mtp-num-layers", str(spec.mtp_depth)]
    return args


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """Megatron-LM's --make-vocab-size-divisible-by for the model's vocabulary: the largest power
    of two up to its default 128 that, times tp, divides the vocabulary, so Megatron pads none
    (1 where tp does not divide it: Megatron then pads to the next multiple of tp)."""
    divisor = 128
    while divisor > 1 and vocab_size % (divisor * tp):
        divisor //= 2
    return divisor


MEGATRON_LLAMA3_SCALING = (1.0, 4.0, 8192)
"""(low_freq_factor, high_freq_factor, original_max_position_embeddings) of Llama 3.1's RoPE
scaling, fixed in Megatron-LM (no argument sets them). Source: megatron-core 0.19
RotaryEmbedding._apply_scaling defaults."""
MEGATRON_MLA_YARN = (4096, 32.0, 1.0)
"""(original_max_position_embeddings, beta_fast, beta_slow) of YaRN in Megatron-LM's latent
attention, fixed (no argument sets them). Source: megatron-core 0.19 MLATransformerConfig defaults."""


def _rope_args(spec: ModelSpec) -> list[str]:
    """RoPE's base, rotated share and long-context scaling as Megatron-LM's arguments;
    ExportError where they cannot express the model's."""
    if spec.rope_theta != int(spec.rope_theta):
        raise ExportError(
            f"{RUNTIME}: model {spec.name} has RoPE base {spec.rope_theta}; Megatron-LM's "
            "--rotary-base takes an integer"
        )
    args = ["--rotary-base", str(int(spec.rope_theta))]
    if spec.rotary_percent != 1.0:
        args += ["--rotary-percent", str(spec.rotary_percent)]
    scaling = spec.rope_scaling
    if scaling is None:
        return args + (["--rope-type", "rope"] if spec.is_mla else [])  # MLA's default is YaRN
    if scaling.rope_type == "llama3" and not spec.is_mla:
        fixed = (scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position_embeddings)
        if fixed != MEGATRON_LLAMA3_SCALING:
            raise ExportError(
                f"{RUNTIME}: model {spec.name}'s Llama 3.1 RoPE scaling has (low_freq_factor, "
                f"high_freq_factor, original_max_position_embeddings) {fixed}; Megatron-LM fixes "
                f"them at {MEGATRON_LLAMA3_SCALING}"
            )
        return args + ["--use-rope-scaling", "--rope-scaling-factor", str(scaling.factor)]
    if scaling.rope_type == "yarn" and spec.is_mla:
        fixed = (scaling.original_max_position_embeddings, scaling.beta_fast, scaling.beta_slow)
        if fixed != MEGATRON_MLA_YARN:
            raise ExportError(
                f"{RUNTIME}: model {spec.name}'s YaRN scaling has (original_max_position_embeddings, "
                f"beta_fast, beta_slow) {fixed}; Megatron-LM's latent attention fixes them at "
                f"{MEGATRON_MLA_YARN}"
            )
        return args + [
            "--rope-type",
            "yarn",
            "--rotary-scaling-factor",
            str(scaling.factor),
            "--mscale",
            str(scaling.mscale),
            "--mscale-all-dim",
            str(scaling.mscale_all_dim),
        ]
    attention = "latent attention" if spec.is_mla else "standard attention"
    raise ExportError(
        f"{RUNTIME}: model {spec.name} has {scaling.rope_type} RoPE scaling with {attention}, "
        "which this exporter does not write for Megatron-LM (Llama 3.1 scaling with standard "
        "attention, YaRN with latent attention)"
    )


_GROUP_BEST = {"top2_sum": 2, "max": 1}
"""Scores per group that rank the groups under each of ModelSpec.moe_router_group_score."""


def _router_args(spec: ModelSpec) -> list[str]:
    """The router's score function, top-k renormalisation, scaling factor, group-limited
    routing and expert bias, and the shared experts' gate, as Megatron-LM's arguments;
    ExportError for a router it cannot build."""
    why = None
    if spec.moe_score_function == "sigmoid" and not spec.moe_norm_topk_prob and spec.moe_top_k > 1:
        why = "sigmoid scores used as they are (Megatron-LM renormalises sigmoid top-k scores)"
    elif spec.moe_score_function == "softmax" and spec.moe_norm_topk_prob and spec.moe_top_k == 1:
        why = "top-1 softmax routing renormalised to weight 1 (Megatron-LM needs --moe-router-pre-softmax with top-1)"
    elif spec.moe_router_expert_bias and spec.moe_score_function == "softmax":
        why = "an expert bias on softmax scores (Megatron-LM's expert bias needs sigmoid scores)"
    elif (
        spec.moe_router_group_topk
        and spec.moe_top_k // spec.moe_router_group_topk != _GROUP_BEST[spec.moe_router_group_score]
    ):
        why = (
            f"groups ranked by {spec.moe_router_group_score} (Megatron-LM sums each group's top "
            f"top-k / group-topk = {spec.moe_top_k // spec.moe_router_group_topk} scores)"
        )
    if why is not None:
        raise ExportError(f"{RUNTIME}: model {spec.name}'s router has {why}")
    args = []
    if spec.moe_score_function == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
    elif not spec.moe_norm_topk_prob:  # softmax over every expert, then the top-k as they are
        args.append("--moe-router-pre-softmax")
    if spec.moe_routed_scaling_factor != 1.0:
        args += ["--moe-router-topk-scaling-factor", str(spec.moe_routed_scaling_factor)]
    if spec.moe_router_num_groups is not None:
        args += [
            "--moe-router-num-groups",
            str(spec.moe_router_num_groups),
            "--moe-router-group-topk",
            str(spec.moe_router_group_topk),
        ]
    if spec.moe_router_expert_bias:
        args.append("--moe-router-enable-expert-bias")
    if spec.moe_shared_expert_gate:
        args.append("--moe-shared-expert-gate")
    return args


def _moe_model_args(spec: ModelSpec, entry: PlanEntry) -> list[str]:
    """Experts, top-k, router, expert width, shared experts, the dense/MoE layer pattern, the
    grouped GEMM and the token dispatcher the plan was priced with (NCCL all-to-all, or DeepEP's through
    Megatron's flex dispatcher), dropless or capacity-capped."""
    args = [
        "--num-experts",
        str(spec.num_experts),
        "--moe-router-topk",
        str(spec.moe_top_k),
        "--moe-ffn-hidden-size",
        str(spec.expert_ffn_hidden_size),
        "--moe-grouped-gemm",
        *_router_args(spec),
    ]
    if entry.moe_dispatcher == "deepep":
        if spec.moe_capacity_factor is not None:  # TransformerConfig refuses the padding with DeepEP
            raise ExportError(
                f"{RUNTIME}: the plan was priced with DeepEP's token dispatcher, but {spec.name} "
                f"caps tokens per expert (capacity factor {spec.moe_capacity_factor}) and Megatron's "
                "flex dispatcher with DeepEP does not support moe_pad_expert_input_to_capacity; "
                f"re-plan without it: {planner_command('plan', '--moe-dispatcher alltoall')}"
            )
        # megatron-core 0.19: moe_enable_deepep is deprecated for moe_flex_dispatcher_backend "deepep"
        args += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
    else:
        args += ["--moe-token-dispatcher-type", "alltoall"]
    if spec.shared_ffn_width:
        args += ["--moe-shared-expert-intermediate-size", str(spec.shared_ffn_width)]
    if spec.first_dense_layers or spec.moe_layer_freq > 1:
        pattern = [int(spec.is_moe_layer(i)) for i in range(spec.num_layers)]
        args += ["--moe-layer-freq", _pattern_text(pattern)]
    if spec.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", str(spec.moe_capacity_factor), "--moe-pad-expert-input-to-capacity"]
    return args


def _pattern_text(pattern: list[int]) -> str:
    """A 0/1 layer list as Megatron's --moe-layer-freq expression, e.g. ([0]*3+[1]*58)."""
    runs: list[list[int]] = []
    for value in pattern:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")"


def _overlap_args(entry: PlanEntry, spec: ModelSpec) -> list[str]:
    """Megatron's combined-1F1B all-to-all overlap where the plan was priced with it, after the
    checks of megatron-core 0.19's TransformerConfig.__post_init__ (and validate_args: the delayed
    weight gradients need Transformer Engine, >= 2.8 with --overlap-grad-reduce)."""
    if not entry.moe_ep_overlap:
        return []
    refusal = None
    if not spec.is_moe or entry.ep == 1:
        refusal = "it is only supported with expert model parallelism (ep > 1)"
    elif entry.pp > 1 and entry.vpp == 1:
        refusal = "with pipeline parallelism it needs virtual stages (interleaved 1F1B)"
    elif any(entry.recompute_of(rank) == "full" for rank in range(entry.pp)):
        refusal = "it refuses full recomputation"
    elif spec.mtp_depth > 1:
        refusal = f"it supports at most one MTP layer ({spec.name} has {spec.mtp_depth})"
    if refusal is not None:
        raise ExportError(
            f"{RUNTIME}: the plan was priced with Megatron's combined-1F1B all-to-all overlap, "
            f"but overlap_moe_expert_parallel_comm {refusal}; {replan_for(RUNTIME)}"
        )
    return ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]


def _check_schedule(entry: PlanEntry) -> None:
    if entry.pp == 1:
        return  # no pipeline: Megatron-LM runs micro-batches back to back whatever the name
    if entry.schedule == "1f1b" and entry.vpp == 1:
        return
    if entry.schedule == "interleaved_1f1b" and entry.vpp >= 2:
        if entry.num_microbatches < entry.pp:
            raise ExportError(
                f"{RUNTIME}: interleaved 1F1B with {entry.num_microbatches} micro-batches < pp "
                f"{entry.pp}; Megatron-LM needs at least pp micro-batches per virtual-stage group; "
                f"{replan_for(RUNTIME)}"
            )
        return
    check_rules(entry, RUNTIME)
    raise ExportError(
        f"{RUNTIME}: schedule '{entry.schedule}' with vpp={entry.vpp}: Megatron-LM runs 1F1B with "
        f"vpp=1 and interleaved 1F1B with vpp>=2; {replan_for(RUNTIME)}"
    )


def _parallel_args(entry: PlanEntry, spec: ModelSpec) -> list[str]:
    _check_schedule(entry)
    args = ["--tensor-model-parallel-size", str(entry.tp), "--pipeline-model-parallel-size", str(entry.pp)]
    args += _stage_args(entry, spec)
    if entry.vpp >= 2:
        _, per_round = interleave_rounds(entry.pp, entry.num_microbatches)
        if per_round != entry.pp:
            args += ["--microbatch-group-size-per-virtual-pipeline-stage", str(per_round)]
    if entry.cp > 1:
        if entry.seq % (2 * entry.cp):
            raise ExportError(
                f"{RUNTIME}: seq {entry.seq} is not a multiple of 2 x cp "
                f"({2 * entry.cp}), which Megatron-LM's context parallelism needs; {replan_for(RUNTIME)}"
            )
        args += ["--context-parallel-size", str(entry.cp)]
    if entry.sequence_parallel and entry.tp > 1:
        args.append("--sequence-parallel")
    if spec.is_moe:
        args += [
            "--expert-model-parallel-size",
            str(entry.ep),
            "--expert-tensor-parallel-size",
            str(entry.etp or entry.tp),
        ]
    elif entry.ep > 1:
        raise ExportError(f"{RUNTIME}: ep {entry.ep} on the dense model {spec.name}; {replan_for(RUNTIME)}")
    args += _overlap_args(entry, spec)
    args += _data_parallel_args(entry)
    return args


def _stage_args(entry: PlanEntry, spec: ModelSpec) -> list[str]:
    if entry.pp == 1:
        return []
    sizes = stage_sizes(entry)
    if len(set(sizes)) == 1:
        return ["--num-virtual-stages-per-pipeline-rank", str(entry.vpp)] if entry.vpp > 1 else []
    middle = sizes[1:-1]
    if entry.vpp == 1 and len(set(middle)) <= 1 and all(s > 0 for s in sizes):
        args = []
        even = middle[0] if middle else None
        if even is None or sizes[0] != even:
            args += ["--decoder-first-pipeline-num-layers", str(sizes[0])]
        if even is None or sizes[-1] != even:
            args += ["--decoder-last-pipeline-num-layers", str(sizes[-1])]
        return args
    return ["--pipeline-model-parallel-layout", pipeline_layout(sizes)]


def pipeline_layout(sizes: list[int]) -> str:
    """Megatron-LM's `--pipeline-model-parallel-layout` for virtual-stage sizes in model order:
    stages joined by `|`, the embedding `E` first, the loss `L` last, `t*n` for n layers."""
    stages = []
    for i, n in enumerate(sizes):
        parts = (["E"] if i == 0 else []) + ([f"t*{n}" if n > 1 else "t"] if n else [])
        parts += ["L"] if i == len(sizes) - 1 else []
        stages.append(",".join(parts))
    return "|".join(stages)


def _data_parallel_args(entry: PlanEntry) -> list[str]:
    if entry.zero_stage >= 2:
        if entry.pp > 1:
            raise ExportError(
                f"{RUNTIME}: ZeRO-{entry.zero_stage} sharding is Megatron-FSDP in Megatron-LM, which is "
                f"not documented with pipeline parallelism; {replan_for(RUNTIME)}"
            )
        strategy = "optim_grads" if entry.zero_stage == 2 else "optim_grads_params"
        return [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            strategy,
            "--ckpt-format",
            "fsdp_dtensor",
        ] + (["--overlap-grad-reduce"] if entry.dp > 1 else [])
    args = ["--use-distributed-optimizer"] if entry.zero_stage == 1 else []
    if entry.dp > 1:
        args.append("--overlap-grad-reduce")
        if entry.zero_stage == 1:
            args.append("--overlap-param-gather")
    return args


def _recompute_args(entry: PlanEntry) -> list[str]:
    mode = uniform_recompute(entry, RUNTIME)
    if mode == "selective":
        return ["--recompute-granularity", "selective"]
    if mode == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return []


def _precision_args(entry: PlanEntry) -> list[str]:
    if entry.precision == "fp8":  # Transformer Engine's hybrid recipe: e4m3 forward, e5m2 gradients
        if entry.dtype != "bf16":
            raise ExportError(f"{RUNTIME}: fp8 GEMMs with dtype '{entry.dtype}'; Megatron-LM's FP8 runs beside bf16")
        return ["--bf16", "--fp8-format", "hybrid"]
    if entry.dtype in ("bf16", "fp16"):
        return [f"--{entry.dtype}"]
    if entry.dtype == "fp32":
        return []
    raise ExportError(
        f"{RUNTIME}: dtype '{entry.dtype}' has no Megatron-LM export here "
        "(bf16, fp16, fp32); FP8 needs Transformer Engine recipe arguments"
    )


def _args_file(groups: list[ArgGroup], header: str) -> str:
    out = [
        "#!/usr/bin/env bash",
        "# Megatron-LM arguments written by `planner export --to megatron`.",
        "# Source this file; MEGATRON_ARGS holds every argument below.",
        "#",
        header.rstrip(),
        "",
    ]
    for name, what, args in groups:
        out.append(f"# {what}")
        out.append(f"{name}=(")
        out += [f"    {line}" for line in _pair_lines(args)] or ["    # (none: Megatron-LM's default applies)"]
        out.append(")")
        out.append("")
    names = " ".join(f'"${{{name}[@]}}"' for name, _, _ in groups)
    out.append(f"MEGATRON_ARGS=({names})")
    return "\n".join(out) + "\n"


def _pair_lines(args: list[str]) -> list[str]:
    """One option per line, with its value(s) on the same line."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return [" ".join(shlex.quote(a) for a in line) for line in lines]


def _device_connections(entry: PlanEntry) -> str:
    """The launch script's CUDA_DEVICE_MAX_CONNECTIONS lines (Hopper and earlier), as NVIDIA's
    performance recipes set it (NeMo / Megatron-Bridge PerfEnvPlugin): 1 with TP or CP so their
    communication is issued in order with compute, unless the combined-1F1B all-to-all overlap
    runs (Megatron then only warns: the overlap wants more connections); 32 for DeepEP."""
    if entry.zero_stage >= 2:
        return ""  # Megatron-FSDP wants it unset
    if (entry.tp > 1 or entry.cp > 1) and not entry.moe_ep_overlap:
        return (
            "# TP / CP communication must be issued in order with compute (Megatron-LM asserts\n"
            "# this on GPUs before Blackwell; Megatron-FSDP wants it unset).\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        )
    if entry.moe_dispatcher == "deepep":
        return (
            "# DeepEP's kernels run beside compute on their own streams (NVIDIA's recipes: 32 connections).\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=32\n"
        )
    return ""


def _launch_file(plan_file: PlanFile, entry: PlanEntry, header: str) -> str:
    setup = (
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        'MEGATRON_LM_DIR="${MEGATRON_LM_DIR:?set MEGATRON_LM_DIR to a Megatron-LM checkout}"\n'
        f'source "$HERE/{ARGS_FILE}"\n{_device_connections(entry)}'
    )
    return torchrun_script(
        plan_file,
        entry,
        header,
        "Megatron-LM's GPT pretraining",
        setup,
        ['"$MEGATRON_LM_DIR/pretrain_gpt.py"', '"${MEGATRON_ARGS[@]}"'],
    )
