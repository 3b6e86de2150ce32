"""`planner plan`: search the layout space and show the best plans (the main command)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.api import Evaluation, plan_document
from planner.cli import options as opt
from planner.cli import report_cmd
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.report import (
    breakdown_table,
    memory_limit_line,
    other_runtimes_hint,
    plan_json,
    plans_view,
    write_plan_file,
)
from planner.cost.model import CostModel
from planner.errors import LayoutError, NoFeasiblePlanError, PlannerError
from planner.hints import planner_command
from planner.job import build
from planner.layout import Layout
from planner.output import refuse_existing, write_atomic
from planner.plan import PlanEntry
from planner.report import require_plotly
from planner.search.explain import alternatives, layout_changes, layout_text, nearest_layouts, what_would_fit
from planner.search.runtimes import model_refusal, model_runtimes, runtime_check
from planner.search.search import CUT_SOLVERS, SearchResult, search
from planner.search.space import SearchSpace
from planner.units import GiB


def run_search(
    cost_model: CostModel, global_batch: int, seq: int, space: SearchSpace, top: int, accept, cut_solver: str
) -> SearchResult:
    """The search, with a progress bar on stderr when it is a terminal."""
    if not stderr.is_terminal:
        return search(cost_model, global_batch, seq, space, top, accept, cut_solver)
    with Progress(
        TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=stderr, transient=True
    ) as bar:
        task = bar.add_task("search", total=None)
        return search(
            cost_model,
            global_batch,
            seq,
            space,
            top,
            accept,
            cut_solver,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )


def no_plan_error(
    cost_model: CostModel,
    result: SearchResult,
    global_batch: int,
    seq: int,
    space: SearchSpace,
    runtime: str | None,
    accept,
) -> PlannerError:
    """Why the search returned no plan, with what to type instead: no layout at all (the
    nearest GPU counts and batches that have one), the runtime refused every layout that
    fits, or nothing fits in memory (what would)."""
    spec = cost_model.spec
    if result.stats.candidates == 0:
        return LayoutError(
            nearest_layouts(
                cost_model,
                global_batch,
                seq,
                space,
                lambda other: (
                    runtime_check(runtime, spec, other, global_batch, seq, cost_model.options) if runtime else None
                ),
            )
        )
    if result.stats.rejected_by_runtime:
        reason = max(result.runtime_rejections, key=result.runtime_rejections.get)
        return NoFeasiblePlanError(
            f"{runtime} runs none of the {result.stats.rejected_by_runtime} layouts found "
            f"that fit in memory; the most common refusal: {reason}"
        )
    return NoFeasiblePlanError(what_would_fit(cost_model, result, global_batch, seq, space, accept))


@app.command("plan")
def plan_command(
    ctx: typer.Context,
    model: str = opt.MODEL,
    gpus: int = opt.GPUS,
    gpu: str = opt.GPU,
    global_batch: int = opt.GLOBAL_BATCH,
    seq: int = opt.SEQ,
    tp: str | None = opt.TP_LIST,
    pp: str | None = opt.PP_LIST,
    cp: str | None = opt.CP_LIST,
    vpp: str | None = opt.VPP_LIST,
    mbs: str | None = opt.MBS_LIST,
    schedules: str | None = opt.SCHEDULE_LIST,
    segments: str | None = typer.Option(
        None,
        "--segments",
        help="seq1f1b: sequence segments per micro-batch to try (default 2,4,8, those dividing the sequence).",
    ),
    recompute: str | None = opt.RECOMPUTE_LIST,
    per_rank: bool = opt.PER_RANK_RECOMPUTE,
    sequence_parallel: bool | None = opt.SEQUENCE_PARALLEL,
    zero: str | None = opt.ZERO_LIST,
    runtime: str | None = opt.RUNTIME,
    sets: list[str] | None = opt.SET,
    ep: str | None = opt.EP_LIST,
    etp: str | None = opt.ETP_LIST,
    precision: str | None = opt.PRECISION,
    moe_imbalance: float | None = opt.MOE_IMBALANCE,
    moe_dispatcher: str | None = opt.MOE_DISPATCHER,
    moe_ep_overlap: bool | None = opt.MOE_EP_OVERLAP,
    top: int = typer.Option(5, "--top", min=1, help="How many plans to show."),
    cut_solver: str = typer.Option("exact", "--cut-solver", help=f"Stage cut solver: {', '.join(CUT_SOLVERS)}."),
    explain: bool = typer.Option(False, "--explain", help="Say why nearby alternatives lost."),
    wide: bool = opt.WIDE,
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    intra_node_bw: float | None = opt.INTRA_BW,
    inter_node_bw: float | None = opt.INTER_BW,
    max_memory_gb: float | None = opt.MAX_MEMORY,
    memory_headroom: float | None = opt.MEMORY_HEADROOM,
    profile: Path | None = opt.PROFILE,
    attention: str | None = opt.ATTENTION,
    cuda_graphs: bool | None = opt.CUDA_GRAPHS,
    interference: bool | None = opt.INTERFERENCE,
    stragglers: bool | None = opt.STRAGGLERS,
    speed_spread: str | None = opt.SPEED_SPREAD,
    profile_only: bool = opt.PROFILE_ONLY,
    calibration: Path | None = opt.CALIBRATION,
    as_json: bool = opt.JSON,
    out: Path | None = opt.OUT,
    force: bool = opt.FORCE,
    report: Path | None = report_cmd.REPORT,
    tokens: float | None = report_cmd.TOKENS,
    gpu_hour_price: float | None = report_cmd.GPU_HOUR_PRICE,
) -> None:
    """Search every layout and print the fastest that fit in memory."""
    if report is not None:
        require_plotly()
    refuse_existing(out, report, force=force)
    if cut_solver not in CUT_SOLVERS:
        raise LayoutError(f"--cut-solver must be one of {', '.join(CUT_SOLVERS)}, got '{cut_solver}'")
    job = build(opt.request_from(ctx.params))
    spec, cluster, cost_model = job.spec, job.cluster, job.cost_model
    space = opt.space_from(ctx.params)
    accept = opt.accept_checks(
        runtime_check(runtime, spec, cluster, global_batch, seq, cost_model.options) if runtime else None,
        opt.profile_check(cost_model, seq, profile_only),
    )
    if runtime and (reason := model_refusal(spec, runtime)) is not None:
        raise NoFeasiblePlanError(f"{runtime} runs no layout of {spec.name}: {reason}")
    result = run_search(cost_model, global_batch, seq, space, top, accept, cut_solver)
    dropped = result.runtime_rejections.get(opt.PROFILE_ONLY_REASON, 0)
    if not result.plans:
        if dropped and result.stats.candidates:
            raise NoFeasiblePlanError(
                f"--profile-only dropped every layout that fits: {dropped:,} need shapes the profile does not "
                f"span; measure them with {planner_command('profile', '--for-plan', f'-o {profile}', '--resume')}, "
                "or drop --profile-only to calibrate them"
            )
        raise no_plan_error(cost_model, result, global_batch, seq, space, runtime, accept)
    entries = [
        Evaluation(job=job, layout=f.layout, prediction=f.prediction)
        .entry()
        .model_copy(update={"cost_sources": opt.cost_sources(cost_model, f.layout, seq)})
        for f in result.plans
    ]
    document = plan_document(job, entries)
    entries = document.plans
    if out is not None:
        write_plan_file(out, document)
    if report is not None:
        write_atomic(
            report,
            report_cmd.report_html(
                document,
                str(out or "plan.json"),
                tokens=tokens,
                gpu_hour_price=gpu_hour_price,
                space=space,
                accept=accept,
            ),
            what="report",
        )
    if as_json:
        print_json(plan_json(document))
        return
    title = (
        f"{spec.name} on {gpus} x {cluster.gpu.name}, global batch {global_batch} x seq {seq} "
        f"({document.cost_source} costs{', runtime ' + runtime if runtime else ''}"
        f"{opt.moe_mechanisms_text(cost_model.options, spec)})"
    )
    stdout.print(plans_view(entries, title, stdout.width, wide, plan_path=out), soft_wrap=False)
    if profile is not None:
        print_cost_sources(entries, cost_model)
    if (hint := other_runtimes_hint(entries, model_runtimes(spec), cluster.gpu)) is not None:
        stdout.print(hint, markup=False, highlight=False, soft_wrap=False)
    stdout.print(breakdown_table(entries[0], cluster.memory_limit_bytes / GiB))
    stdout.print(
        memory_limit_line(cluster, memory_headroom is not None), markup=False, highlight=False, soft_wrap=False
    )
    for line in search_summary(result, runtime, profile_only):
        stdout.print(line, markup=False, highlight=False, soft_wrap=False)
    if explain:
        stdout.print(
            explain_table(
                alternatives(cost_model, result.plans[0], global_batch, seq, space, accept),
                result.plans[0].layout,
                stdout.width,
            ),
            soft_wrap=False,
        )
    for written in (out, report):
        if written is not None:
            stdout.print(f"wrote {written}", markup=False, highlight=False)


def search_summary(result: SearchResult, runtime: str | None, profile_only: bool) -> list[str]:
    """What became of the candidates and of the layouts their cut points gave, each line's
    parts adding up to the number it starts with."""
    stats = result.stats
    dropped = result.runtime_rejections.get(opt.PROFILE_ONLY_REASON, 0)
    profiled_oom = result.runtime_rejections.get(opt.PROFILED_OOM_REASON, 0)
    simulated = [
        (stats.simulated_out_of_memory, "over memory", True),
        (stats.rejected_by_runtime - dropped - profiled_oom, f"refused by {runtime}", bool(runtime)),
        (profiled_oom, "refused: a layer ran out of memory at their shape when profiled", bool(profiled_oom)),
        (dropped, "dropped by --profile-only (shapes the profile does not span)", profile_only),
        (stats.fitted, "fit", True),
    ]
    candidates = (
        f"searched {stats.candidates:,} candidates in {stats.seconds:.2f} s: {stats.pruned_memory:,} "
        f"over memory by their state alone, {stats.pruned_bound:,} cut by the step-time bound, "
        f"{stats.solved:,} solved for cut points"
    )
    outcomes = ", ".join(f"{count:,} {what}" for count, what, shown in simulated if shown)
    layouts = (
        f"these {stats.solved:,} gave {stats.layouts:,} layouts: {stats.out_of_memory:,} over memory, "
        f"{stats.layouts_pruned_bound:,} cut by the step-time bound, {stats.simulated:,} simulated ({outcomes})"
    )
    return [candidates, layouts]


def print_cost_sources(entries: list[PlanEntry], cost_model: CostModel) -> None:
    """Where each plan's layer times came from (plans of the same sources on one line), and
    what the calibrated model was fitted on."""
    groups: dict[str, list[int]] = {}
    for rank, entry in enumerate(entries, start=1):
        groups.setdefault(opt.sources_text(entry.cost_sources), []).append(rank)
    for text, ranks in groups.items():
        label = "plan" if len(ranks) == 1 else "plans"
        stdout.print(f"costs of {label} {', '.join(f'#{r}' for r in ranks)}: {text}", markup=False, highlight=False)
    calibrated = any("calibrated" in entry.cost_sources.values() for entry in entries)
    if calibrated and (note := opt.calibration_text(cost_model)) is not None:
        stdout.print(note, markup=False, highlight=False)


EXPLAIN_FULL_WIDTH = 100
"""Narrower than this, the explain table leaves out MFU (it follows the step time) and memory."""
EXPLAIN_SHARES = {"change": 6, "what differs": 4}
"""The explain table's `change` and `what differs` columns grow to at most 1/n of the width
(a longer word widens one), so that `why it lost` gets the room left."""


def explain_table(items, best: Layout, width: int) -> Table:
    """One row per single-dimension change of the best plan: what its best layout sets
    differently, its figures and why it lost, in `width` columns."""
    columns = [
        c
        for c in ("change", "what differs", "step s", "MFU", "mem GiB", "why it lost")
        if width >= EXPLAIN_FULL_WIDTH or c not in ("MFU", "mem GiB")
    ]
    rows = []
    for item in items:
        cells = {"change": item.change, "why it lost": item.reason}
        if item.found is not None:
            p = item.found.prediction
            cells.update(
                {
                    "what differs": layout_changes(best, item.found.layout) or "same layout",
                    "step s": f"{p.step_time_s:.3f}",
                    "MFU": f"{p.mfu:.1%}",
                    "mem GiB": f"{p.peak_memory_bytes / GiB:.1f}",
                }
            )
        rows.append([cells.get(column, "-") for column in columns])
    table = Table(title=f"why not something else (best: {layout_text(best)})", title_justify="left")
    for index, column in enumerate(columns):
        widest = None
        if column in EXPLAIN_SHARES:
            widest = max(width // EXPLAIN_SHARES[column], *(len(word) for row in rows for word in row[index].split()))
        text = column in (*EXPLAIN_SHARES, "why it lost")
        table.add_column(column, justify="left" if text else "right", no_wrap=not text, max_width=widest)
    for row in rows:
        table.add_row(*row)
    return table
