"""Published training runs against planner's predictions.

Each run (tests/bench/published_runs.toml) names a model, a cluster, a layout, what the run
used (attention kernel, precision, dropout, overlap flags, ZeRO) and what its authors
published: an iteration time, a throughput (tokens/s, TFLOP/s or MFU) with the FLOP-counting
convention they used, and peak memory where they give it. `evaluate_run` predicts the same
layout with `planner.predict.predict` (the code path of `planner evaluate`) and compares:

    step error       = predicted step time / published step time - 1
    throughput error = predicted tokens/s / published tokens/s - 1   (= relative MFU error)
    memory error     = predicted peak memory / published peak memory - 1

A negative step error is an optimistic prediction (too short). When a source gives no
iteration time, the published step time is derived from its throughput:
global_batch * seq / (tokens/s per GPU * GPUs), the throughput converted to tokens/s through
the source's own FLOP count, so the error does not depend on how anyone counts FLOPs.

Conventions (FLOPs per token of a `seq`-token sequence):

    palm          6 N_matmul + 12 L a d seq        (Chowdhery et al. 2022, app. B)
    megatron_hfu  24 f L h^2 (1 + seq/6h + V/16Lh), f = 4 under full recompute, else 3
                  (Narayanan et al. 2021, eq. 3 per token; the "TFLOPs" that Megatron-LM
                  papers and Megatron-DeepSpeed report, recomputed forward included)

Pure functions: `load_runs` is the only one that reads a file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AttentionImpl
from planner.cost.grad_accum import WgradAccumulation
from planner.cost.memory import ActivationStorage, CrossEntropy, RecomputeModule, SelectivePolicy
from planner.cost.model import CostModel, CostOptions, CpComm, P2pMode
from planner.cost.moe import MoeDispatcher
from planner.cost.shapes import LossPasses, model_flops_per_token
from planner.cost.step import OptimizerKernels
from planner.cost.tp_backward import TpBackward
from planner.errors import ConfigError
from planner.layout import Layout, check_layout, even_stage_layers, stage_layers_from_counts
from planner.predict import Prediction, predict
from planner.spec import Cluster, ModelSpec, validation_message
from planner.units import GiB, MiB

TableT = TypeVar("TableT", bound=BaseModel)

Convention = Literal["palm", "megatron_hfu"]
Precision = Literal["bf16", "fp16"]
GemmPrecision = Literal["bf16", "fp8"]
MemoryKind = Literal["device", "reserved"]
Runtime = Literal["megatron-lm", "megatron-deepspeed", "nemo", "torchtitan", "composer", "meta-internal",
                  "hai-llm"]
STEP_ERROR_GOAL = 0.10
"""Issue 12's goal: mean |step-time error| at most 10% over the published set."""


