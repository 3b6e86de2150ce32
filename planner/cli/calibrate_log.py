"""`planner calibrate --from-log LOG --plan PLAN ... -o FILE`: fit the GPU's efficiency knobs
to the step times of the user's own training runs and write a calibration file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rich.table import Table

from planner.calibration import schema
from planner.calibration.fit import fit
from planner.calibration.logs import parse_log, steady_state
from planner.calibration.runs import Source, calibration_file, check_one_gpu, consistency_warnings, run_from_plan
from planner.cli.app import print_json, stderr, stdout
from planner.errors import ConfigError, PlannerError
from planner.plan import parse_plan_file


def calibrate_from_logs(
    logs: list[Path], plans: list[Path], output: Path | None, skip_steps: int | None, as_json: bool
) -> None:
    """Read each log with its plan, fit, print the knobs and residuals, write the file."""
    if not logs or len(logs) != len(plans):
        raise PlannerError(f"give one --plan per --from-log (got {len(logs)} logs and {len(plans)} plans)")
    runs, sources = [], []
    for log_path, plan_path in zip(logs, plans):
        data = _read_bytes(log_path, "log")
        measured = steady_state(parse_log(data.decode("utf-8", errors="replace")), skip_steps)
        document = parse_plan_file(_read_bytes(plan_path, "plan file").decode(), str(plan_path))
        runs.append(run_from_plan(document, measured, log_path.name, str(plan_path)))
        for warning in consistency_warnings(runs[-1], measured):
            stderr.print(f"warning: {warning}", markup=False, highlight=False)
        sources.append(
            Source(
                log_path=str(log_path),
                log_sha256=hashlib.sha256(data).hexdigest(),
                plan_path=str(plan_path),
                measured=measured,
            )
        )
    check_one_gpu(runs)
    result = fit(runs, runs[0].cluster.gpu.efficiency)
    document = calibration_file(runs, sources, result)
    if output is not None:
        schema.save(output, document)
    if as_json:
        print_json(json.dumps(document.model_dump(mode="json"), indent=2))
        return
    stdout.print(_knob_table(document))
    stdout.print(_residual_table(document))
    if document.memory_scale is not None:
        stdout.print(
            f"memory: measured up to {document.memory_scale:.3f} x the predicted max reserved; with "
            f"--calibration, plans are held to the memory limit / {document.memory_scale:.3f}",
            markup=False,
            highlight=False,
        )
    if output is not None:
        stdout.print(
            f"wrote {output}: use it with plan / evaluate / sweep --calibration {output}", markup=False, highlight=False
        )


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None


def _knob_table(document: schema.CalibrationFile) -> Table:
    table = Table(title=f"{document.gpu} efficiency knobs from {document.num_runs} run(s)", title_justify="left")
    for column in ("knob", "fields", "factor", "bounds", "verdict"):
        table.add_column(column, justify="right" if column in ("factor", "bounds") else "left")
    for knob in document.knobs:
        table.add_row(
            knob.name,
            ", ".join(knob.fields),
            f"{knob.value:.3f}",
            f"{knob.bounds[0]:.2f}-{knob.bounds[1]:.2f}",
            knob.reason,
        )
    return table


def _residual_table(document: schema.CalibrationFile) -> Table:
    table = Table(
        title=f"step time per run: measured vs predicted (error; RMS {document.rms_error_before_pct:.1f}% "
        f"-> {document.rms_error_after_pct:.1f}%), and max reserved memory",
        title_justify="left",
    )
    for column in ("log", "measured s", "before s", "after s", "reserved GiB", "predicted GiB"):
        table.add_column(column, justify="left" if column == "log" else "right")
    for r in document.residuals:
        m = r.memory
        table.add_row(
            Path(r.log).name,
            f"{r.measured_step_time_s:.3f}",
            f"{r.predicted_before_s:.3f} ({r.error_before_pct:+.1f}%)",
            f"{r.predicted_after_s:.3f} ({r.error_after_pct:+.1f}%)",
            "-" if m.measured_max_reserved_gib is None else f"{m.measured_max_reserved_gib:.1f}",
            f"{m.predicted_reserved_gib or m.predicted_peak_gib:.1f}"
            + ("" if m.error_pct is None else f" ({m.error_pct:+.1f}%)"),
        )
    return table
