"""Published training runs against planner's predictions.

Each run (tests/bench/published_runs.toml) names a model, a cluster, a layout, the runtime's
behaviours and the throughput its authors published, with the FLOP-counting convention they
used. `evaluate_run` predicts the same layout with `planner.predict.predict` and compares
throughput: the published figure (tokens/s, TFLOP/s or MFU, whichever the source gives) is
converted to tokens/s per GPU through the source's own FLOP count, so the error is the same
quantity on both sides and does not depend on how anyone counts FLOPs:

    error = predicted tokens/s / published tokens/s - 1  (= relative MFU error, one convention)

MFU is reported in planner's (PaLM) convention on both sides.

Conventions (FLOPs per token of a `seq`-token sequence):

    palm          6 N_matmul + 12 L a d seq        (Chowdhery et al. 2022, app. B)
    megatron_hfu  24 f L h^2 (1 + seq/6h + V/16Lh), f = 4 under full recompute, else 3
                  (Narayanan et al. 2021, eq. 3 per token; the "TFLOPs" that
                  Megatron-DeepSpeed logs, recomputed forward included)

Pure functions: `load_runs` is the only one that reads a file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.memory import SelectivePolicy
from planner.cost.model import CostModel, CostOptions, CpComm
from planner.cost.shapes import model_flops_per_token
from planner.errors import ConfigError
from planner.layout import Layout, check_layout, even_stage_layers, stage_layers_from_counts
from planner.predict import Prediction, predict
from planner.spec import Cluster, ModelSpec, validation_message
from planner.units import GiB

Convention = Literal["palm", "megatron_hfu"]
MFU_GOAL = 0.15
"""The issue's goal: every prediction within 15% (relative) of the published figure."""


class PublishedRun(BaseModel):
    """One row of published_runs.toml (see the file's header for every field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
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
    recompute: str
    sequence_parallel: bool
    zero_stage: int = Field(ge=0, le=3)
    stage_layers: list[int] | None = None
    """Transformer layers per virtual stage in model order; even cuts when absent."""
    global_batch: int = Field(gt=0)
    seq: int = Field(gt=0)
    flash_attention: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: float = Field(ge=0, le=1)
    grad_reduce_bytes: int = Field(ge=2, le=4)
    elementwise_traffic: float = Field(default=1.0, ge=1.0)
    """Memory-bound traffic relative to fused kernels (CostOptions): 3.3 for eager PyTorch."""
    cp_comm: CpComm = "ring"
    """How context parallelism moves K and V (CostOptions): Llama 3's is "all_gather"."""
    selective_policy: SelectivePolicy = "core_attention"
    """What `selective` recompute runs (CostOptions): torchtitan's per-op SAC is "every_other_matmul"."""
    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    tflops_per_gpu: float | None = Field(default=None, gt=0)
    mfu: float | None = Field(default=None, gt=0, lt=1)
    memory_gib: float | None = Field(default=None, gt=0)
    flops_convention: Convention
    source: str
    url: str
    assumptions: str

    @model_validator(mode="after")
    def _consistent(self) -> PublishedRun:
        if self.tp * self.pp * self.cp * self.dp != self.gpus:
            raise ValueError(
                f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp} != {self.gpus} GPUs"
            )
        if self.tokens_per_s_per_gpu is None and self.tflops_per_gpu is None and self.mfu is None:
            raise ValueError("give at least one of tokens_per_s_per_gpu, tflops_per_gpu, mfu")
        return self

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp * self.mbs)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """A published run, its prediction, and the comparison."""

    run: PublishedRun
    prediction: Prediction
    predicted_tokens_per_s_per_gpu: float
    published_tokens_per_s_per_gpu: float
    predicted_mfu: float
    """planner's (PaLM) convention."""
    published_mfu: float
    """The published throughput in planner's (PaLM) convention."""
    peak_memory_gib: float
    gpu_memory_gib: float

    @property
    def error(self) -> float:
        """Relative error of the predicted throughput (= of the MFU, same convention)."""
        return self.predicted_tokens_per_s_per_gpu / self.published_tokens_per_s_per_gpu - 1.0

    @property
    def fits(self) -> bool:
        return self.peak_memory_gib <= self.gpu_memory_gib