class PublishedRun(BaseModel):
    """One row of published_runs.toml (see the file's header for every field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    source_id: str = Field(pattern=r"^[a-z0-9][a-z0-9\-]*$")
    """The publication the run comes from; errors are summarised per source."""
    year: int = Field(ge=2019, le=2030)
    runtime: Runtime
    held_out: bool = False
    """Checked, never tuned on: every third run of each source in file order."""
    model: str
    gpu: str
    gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    intra_node_bw_gbps: float = Field(gt=0)
    inter_node_bw_gbps: float = Field(gt=0)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    cp: int = Field(ge=1)
    dp: int = Field(ge=1)
    vpp: int = Field(ge=1)
    mbs: int = Field(ge=1)
    schedule: str
    recompute: Literal["none", "selective", "full"]
    sequence_parallel: bool
    zero_stage: int = Field(ge=0, le=3)
    stage_layers: list[int] | None = None
    """Transformer layers per virtual stage in model order; even cuts when absent."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel degree (MoE runs)."""
    etp: int | None = Field(default=None, ge=1)
    """Expert tensor-parallel degree (MoE runs; Megatron's default, TP, when absent)."""
    gemm_precision: GemmPrecision = "bf16"
    """GEMM precision of the linear layers (CostOptions.precision): "fp8" for FP8 training."""
    global_batch: int = Field(gt=0)
    seq: int = Field(gt=0)
    attention: AttentionImpl
    """The attention kernel the run used; "unfused" is Megatron's pre-2023 path (QK^T GEMM,
    fused scale-mask-softmax, dropout, AV GEMM), which keeps the b·a·s² scores."""
    precision: Precision
    dropout: bool = False
    """Attention and hidden dropout on (Megatron-LM's GPT default 0.1 before 2023)."""
    flash_attention: bool | None = None
    """Legacy field; when given it must agree with `attention` (flash = not "unfused")."""
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: float = Field(ge=0, le=1)
    tp_backward_overlap: TpBackward = "none"
    """How the backward's TP collectives run (CostOptions): "async" for Megatron-LM since
    2021-09 and Transformer Engine's linears, "async_delayed_wgrad" with --delay-wgrad-compute;
    "none" (every collective exposed) where the runtime has no such path or it is unknown."""
    grad_reduce_bytes: int = Field(ge=2, le=4)
    elementwise_traffic: float = Field(default=1.0, ge=1.0)
    """Memory-bound traffic relative to fused kernels (CostOptions): 3.3 for eager PyTorch."""
    cp_comm: CpComm = "ring"
    """How context parallelism moves K and V (CostOptions): Llama 3's is "all_gather"."""
    selective_policy: SelectivePolicy = "core_attention"
    """What `selective` recompute runs (CostOptions): torchtitan's per-op SAC is "every_other_matmul"."""
    p2p_mode: P2pMode = "overlapped"
    """How pipeline sends and receives run (CostOptions): "blocking" for Megatron-LM's
    batch_isend_irecv + synchronize, "deepspeed" for DeepSpeed's PipelineEngine."""
    bf16_optimizer: bool = False
    """DeepSpeed's BF16_Optimizer (CostOptions): bf16 grads kept beside fp32 ones, the flat fp32
    grads all-reduced cast to the communication dtype (`grad_reduce_bytes`; bf16 by default)."""
    launch_blocking: bool = False
    """CUDA_LAUNCH_BLOCKING=1 (CostOptions): host and GPU time add up per kernel."""
    cuda_context_mib: float | None = Field(default=None, gt=0)
    """The CUDA context's device memory as the source measured it on its own stack (MiB,
    CostOptions.cuda_context_bytes); the cost model's default when absent."""
    optimizer_kernels: OptimizerKernels = "fused"
    """The Adam step and gradient clipping (CostOptions): torchtitan's default torch AdamW is "foreach"."""
    fsdp2: bool = False
    """ZeRO-3 runs as FSDP2 (CostOptions): torchtitan's fully_shard."""
    fsdp1_grad_cat: bool = False
    """ZeRO-3 runs as FSDP1 with its flat gradient assembled by split's backward (CostOptions): composer."""
    sp_seq_dim_copies: bool = False
    """DTensor's sequence parallelism copies each gathered activation between dim 0 and the
    sequence dim (CostOptions): torchtitan's TP plan."""
    recompute_early_stop: bool = False
    """Full recompute stops once the backward's tensors are back (CostOptions): torch's
    non-reentrant checkpoint, torchtitan's FullAC."""
    sac_fused_qkv: bool = True
    """torchtitan's per-op checkpointing sees one qkv matmul (CostOptions); its 2024 Llama ran three."""
    cross_entropy: CrossEntropy = "fused"
    """How the loss is computed (CostOptions): torchtitan's eager `cross_entropy(pred.float(), ...)` is "eager_fp32"."""
    loss_passes: LossPasses = "fused"
    """The loss's passes over the logits (CostOptions): Megatron-LM's op-by-op
    `_VocabParallelCrossEntropy` on `logits.float()` is "vocab_parallel_fp32"."""
    rope_fusion: bool = True
    """RoPE as one fused kernel (CostOptions); False: megatron-core's op-by-op
    `apply_rotary_pos_emb_bshd` (NeMo 1.x without `apply_rope_fusion`)."""
    main_grad_cast: bool = False
    """Megatron-LM's fp16 optimizer casts 16-bit gradients into fp32 main gradients (CostOptions)."""
    ddp_grad_copy_passes: int = Field(default=0, ge=0, le=3)
    """The DDP's read-and-write passes over the gradients around the all-reduce (CostOptions):
    2 for torch DDP, 3 for Megatron-LM's 2021 local DDP without contiguous buffers."""
    wgrad_accumulation: WgradAccumulation | None = None
    """How weight gradients accumulate over micro-batches (CostOptions): "autograd" where the
    runtime adds each micro-batch's new gradient into `param.grad` (Megatron-LM before 2022).
    None: the runtime's way (`FUSED_WGRAD_RUNTIMES` accumulate in the GEMM, the others take
    each micro-batch's new gradient as it comes)."""
    recompute_modules: list[RecomputeModule] = ["core_attn"]
    """What `selective` recompute re-runs (CostOptions): Megatron-LM's --recompute-modules;
    DeepSeek-V3's RMSNorm, MLA up-projection and SwiGLU recompute is layernorm, mla_up_proj, moe_act."""
    activation_storage: ActivationStorage = "default"
    """How saved activations are stored (CostOptions): DeepSeek-V3's FP8 / E5M6 caching is "deepseek_fp8"."""
    parameter_copies: int = Field(default=1, ge=1, le=2)
    """Copies of the transformer layers' training state a rank keeps (CostOptions): 2 for DualPipe."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """The MoE token dispatcher (CostOptions): "deepep" for Megatron's flex dispatcher on DeepEP."""
    moe_ep_overlap: bool = False
    """Megatron's --overlap-moe-expert-parallel-comm, combined 1F1B (CostOptions)."""
    megatron_moe_ops: bool = False
    """An MoE block charges the ops Megatron-core's MoE layer launches on DeepEP (CostOptions)."""
    step_time_s: float | None = Field(default=None, gt=0)
    """Published seconds per iteration (one optimizer step over the global batch)."""
    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    tflops_per_gpu: float | None = Field(default=None, gt=0)
    mfu: float | None = Field(default=None, gt=0, lt=1)
    memory_gib: float | None = Field(default=None, gt=0)
    memory_kind: MemoryKind = "device"
    """What the published memory counts: the device memory in use (nvidia-smi), or the caching
    allocator's peak reserved bytes (torch.cuda.max_memory_reserved, what torchtitan logs)."""
    flops_convention: Convention
    source: str = Field(min_length=10)
    """Paper or document, and the table / figure / row the numbers come from."""
    url: str = Field(pattern=r"^https://")
    assumptions: str = Field(min_length=40)

    @model_validator(mode="after")
    def _consistent(self) -> PublishedRun:
        if self.tp * self.pp * self.cp * self.dp != self.gpus:
            raise ValueError(
                f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp} != {self.gpus} GPUs"
            )
        if self.global_batch % (self.dp * self.mbs):
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of dp x mbs")
        published = (self.step_time_s, self.tokens_per_s_per_gpu, self.tflops_per_gpu, self.mfu)
        if all(p is None for p in published):
            raise ValueError("give at least one of step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu")
        if self.flash_attention is not None and self.flash_attention != (self.attention != "unfused"):
            raise ValueError(
                f"flash_attention = {self.flash_attention} contradicts attention = {self.attention!r}"
            )
        return self

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp * self.mbs)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """A published run, its prediction, and the comparison."""

    run: PublishedRun
    prediction: Prediction
    predicted_step_time_s: float
    published_step_time_s: float
    predicted_tokens_per_s_per_gpu: float
    published_tokens_per_s_per_gpu: float
    predicted_mfu: float
    """planner's (PaLM) convention."""
    published_mfu: float
    """The published throughput in planner's (PaLM) convention."""
    peak_memory_gib: float
    """Device memory in use at the peak (what must fit in the GPU)."""
    gpu_memory_gib: float
    compared_memory_gib: float
    """The predicted counterpart of what the run publishes (`PublishedRun.memory_kind`)."""

    @property
    def step_error(self) -> float:
        """Relative error of the predicted step time (negative: predicted too short)."""
        return self.predicted_step_time_s / self.published_step_time_s - 1.0

    @property
    def throughput_error(self) -> float:
        """Relative error of the predicted throughput (= of the MFU, same convention)."""
        return self.predicted_tokens_per_s_per_gpu / self.published_tokens_per_s_per_gpu - 1.0

    @property
    def memory_error(self) -> float | None:
        """Relative error of the predicted peak memory, where the source publishes one."""
        if self.run.memory_gib is None:
            return None
        return self.compared_memory_gib / self.run.memory_gib - 1.0

    @property
    def fits(self) -> bool:
        return self.peak_memory_gib <= self.gpu_memory_gib


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """Step-time (and memory) errors over a group of runs."""

    runs: int
    mean_abs: float
    mean_signed: float
    max_abs: float
    memory_runs: int
    memory_mean_abs: float | None


