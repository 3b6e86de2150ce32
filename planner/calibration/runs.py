"""From a plan file and a log's steady state to a run to fit, and from a fit to the
calibration file: pure functions (the CLI reads and writes the files)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.calibration.fit import BOUNDS, KNOBS, FitResult, Residual, Run
from planner.calibration.logs import Measured
from planner.calibration.schema import (
    CalibrationFile,
    ClusterEntry,
    FieldEntry,
    KnobEntry,
    MemoryResidual,
    PlanSummary,
    RunEntry,
    RunResidual,
)
from planner.cost.shapes import model_flops_per_token
from planner.errors import ConfigError, PlannerError
from planner.job import build
from planner.layout import check_layout, layout_from_entry
from planner.plan import PlanFile
from planner.request import Request
from planner.spec import GpuEfficiency
from planner.units import GiB
from planner.version import __version__

LOG_RUNTIMES = {"megatron": None, "torchtitan": "torchtitan"}
"""The runtime (planner/runtimes/) a log format implies where the plan's request names none;
a Megatron-LM log keeps planner's defaults, which are Megatron-LM's kernels."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """Where a run came from: its log (path, hash, what it measured) and its plan file."""

    log_path: str
    log_sha256: str
    plan_path: str
    measured: Measured


def run_from_plan(document: PlanFile, measured: Measured, name: str, origin: str) -> Run:
    """The run a log measured: the plan file's first plan, on the job its request describes
    (cluster overrides, runtime version, settings; the log's runtime where the request names
    none), or on its model and cluster costed as the log's runtime runs it when the file keeps
    no request."""
    if document.model is None or document.cluster is None:
        raise ConfigError(f"{origin} has no model or cluster: write it with `planner plan/evaluate -o`")
    if not document.plans:
        raise ConfigError(f"{origin} has no plans")
    entry = document.plans[0]
    if measured.global_batch is not None and measured.global_batch != entry.global_batch:
        raise PlannerError(
            f"the log trains global batch {measured.global_batch}, {origin} global batch {entry.global_batch}: "
            "write the plan of the layout the log ran (planner evaluate ... -o)"
        )
    summary = document.cluster
    request = document.request or Request(
        model=document.model.name, gpu=summary.gpu, num_gpus=summary.num_gpus, gpus_per_node=summary.gpus_per_node
    )
    request = request.model_copy(
        update={
            "runtime": request.runtime or LOG_RUNTIMES[measured.format],
            "profile": None,
            "profile_only": False,
            "calibration": None,
        }
    )
    job = build(request, spec=document.model)
    layout = layout_from_entry(entry)
    check_layout(layout, document.model, job.cluster, entry.global_batch, entry.seq)
    tokens = entry.global_batch * entry.seq
    return Run(
        name=name,
        spec=document.model,
        cluster=job.cluster,
        layout=layout,
        global_batch=entry.global_batch,
        seq=entry.seq,
        options=job.cost_model.options,
        measured_step_time_s=measured.step_time_for(tokens, layout.num_gpus),
    )


FLOPS_TOLERANCE = 0.05
"""Relative gap between the log's FLOPs per token and the plan's model beyond which the plan
is probably not the run's model or sequence length. Both runtimes count what the planner's
`model_flops_per_token` counts (PaLM: 6 x matmul weights + 12 L d s, the full attention square;
Megatron-LM's `num_floating_point_operations`, torchtitan's `get_nparams_and_flops`); they
differ from it only by vocabulary padding and rounding."""


def consistency_warnings(run: Run, measured: Measured) -> list[str]:
    """What in the log disagrees with the plan without making the fit impossible."""
    if measured.tflops_per_gpu is None:
        return []
    tokens_per_s_per_gpu = run.global_batch * run.seq / (run.measured_step_time_s * run.layout.num_gpus)
    logged = measured.tflops_per_gpu * 1e12 / tokens_per_s_per_gpu
    planned = model_flops_per_token(run.spec, run.seq)
    if abs(logged / planned - 1) <= FLOPS_TOLERANCE:
        return []
    return [
        f"{run.name}: the log's throughput implies {logged / 1e9:.1f} GFLOP per token, the plan's "
        f"{run.spec.name} at seq {run.seq} has {planned / 1e9:.1f}: is the plan the model and sequence "
        "length the log trained?"
    ]


def check_one_gpu(runs: list[Run]) -> None:
    """PlannerError unless every run is on the same GPU preset."""
    names = sorted({r.cluster.gpu.name for r in runs})
    if len(names) > 1:
        raise PlannerError(f"calibrate runs of one GPU at a time; the plans are on {', '.join(names)}")


def calibration_file(runs: list[Run], sources: list[Source], result: FitResult) -> CalibrationFile:
    """The calibration document of a fit."""
    gpu = runs[0].cluster.gpu
    fitted = [k.name for k in result.knobs if k.fitted]
    source = (
        f"calibrated from {len(runs)} run{'s' if len(runs) > 1 else ''} by planner calibrate --from-log "
        f"(fitted: {', '.join(fitted) or 'nothing'}); prior: {result.prior.source}"
    )
    efficiency = GpuEfficiency(**{**result.efficiency.model_dump(), "source": source})
    fields = {
        field: FieldEntry(prior=getattr(result.prior, field), value=getattr(efficiency, field), bounds=BOUNDS[field])
        for names in KNOBS.values()
        for field in names
    }
    residuals = [_residual(res, src) for res, src in zip(result.residuals, sources)]
    return CalibrationFile(
        gpu=gpu.name,
        cluster=ClusterEntry(
            gpu=gpu.name, gpus_per_node=runs[0].cluster.gpus_per_node, num_gpus=[r.cluster.num_gpus for r in runs]
        ),
        knobs=[
            KnobEntry(
                name=k.name,
                fields=list(k.fields),
                value=k.value,
                bounds=k.bounds,
                fitted=k.fitted,
                reason=k.reason,
                sensitivity=k.sensitivity,
            )
            for k in result.knobs
        ],
        fields=fields,
        efficiency=efficiency,
        residuals=residuals,
        rms_error_before_pct=_rms([r.before_pct for r in result.residuals]),
        rms_error_after_pct=_rms([r.after_pct for r in result.residuals]),
        runs=[_run_entry(run, src) for run, src in zip(runs, sources)],
        memory_scale=memory_scale(residuals),
        planner_version=__version__,
    )


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


def memory_scale(residuals: list[RunResidual]) -> float | None:
    """The largest measured over predicted max reserved memory of the runs that logged it, at
    least 1; None when none did."""
    ratios = [
        m.measured_max_reserved_gib / m.predicted_reserved_gib
        for m in (r.memory for r in residuals)
        if m.measured_max_reserved_gib and m.predicted_reserved_gib
    ]
    return round(max(1.0, *ratios), 4) if ratios else None


def _residual(res: Residual, src: Source) -> RunResidual:
    peak = res.after.peak_memory_bytes / GiB
    reserved = max(m.reserved for m in res.after.memory) / GiB
    measured = src.measured.max_reserved_gib
    return RunResidual(
        log=src.log_path,
        measured_step_time_s=res.measured_s,
        predicted_before_s=res.before_s,
        predicted_after_s=res.after_s,
        error_before_pct=res.before_pct,
        error_after_pct=res.after_pct,
        memory=MemoryResidual(
            measured_max_reserved_gib=measured,
            measured_max_allocated_gib=src.measured.max_allocated_gib,
            predicted_peak_gib=peak,
            predicted_reserved_gib=reserved,
            error_pct=100.0 * (reserved / measured - 1) if measured else None,
        ),
    )


def _run_entry(run: Run, src: Source) -> RunEntry:
    layout = run.layout
    modes = sorted(set(layout.recompute))
    return RunEntry(
        log_path=src.log_path,
        log_sha256=src.log_sha256,
        format=src.measured.format,
        plan_path=src.plan_path,
        plan=PlanSummary(
            model=run.spec.name,
            tp=layout.tp,
            pp=layout.pp,
            dp=layout.dp,
            cp=layout.cp,
            vpp=layout.vpp,
            mbs=layout.mbs,
            num_microbatches=layout.num_microbatches,
            global_batch=run.global_batch,
            seq=run.seq,
            schedule=layout.schedule,
            recompute=modes[0] if len(modes) == 1 else list(layout.recompute),
            sequence_parallel=layout.sequence_parallel,
            zero_stage=layout.zero_stage,
        ),
        num_gpus=run.cluster.num_gpus,
        gpus_per_node=run.cluster.gpus_per_node,
        steps_used=list(src.measured.steps_used),
        measured_tokens_per_s_per_gpu=src.measured.tokens_per_s_per_gpu,
        measured_tflops_per_gpu=src.measured.tflops_per_gpu,
        measured_mfu=src.measured.mfu,
    )
