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

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.api import layout_of
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import model_flops_per_token
from planner.errors import ConfigError
from planner.job import build as build_job
from planner.job import cost_options as job_cost_options
from planner.layout import Layout, check_layout
from planner.predict import Prediction, predict
from planner.request import Request
from planner.run_length import run_length
from planner.runtimes import resolve as resolve_runtime
from planner.spec import GpuSpec, ModelSpec, validation_message
from planner.uncertainty import gpu_generation
from planner.units import GiB

TableT = TypeVar("TableT", bound=BaseModel)

Convention = Literal["palm", "megatron_hfu"]
MemoryKind = Literal["device", "reserved"]
STEP_ERROR_GOAL = 0.10
"""The goal: mean |step-time error| at most 10% over the published set."""


class PublishedRun(BaseModel):
    """One row of published_runs.toml (see the file's header for every field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    source_id: str = Field(pattern=r"^[a-z0-9][a-z0-9\-]*$")
    """The publication the run comes from; errors are summarised per source."""
    year: int = Field(ge=2019, le=2030)
    runtime: str
    """The runtime version the run ran on, NAME@VERSION (`planner runtimes`)."""
    settings: dict[str, Any] = {}
    """Cost options where the run departs from its runtime version, as `--set NAME=VALUE`
    takes them: only what the source documents (or, where it is silent, the runtime's
    documented default it ran with)."""
    held_out: bool = False
    """Reported apart: every third run of each source in file order (in the development set
    these rows were examined too)."""
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
    global_batch: int = Field(gt=0)
    seq: int = Field(gt=0)
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
            raise ValueError(f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp} != {self.gpus} GPUs")
        if self.global_batch % (self.dp * self.mbs):
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of dp x mbs")
        published = (self.step_time_s, self.tokens_per_s_per_gpu, self.tflops_per_gpu, self.mfu)
        if all(p is None for p in published):
            raise ValueError("give at least one of step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu")
        job_cost_options(resolve_runtime(self.runtime), None, self.request().options)
        return self

    def request(self) -> Request:
        """The run as a user asks for it: its cluster, runtime version and settings."""
        return Request(
            model=self.model,
            gpu=self.gpu,
            num_gpus=self.gpus,
            global_batch=self.global_batch,
            seq=self.seq,
            gpus_per_node=self.gpus_per_node,
            intra_node_bw_gbps=self.intra_node_bw_gbps,
            inter_node_bw_gbps=self.inter_node_bw_gbps,
            runtime=self.runtime,
            options=self.settings,
        )

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


def cost_options(run: PublishedRun) -> CostOptions:
    """The cost options the run is priced with: its runtime version's, with its settings."""
    return job_cost_options(resolve_runtime(run.runtime), resolve_gpu(run.gpu), run.request().options)


def layout_fields(run: PublishedRun) -> dict:
    """The run's layout as `planner.api.layout_of` (and `planner evaluate`'s flags) take it."""
    return {
        "tp": run.tp,
        "pp": run.pp,
        "cp": run.cp,
        "vpp": run.vpp,
        "mbs": run.mbs,
        "schedule": run.schedule,
        "recompute": run.recompute,
        "sequence_parallel": run.sequence_parallel,
        "zero": run.zero_stage,
        "ep": run.ep,
        "etp": run.etp,
        "stage_layers": run.stage_layers,
    }


def evaluate_command(run: PublishedRun) -> list[str]:
    """The `planner evaluate` command line that predicts the run."""
    request, fields = run.request(), layout_fields(run)
    words = ["planner", "evaluate", *request.cluster_flags()]
    for name in ("tp", "pp", "cp", "vpp", "mbs"):
        words += [f"--{name}", str(fields[name])]
    words += [
        "--schedule",
        run.schedule,
        "--recompute",
        run.recompute,
        "--zero",
        str(run.zero_stage),
        "--sp" if run.sequence_parallel else "--no-sp",
    ]
    if run.ep > 1:
        words += ["--ep", str(run.ep)]
    if run.etp is not None:
        words += ["--etp", str(run.etp)]
    if run.stage_layers is not None:
        words += ["--stage-layers", run_length(run.stage_layers, times="x")]
    return words + request.option_flags()


def build(run: PublishedRun, gpu: GpuSpec | None = None) -> tuple[CostModel, Layout]:
    """The cost model and layout a run describes, as `planner evaluate` builds them from
    `evaluate_command` (LayoutError if they cannot exist); `gpu` in place of the run's preset."""
    request = run.request()
    job = build_job(request, gpu=gpu)
    layout = layout_of(job.spec, request, **layout_fields(run))
    check_layout(layout, job.spec, job.cluster, run.global_batch, run.seq)
    return job.cost_model, layout


def evaluate_run(run: PublishedRun, gpu: GpuSpec | None = None) -> RunResult:
    """Predict one published run through `planner evaluate`'s path and compare it with what
    was published (`gpu` in place of the preset the run names)."""
    model, layout = build(run, gpu)
    prediction = predict(model, layout, run.global_batch, run.seq)
    peak = model.cluster.gpu.peak_flops(model.options.kernels.dtype)
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
        gpu_memory_gib=model.cluster.memory_capacity_bytes / GiB,
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


def residuals_json(results: list[RunResult]) -> str:
    """The development set's step and memory errors as planner/presets/residuals.json holds them
    (planner/uncertainty.py reads them)."""
    rows = [
        {
            "name": r.run.name,
            "runtime": r.run.runtime.partition("@")[0],
            "gpu_generation": gpu_generation(r.run.gpu),
            "gpus": r.run.gpus,
            "moe": resolve_model(r.run.model).is_moe,
            "step_error": round(r.step_error, 6),
            "memory_error": None if r.memory_error is None else round(r.memory_error, 6),
        }
        for r in results
    ]
    body = ",\n".join("    " + json.dumps(row) for row in rows)
    return '{"source": "python tests/bench/published_runs.py --residuals",\n "runs": [\n' + body + "\n]}\n"