def load_tables(path: Path, key: str, model: type[TableT], what: str) -> list[TableT]:
    """Every [[key]] table of a TOML data file as `model`, each checked: an unreadable file or a
    table that fails the schema is one ConfigError naming `what` or the table's number."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from None
    tables = []
    for i, raw in enumerate(data.get(key, [])):
        try:
            tables.append(model(**raw))
        except ValidationError as exc:
            raise ConfigError(validation_message(exc, f"{path} {key} #{i + 1}")) from None
    return tables


def load_runs(path: Path) -> list[PublishedRun]:
    """Every [[run]] table of a published-runs TOML file."""
    runs = load_tables(path, "run", PublishedRun, "published runs")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: run names repeat: {sorted(n for n in names if names.count(n) > 1)}")
    return runs


def held_out_by_rule(runs: list[PublishedRun]) -> set[str]:
    """The runs the held-out rule picks: every third run of each source in file order
    (its 3rd, 6th, 9th, ...), fixed before any error was looked at."""
    seen: dict[str, int] = {}
    picked = set()
    for run in runs:
        seen[run.source_id] = seen.get(run.source_id, 0) + 1
        if seen[run.source_id] % 3 == 0:
            picked.add(run.name)
    return picked


def flops_per_token(spec: ModelSpec, seq: int, convention: Convention, recompute: str) -> float:
    """FLOPs one trained token is credited with under `convention`."""
    if convention == "palm":
        return model_flops_per_token(spec, seq)
    if convention == "megatron_hfu":  # Narayanan et al. 2021 eq. 3 / (B s), factor 4 with recompute
        h, layers, vocab = spec.hidden_size, spec.num_layers, spec.vocab_size
        factor = 4 if recompute == "full" else 3
        return 24 * factor * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    raise ValueError(f"unknown FLOP convention {convention!r}")


def published_tokens_per_s_per_gpu(run: PublishedRun, spec: ModelSpec, peak_flops: float) -> float:
    """The published throughput as tokens/s per GPU: from the iteration time where the
    source gives one, else from its throughput through the source's own FLOP count."""
    if run.step_time_s is not None:
        return run.tokens_per_step / (run.step_time_s * run.gpus)
    return throughput_as_tokens_per_s_per_gpu(run, spec, peak_flops)