def load_runs(path: Path) -> list[PublishedRun]:
    """Every [[run]] table of a published-runs TOML file."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read published runs {path}: {exc}") from None
    runs = []
    for i, row in enumerate(data.get("run", [])):
        try:
            runs.append(PublishedRun(**row))
        except ValidationError as exc:
            raise ConfigError(validation_message(exc, f"{path} run #{i + 1}")) from None
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: run names repeat: {names}")
    return runs


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
    """The published throughput as tokens/s per GPU, through the source's own FLOP count."""
    if run.tokens_per_s_per_gpu is not None:
        return run.tokens_per_s_per_gpu
    per_token = flops_per_token(spec, run.seq, run.flops_convention, run.recompute)
    if run.tflops_per_gpu is not None:
        return run.tflops_per_gpu * 1e12 / per_token
    assert run.mfu is not None
    return run.mfu * peak_flops / per_token


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
    options = CostOptions(
        attention="flash2" if run.flash_attention else "unfused",
        overlap_grad_reduce=run.overlap_grad_reduce,
        overlap_param_gather=run.overlap_param_gather,
        tp_comm_overlap=run.tp_comm_overlap,
        grad_reduce_bytes=run.grad_reduce_bytes,
        elementwise_traffic=run.elementwise_traffic,
        selective_policy=run.selective_policy,
        cp_comm=run.cp_comm,
    )
    if run.stage_layers is None:
        cuts = even_stage_layers(spec.num_layers, run.pp, run.vpp, run.schedule)
    else:
        cuts = stage_layers_from_counts(run.stage_layers, spec.num_layers, run.pp, run.vpp, run.schedule)
    layout = Layout(
        tp=run.tp, pp=run.pp, dp=run.dp, cp=run.cp, vpp=run.vpp, mbs=run.mbs,
        num_microbatches=run.num_microbatches, schedule=run.schedule,
        recompute=(run.recompute,) * run.pp, sequence_parallel=run.sequence_parallel and run.tp > 1,
        zero_stage=run.zero_stage, stage_layers=cuts,
    )
    check_layout(layout, spec, cluster, run.global_batch, run.seq)
    return CostModel(spec, cluster, options), layout


def evaluate_run(run: PublishedRun) -> RunResult:
    """Predict one published run and compare it with what was published."""
    model, layout = build(run)
    prediction = predict(model, layout, run.global_batch, run.seq)
    peak = model.cluster.gpu.peak_flops(model.options.dtype)
    published = published_tokens_per_s_per_gpu(run, model.spec, peak)
    predicted = prediction.tokens_per_s / run.gpus
    palm = model_flops_per_token(model.spec, run.seq)
    return RunResult(
        run=run,
        prediction=prediction,
        predicted_tokens_per_s_per_gpu=predicted,
        published_tokens_per_s_per_gpu=published,
        predicted_mfu=prediction.mfu,
        published_mfu=published * palm / peak,
        peak_memory_gib=prediction.peak_memory_bytes / GiB,
        gpu_memory_gib=model.cluster.memory_limit_bytes / GiB,
    )


def evaluate_all(runs: list[PublishedRun]) -> list[RunResult]:
    return [evaluate_run(r) for r in runs]


def mean_abs_error(results: list[RunResult]) -> float:
    """Mean absolute relative error over the runs."""
    return sum(abs(r.error) for r in results) / len(results)


def result_row(result: RunResult) -> dict[str, object]:
    """One result as plain JSON-ready values."""
    run = result.run
    return {
        "name": run.name,
        "predicted_mfu": round(result.predicted_mfu, 4),
        "published_mfu": round(result.published_mfu, 4),
        "published_mfu_as_stated": run.mfu,
        "published_tflops_per_gpu_as_stated": run.tflops_per_gpu,
        "flops_convention": run.flops_convention,
        "error": round(result.error, 4),
        "predicted_tokens_per_s_per_gpu": round(result.predicted_tokens_per_s_per_gpu, 1),
        "published_tokens_per_s_per_gpu": round(result.published_tokens_per_s_per_gpu, 1),
        "predicted_peak_memory_gib": round(result.peak_memory_gib, 2),
        "published_memory_gib": run.memory_gib,
        "gpu_memory_gib": round(result.gpu_memory_gib, 2),
        "time_breakdown_s": {k: round(v, 4) for k, v in result.prediction.time_breakdown_s.items()},
        "source": run.source,
        "url": run.url,
    }
