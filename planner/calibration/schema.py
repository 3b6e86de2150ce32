"""The calibration file `planner calibrate --from-log` writes and `--calibration FILE` reads.

JSON, schema-versioned: the GPU preset and cluster it describes, each knob with its factor,
bounds and verdict, the resulting efficiency fields with their prior values and bounds, the
residual of every run before and after the fit, and the runs themselves (log path and
SHA-256, the plan they ran).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import ConfigError
from planner.output import write_atomic
from planner.spec import GpuEfficiency, validation_message

SCHEMA_VERSION = 1
FROZEN = ConfigDict(frozen=True, extra="forbid")


class KnobEntry(BaseModel):
    """One knob: a factor on the prior values of some efficiency fields."""

    model_config = FROZEN

    name: str
    fields: list[str]
    value: float = Field(gt=0)
    """The factor (1.0: the prior)."""
    prior: float = 1.0
    bounds: tuple[float, float]
    """Factor range that keeps every field within its physical bounds."""
    fitted: bool
    reason: str
    sensitivity: float
    """Norm over the runs of d ln(step time) / d ln(factor), beyond the knobs fitted before it."""


class FieldEntry(BaseModel):
    """One efficiency field: its preset value, the calibrated value and its physical range."""

    model_config = FROZEN

    prior: float
    value: float
    bounds: tuple[float, float]


class MemoryResidual(BaseModel):
    """Peak memory per GPU: what the log reports and what the planner predicts, GiB."""

    model_config = FROZEN

    measured_max_reserved_gib: float | None = None
    measured_max_allocated_gib: float | None = None
    predicted_peak_gib: float
    """Device memory in use at the peak (the caching allocator's segments, the CUDA context
    and NCCL's buffers)."""
    predicted_reserved_gib: float | None = None
    """The caching allocator's segments at the peak: what max reserved measures."""
    error_pct: float | None = None
    """Predicted over measured max reserved, minus one, in percent."""


class RunResidual(BaseModel):
    """One run's step time: measured, and predicted before and after the fit."""

    model_config = FROZEN

    log: str
    measured_step_time_s: float
    predicted_before_s: float
    predicted_after_s: float
    error_before_pct: float
    error_after_pct: float
    memory: MemoryResidual


class PlanSummary(BaseModel):
    """The layout a run used (from its plan file)."""

    model_config = FROZEN

    model: str
    tp: int
    pp: int
    dp: int
    cp: int
    vpp: int
    mbs: int
    num_microbatches: int
    global_batch: int
    seq: int
    schedule: str
    recompute: str | list[str]
    sequence_parallel: bool
    zero_stage: int


class RunEntry(BaseModel):
    """One run the knobs were fitted on."""

    model_config = FROZEN

    log_path: str
    log_sha256: str
    format: Literal["megatron", "torchtitan"]
    plan_path: str
    plan: PlanSummary
    num_gpus: int
    gpus_per_node: int
    steps_used: list[int]
    """The progress reports the steady-state medians are over."""
    measured_tokens_per_s_per_gpu: float | None = None
    measured_tflops_per_gpu: float | None = None
    measured_mfu: float | None = None


class ClusterEntry(BaseModel):
    """The hardware the calibration describes."""

    model_config = FROZEN

    gpu: str
    gpus_per_node: int
    num_gpus: list[int]
    """GPU counts of the runs."""


class CalibrationFile(BaseModel):
    """What `planner calibrate --from-log` writes."""

    model_config = FROZEN

    schema_version: Literal[1] = SCHEMA_VERSION
    gpu: str
    cluster: ClusterEntry
    knobs: list[KnobEntry]
    fields: dict[str, FieldEntry]
    efficiency: GpuEfficiency
    """The GPU's efficiency table with the fitted values (what `--calibration` applies)."""
    residuals: list[RunResidual]
    rms_error_before_pct: float
    """Root mean square over the runs of the step-time error with the preset's efficiencies."""
    rms_error_after_pct: float
    """The same with the fitted efficiencies: the residual of the fit."""
    runs: list[RunEntry]
    memory_scale: float | None = None
    """Largest measured over predicted max reserved memory of the runs, at least 1 (a
    calibration never loosens the memory limit); plans are held to the limit over it. None:
    no run logged its memory."""
    planner_version: str = ""

    @property
    def num_runs(self) -> int:
        return len(self.runs)


def load(path: Path) -> CalibrationFile:
    """Read and validate a calibration file; ConfigError names the failing field."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read calibration file {path}: {exc.strerror}") from None
    try:
        return CalibrationFile.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, f"calibration file {path}")) from None


def save(path: Path, calibration: CalibrationFile) -> None:
    """Write the calibration file (indented JSON) atomically."""
    write_atomic(path, calibration.model_dump_json(indent=2) + "\n", what="calibration file")