def throughput_as_tokens_per_s_per_gpu(run: PublishedRun, spec: ModelSpec, peak_flops: float) -> float:
    """The published tokens/s, TFLOP/s or MFU (first given) as tokens/s per GPU."""
    if run.tokens_per_s_per_gpu is not None:
        return run.tokens_per_s_per_gpu
    per_token = flops_per_token(spec, run.seq, run.flops_convention, run.recompute)
    if run.tflops_per_gpu is not None:
        return run.tflops_per_gpu * 1e12 / per_token
    if run.mfu is None:
        raise ValueError(f"{run.name}: no published throughput")
    return run.mfu * peak_flops / per_token


FUSED_WGRAD_RUNTIMES = ("megatron-lm", "nemo")
"""Runtimes whose weight-gradient GEMMs accumulate into the main gradient in place (Megatron-LM's
--gradient-accumulation-fusion, on by default since 2022; NeMo's `gradient_accumulation_fusion`),
unless a run names otherwise."""


def cost_options(run: PublishedRun) -> CostOptions:
    """The CostOptions that describe what the run used: its attention kernel, precision,
    dropout, overlap flags and runtime behaviours."""
    return CostOptions(
        dtype=run.precision,
        precision=run.gemm_precision,
        attention=run.attention,
        dropout=run.dropout,
        overlap_grad_reduce=run.overlap_grad_reduce,
        overlap_param_gather=run.overlap_param_gather,
        tp_comm_overlap=run.tp_comm_overlap,
        tp_backward_overlap=run.tp_backward_overlap,
        grad_reduce_bytes=run.grad_reduce_bytes,
        elementwise_traffic=run.elementwise_traffic,
        selective_policy=run.selective_policy,
        cross_entropy=run.cross_entropy,
        loss_passes=run.loss_passes,
        rope_fusion=run.rope_fusion,
        main_grad_cast=run.main_grad_cast,
        ddp_grad_copy_passes=run.ddp_grad_copy_passes,
        wgrad_accumulation=run.wgrad_accumulation or (
            "fused" if run.runtime in FUSED_WGRAD_RUNTIMES else "none"),
        optimizer_kernels=run.optimizer_kernels,
        fsdp2=run.fsdp2,
        fsdp1_grad_cat=run.fsdp1_grad_cat,
        sac_fused_qkv=run.sac_fused_qkv,
        sp_seq_dim_copies=run.sp_seq_dim_copies,
        recompute_early_stop=run.recompute_early_stop,
        cp_comm=run.cp_comm,
        p2p_mode=run.p2p_mode,
        bf16_optimizer=run.bf16_optimizer,
        launch_blocking=run.launch_blocking,
        recompute_modules=tuple(run.recompute_modules),
        activation_storage=run.activation_storage,
        parameter_copies=run.parameter_copies,
        moe_dispatcher=run.moe_dispatcher,
        moe_ep_overlap=run.moe_ep_overlap,
        megatron_moe_ops=run.megatron_moe_ops,
        **({} if run.cuda_context_mib is None else {"cuda_context_bytes": run.cuda_context_mib * MiB}),
    )


