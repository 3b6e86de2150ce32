"""`planner simulate`: one pipeline schedule, drawn as a timeline, with its figures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer
from rich.table import Table

from planner.cli.app import app, print_json, stderr, stdout
from planner.errors import ScheduleError
from planner.output import refuse_existing, write_atomic
from planner.schedule import SCHEDULES, SimResult, StageCosts, check_shape, compile_schedule, schedule_info, simulate
from planner.schedule.registry import DEFAULT_SEGMENTS, default_segments
from planner.schedule.render import timeline_renderable, timeline_svg
from planner.schedule.seq1f1b import causal_segment_scales
from planner.units import MS_PER_S

"""seq1f1b's default k (Sun et al. 2024 evaluate k = 2, 4, 8)."""


def _costs(
    stages: int, vpp: int, f: float, b: float, w: float | None, comm: float, pieces: int | None = None
) -> StageCosts:
    """Per-chunk costs in seconds from the per-rank millisecond flags (see the command help);
    one micro-batch's rank cost is split over `pieces` actions (default V)."""
    for flag, value in (("--f", f), ("--b", b), ("--comm", comm)):
        if value < 0:
            raise ScheduleError(f"{flag} must be >= 0 ms, got {value}")
    weight = b / 2 if w is None else w
    if not 0 <= weight <= b:
        raise ScheduleError(f"--w is the weight-gradient part of --b, so 0 <= w <= b; got w={weight}, b={b}")
    scale = (vpp if pieces is None else pieces) * MS_PER_S
    return StageCosts.uniform(stages, vpp, f / scale, (b - weight) / scale, weight / scale, p2p=comm / MS_PER_S)


