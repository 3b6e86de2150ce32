"""`planner profile --for-plan`: the shapes one `planner plan` request can ask for, chosen
from the request's own arguments (planner/search/profile_shapes.py), listed by --dry-run
and measured by `planner profile`'s loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from planner.cli import options as opt
from planner.cli.app import stdout
from planner.errors import PlannerError
from planner.job import build_cluster
from planner.profile import store
from planner.profile.schema import ShapeKey
from planner.search.profile_shapes import PlannedShape, ShapePlan, cheapest, plan_shapes
from planner.spec import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """What a --for-plan run measures (largest first) and what plan will calibrate."""

    plan: ShapePlan
    measure: tuple[PlannedShape, ...]
    capped: int
    """Shapes left out by --max-shapes."""

    @property
    def keys(self) -> list[ShapeKey]:
        return [s.key for s in self.measure]


def select(
    spec: ModelSpec, params: Mapping[str, Any], kinds: tuple[str, ...], dtype: str, max_shapes: int | None
) -> Selection:
    """The shapes of the search space of the `plan` request in `params` (`profile`'s parsed
    options, named as plan's), capped to the `max_shapes` cheapest."""
    if params["gpus"] is None or params["global_batch"] is None or params["seq"] is None:
        raise PlannerError("--for-plan takes the plan request: --gpus, --global-batch and --seq are required")
    seqs = opt.int_list(params["seq"], "--seq") or ()
    if len(seqs) != 1 or seqs[0] < 1:
        raise PlannerError(f"--for-plan takes one sequence length, as plan does; got --seq {params['seq']}")
    seq = seqs[0]
    if spec.position_embedding == "learned" and seq > spec.max_position_embeddings:
        raise PlannerError(f"--seq {seq} exceeds the {spec.max_position_embeddings} learned positions of {spec.name}")
    request = opt.request_from(params, seq=seq)
    cluster = build_cluster(request)
    space = opt.space_from(params)
    plan = plan_shapes(spec, cluster, request.global_batch, seq, space, kinds, dtype)
    if not plan.shapes:
        raise PlannerError(
            f"no layout of {spec.name} on {request.num_gpus} GPUs matches the restrictions with global batch "
            f"{request.global_batch}: there is nothing to profile for this request"
        )
    if max_shapes is not None and max_shapes < 1:
        raise PlannerError(f"--max-shapes must be at least 1, got {max_shapes}")
    chosen = plan.shapes if max_shapes is None else cheapest(plan.shapes, max_shapes)
    return Selection(plan=plan, measure=chosen, capped=len(plan.shapes) - len(chosen))


def print_dry_run(selection: Selection, output: Path, gpu: str, passes: int, device: str | None) -> None:
    """The shapes in measuring order, which are already in `output`, which plan will
    calibrate, and the analytic estimate of the run."""
    done = set()
    if output.exists():
        done = {key for key, row in store.load(output).row_map().items() if row.status in ("ok", "oom")}
    chosen = set(selection.measure)
    table = Table(
        title=f"profile --for-plan: {len(selection.plan.shapes)} shapes the search can ask for, largest first",
        title_justify="left",
    )
    for column in ("#", "kind", "tp", "mbs", "seq", "rc", f"est. ms ({gpu})", "action"):
        table.add_column(column, justify="left" if column in ("kind", "rc", "action") else "right")
    pending = 0.0
    for index, shape in enumerate(selection.plan.shapes, start=1):
        key = shape.key
        if key in done:
            action = f"in {output.name}"
        elif shape in chosen:
            action, pending = "measure", pending + shape.estimate_s
        else:
            action = "calibrate (beyond --max-shapes)"
        table.add_row(
            str(index),
            key.kind,
            str(key.tp),
            str(key.mbs),
            str(key.seq),
            key.recompute,
            f"{shape.estimate_s * 1e3:.3g}",
            action,
        )
    stdout.print(table)
    to_measure = sum(1 for s in selection.measure if s.key not in done)
    where = "on a CPU, many times longer" if device == "cpu" else "plus building each layer"
    stdout.print(
        f"dry run: {to_measure} shapes to measure, about {pending * passes:.1f} s of {gpu} time by the "
        f"analytic model ({passes} passes of forward and backward per shape; {where})",
        markup=False,
        highlight=False,
    )
    print_calibration_note(selection)


def print_calibration_note(selection: Selection) -> None:
    """Which shapes `plan --profile` will fill in with the calibrated model."""
    notes = []
    if selection.capped:
        notes.append(f"{selection.capped} shapes beyond --max-shapes")
    if selection.plan.unmeasurable:
        notes.append(
            f"{len(selection.plan.unmeasurable)} CP shards with fewer tokens than one sequence, which "
            f"no self-attention row describes: {'; '.join(selection.plan.unmeasurable)}"
        )
    if notes:
        stdout.print(
            f"plan --profile will use the analytic model calibrated on the measured shapes for {', and '.join(notes)}",
            markup=False,
            highlight=False,
        )


FOR_PLAN_ONLY = {
    "gpus": "--gpus",
    "global_batch": "--global-batch",
    "pp": "--pp",
    "cp": "--cp",
    "vpp": "--vpp",
    "schedules": "--schedules",
    "sequence_parallel": "--sp/--no-sp",
    "zero": "--zero",
    "runtime": "--runtime",
    "gpus_per_node": "--gpus-per-node",
    "max_shapes": "--max-shapes",
}
"""`profile`'s options that belong to --for-plan's request (parameter name -> flag)."""


def plan_only_options_given(params: Mapping[str, Any]) -> list[str]:
    """The --for-plan options given without --for-plan."""
    given = [flag for name, flag in FOR_PLAN_ONLY.items() if params.get(name) is not None]
    return given + (["--dry-run"] if params.get("dry_run") else [])