def build(run: PublishedRun) -> tuple[CostModel, Layout]:
    """The cost model and layout a run describes (LayoutError if they cannot exist)."""
    spec = resolve_model(run.model)
    cluster = Cluster.of(
        resolve_gpu(run.gpu),
        run.gpus,
        gpus_per_node=run.gpus_per_node,
        intra_node_bw_gbps=run.intra_node_bw_gbps,
        inter_node_bw_gbps=run.inter_node_bw_gbps,
    )
    if run.stage_layers is None:
        cuts = even_stage_layers(spec.num_layers, run.pp, run.vpp, run.schedule)
    else:
        cuts = stage_layers_from_counts(run.stage_layers, spec.num_layers, run.pp, run.vpp, run.schedule)
    layout = Layout(
        tp=run.tp, pp=run.pp, dp=run.dp, cp=run.cp, vpp=run.vpp, mbs=run.mbs,
        num_microbatches=run.num_microbatches, schedule=run.schedule,
        recompute=(run.recompute,) * run.pp, sequence_parallel=run.sequence_parallel and run.tp > 1,
        zero_stage=run.zero_stage, stage_layers=cuts, ep=run.ep, etp=run.etp,
    )
    check_layout(layout, spec, cluster, run.global_batch, run.seq)
    return CostModel(spec, cluster, cost_options(run)), layout