@app.command("simulate")
def simulate_command(
    schedule: str = typer.Option("1f1b", "--schedule", help=f"One of: {', '.join(SCHEDULES)}."),
    stages: int = typer.Option(4, "--stages", help="Pipeline ranks P."),
    microbatches: int = typer.Option(8, "--microbatches", help="Micro-batches per step M."),
    vpp: int | None = typer.Option(
        None,
        "--vpp",
        help="Chunks (virtual stages) per rank V. Default: the "
        "least the schedule takes (2 for zbv, dualpipev, interleaved_1f1b, chimera).",
    ),
    segments: int | None = typer.Option(
        None, "--segments", help=f"seq1f1b: sequence segments k per micro-batch (default {DEFAULT_SEGMENTS})."
    ),
    attention_share: float = typer.Option(
        0.0,
        "--attention-share",
        help="seq1f1b: share of --f and of the "
        "input-grad part of --b that is causal attention, whose cost grows "
        "with the segment's position ((2j+1)/k^2 of the whole sequence's); "
        "0 = equal segments.",
    ),
    f: float = typer.Option(
        1.0, "--f", help="Forward ms of one micro-batch on one rank (all its chunks; each chunk takes 1/V of it)."
    ),
    b: float = typer.Option(
        2.0,
        "--b",
        help="Full backward ms (input grad + weight grad) of one micro-batch "
        "on one rank; an unsplit schedule runs it as one B.",
    ),
    w: float | None = typer.Option(
        None, "--w", help="Weight-gradient part of --b in ms: split schedules run I = b - w and W = w. Default b/2."
    ),
    comm: float = typer.Option(
        0.0, "--comm", help="Point-to-point ms per activation or gradient transfer between ranks (latency included)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON instead of the picture."),
    svg: Path | None = typer.Option(None, "--svg", help="Also write the timeline as SVG to FILE.", metavar="FILE"),
    force: bool = typer.Option(False, "--force", help="Overwrite the --svg file if it exists."),
) -> None:
    """Simulate one step of a pipeline schedule with uniform per-rank costs and draw it.

    seq1f1b runs each micro-batch as k segments of 1/k of --f and --b (times
    --attention-share's per-position factors); chimera's M micro-batches go half down, half
    up (numbered per direction in the picture), each through one of a rank's two stages."""
    refuse_existing(svg, force=force)
    if vpp is None:
        vpp = schedule_info(schedule).min_vpp
    if segments is None:
        segments = default_segments(schedule)
    info = check_shape(schedule, stages, microbatches, vpp, segments)
    if w is not None and not info.split_backward:
        stderr.print(
            f"warning: --w has no effect on {schedule}, whose backward is one B of --b ms",
            markup=False,
            highlight=False,
        )
    # a Chimera micro-batch runs one of a rank's two chunks (a whole stage); a seq1f1b unit is 1/k
    pieces = 1 if info.bidirectional else segments if info.segmented else vpp
    costs = _costs(stages, vpp, f, b, w, comm, pieces)
    if attention_share:
        if not info.segmented:
            segmented = sorted(name for name, row in SCHEDULES.items() if row.segmented)
            raise ScheduleError(f"--attention-share applies to {', '.join(segmented)} only, not {schedule}")
        costs = replace(costs, unit_scale=causal_segment_scales(segments, attention_share) * microbatches)
    result = simulate(compile_schedule(schedule, stages, microbatches, vpp, segments), costs, timeline=True)
    title = f"{schedule}  P={stages} M={microbatches} V={vpp}" + (f" k={segments}" if segments > 1 else "")
    if svg is not None:
        write_atomic(svg, timeline_svg(result, title=title))
        stderr.print(f"wrote {svg}", markup=False, highlight=False)
    if as_json:
        figures = _figures(schedule, stages, microbatches, vpp, result)
        if segments > 1:
            figures["segments"] = segments
        print_json(json.dumps(figures, indent=2))
        return
    stdout.print(title, style="bold")
    stdout.print(timeline_renderable(result, width=stdout.width))
    stdout.print(_table(result))
    stdout.print(
        f"step time {result.step_time_s * MS_PER_S:.4g} ms; bubble {result.bubble_fraction:.1%}: the ranks' mean "
        f"idle share of the longest rank span ({result.span_s * MS_PER_S:.4g} ms, first action to last), as "
        "`planner plan` counts it; idle in step is the step time less busy, with the wait before a rank's first "
        "action and after its last",
        markup=False,
        highlight=False,
        soft_wrap=False,
    )


def _ms(values: tuple[float, ...]) -> list[float]:
    return [round(v * MS_PER_S, 9) for v in values]


def _figures(schedule: str, stages: int, microbatches: int, vpp: int, result: SimResult) -> dict:
    """The JSON contract: step_time, bubble_fraction, busy_per_stage, peak_inflight_per_stage."""
    return {
        "schedule": schedule,
        "stages": stages,
        "microbatches": microbatches,
        "vpp": vpp,
        "units": "ms",
        "step_time": round(result.step_time_s * MS_PER_S, 9),
        "span": round(result.span_s * MS_PER_S, 9),
        "bubble_fraction": result.bubble_fraction,
        "busy_per_stage": _ms(result.busy_s),
        "idle_per_stage": _ms(result.idle_s),
        "peak_inflight_per_stage": list(result.peak_inflight),
        "peak_inflight_freed_at_input_grad_per_stage": list(result.peak_inflight_freed_at_input_grad),
    }


def _table(result: SimResult) -> Table:
    table = Table(title=None, show_edge=False)
    for column in ("rank", "busy ms", "idle in step ms", "bubble", "peak in-flight", "freed at I"):
        table.add_column(column, justify="right")
    for r, busy in enumerate(result.busy_s):
        table.add_row(
            str(r),
            f"{busy * MS_PER_S:.4g}",
            f"{result.idle_s[r] * MS_PER_S:.4g}",
            f"{result.bubble_per_rank[r]:.1%}",
            str(result.peak_inflight[r]),
            str(result.peak_inflight_freed_at_input_grad[r]),
        )
    return table