def evaluate_run(run: PublishedRun) -> RunResult:
    """Predict one published run and compare it with what was published."""
    model, layout = build(run)
    prediction = predict(model, layout, run.global_batch, run.seq)
    peak = model.cluster.gpu.peak_flops(model.options.dtype)
    published = published_tokens_per_s_per_gpu(run, model.spec, peak)
    palm = model_flops_per_token(model.spec, run.seq)
    return RunResult(
        run=run,
        prediction=prediction,
        predicted_step_time_s=prediction.step_time_s,
        published_step_time_s=run.tokens_per_step / (published * run.gpus),
        predicted_tokens_per_s_per_gpu=prediction.tokens_per_s / run.gpus,
        published_tokens_per_s_per_gpu=published,
        predicted_mfu=prediction.mfu,
        published_mfu=published * palm / peak,
        peak_memory_gib=prediction.peak_memory_bytes / GiB,
        gpu_memory_gib=model.cluster.memory_limit_bytes / GiB,
        compared_memory_gib=_predicted_memory_bytes(prediction, run.memory_kind) / GiB,
    )


def _predicted_memory_bytes(prediction: Prediction, kind: MemoryKind) -> float:
    """The busiest rank's device memory in use, or its caching allocator's reserved bytes."""
    if kind == "reserved":
        return max(m.reserved for m in prediction.memory)
    return prediction.peak_memory_bytes


def evaluate_all(runs: list[PublishedRun]) -> list[RunResult]:
    return [evaluate_run(r) for r in runs]


def summarize(results: list[RunResult]) -> ErrorSummary:
    """Mean |step error|, mean signed step error, worst |step error| and mean |memory
    error| (over the runs that publish memory) of a non-empty group of results."""
    if not results:
        raise ValueError("no results to summarise")
    errors = [r.step_error for r in results]
    memory = [abs(e) for r in results if (e := r.memory_error) is not None]
    return ErrorSummary(
        runs=len(errors),
        mean_abs=sum(abs(e) for e in errors) / len(errors),
        mean_signed=sum(errors) / len(errors),
        max_abs=max(abs(e) for e in errors),
        memory_runs=len(memory),
        memory_mean_abs=sum(memory) / len(memory) if memory else None,
    )


def by_source(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Results grouped by source, in file order of each source's first run."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.run.source_id, []).append(r)
    return groups


def result_row(result: RunResult) -> dict[str, object]:
    """One result as plain JSON-ready values."""
    run = result.run
    return {
        "name": run.name,
        "source_id": run.source_id,
        "held_out": run.held_out,
        "predicted_step_time_s": round(result.predicted_step_time_s, 4),
        "published_step_time_s": round(result.published_step_time_s, 4),
        "published_step_time_as_stated": run.step_time_s,
        "step_error": round(result.step_error, 4),
        "throughput_error": round(result.throughput_error, 4),
        "predicted_mfu": round(result.predicted_mfu, 4),
        "published_mfu": round(result.published_mfu, 4),
        "published_mfu_as_stated": run.mfu,
        "published_tflops_per_gpu_as_stated": run.tflops_per_gpu,
        "flops_convention": run.flops_convention,
        "predicted_tokens_per_s_per_gpu": round(result.predicted_tokens_per_s_per_gpu, 1),
        "published_tokens_per_s_per_gpu": round(result.published_tokens_per_s_per_gpu, 1),
        "predicted_peak_memory_gib": round(result.peak_memory_gib, 2),
        "predicted_compared_memory_gib": round(result.compared_memory_gib, 2),
        "published_memory_gib": run.memory_gib,
        "published_memory_kind": run.memory_kind,
        "memory_error": None if result.memory_error is None else round(result.memory_error, 4),
        "gpu_memory_gib": round(result.gpu_memory_gib, 2),
        "time_breakdown_s": {k: round(v, 4) for k, v in result.prediction.time_breakdown_s.items()},
        "source": run.source,
        "url": run.url,
    }
