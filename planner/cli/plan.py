"""`planner plan`: search the layout space and show the best plans (the main command)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.cli import options as opt
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.report import breakdown_table, plan_file, plan_json, plans_table, write_plan_file
from planner.cost.model import CostModel
from planner.errors import LayoutError, NoFeasiblePlanError
from planner.layout import entry_from_layout
from planner.plan import RECOMPUTE_MODES
from planner.search.explain import alternatives, layout_text, what_would_fit
from planner.search.runtimes import restrict, runtime_check, runtime_cost_options
from planner.search.search import CUT_SOLVERS, SearchResult, search
from planner.search.space import SearchSpace
from planner.units import GiB


def build_space(tp, pp, cp, vpp, mbs, schedules, recompute, per_rank, sequence_parallel, zero, runtime) -> SearchSpace:
    """The search space from the command-line restrictions (and the runtime's rules)."""
    for flag, values in (("--tp", tp), ("--pp", pp), ("--cp", cp), ("--vpp", vpp), ("--mbs", mbs)):
        if values is not None and 0 in values:
            raise LayoutError(f"{flag} values must be at least 1")
    space = SearchSpace(
        tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, schedules=schedules,
        recompute=recompute or RECOMPUTE_MODES, per_rank_recompute=per_rank,
        sequence_parallel=None if sequence_parallel is None else (sequence_parallel,),
        zero=zero or (1,),
    )
    return restrict(space, runtime) if runtime else space


def run_search(cost_model: CostModel, global_batch: int, seq: int, space: SearchSpace, top: int,
               accept, cut_solver: str) -> SearchResult:
    """The search, with a progress bar on stderr when it is a terminal."""
    if not stderr.is_terminal:
        return search(cost_model, global_batch, seq, space, top, accept, cut_solver)
    with Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr, transient=True) as bar:
        task = bar.add_task("search", total=None)
        return search(cost_model, global_batch, seq, space, top, accept, cut_solver,
                      progress=lambda done, total: bar.update(task, completed=done, total=total))


@app.command("plan")
def plan_command(
    model: str = opt.MODEL,
    gpus: int = opt.GPUS,
    gpu: str = opt.GPU,
    global_batch: int = opt.GLOBAL_BATCH,
    seq: int = opt.SEQ,
    tp: str | None = typer.Option(None, "--tp", help="Tensor-parallel degrees to try, e.g. 4,8."),
    pp: str | None = typer.Option(None, "--pp", help="Pipeline-parallel degrees to try."),
    cp: str | None = typer.Option(None, "--cp", help="Context-parallel degrees (default: 1, and powers "
                                  "of two for sequences of 16k tokens or more)."),
    vpp: str | None = typer.Option(None, "--vpp", help="Virtual stages per rank to try (default 1..8)."),
    mbs: str | None = typer.Option(None, "--mbs", help="Micro-batch sizes to try (default 1,2,4,8)."),
    schedules: str | None = typer.Option(None, "--schedules", help="Schedules to try (default: all)."),
    recompute: str | None = typer.Option(None, "--recompute", help="Recompute modes to try "
                                         "(default none,selective,full)."),
    per_rank: bool = typer.Option(True, "--per-rank-recompute/--uniform-recompute",
                                  help="Let each pipeline rank pick its own recompute mode."),
    sequence_parallel: bool | None = typer.Option(None, "--sp/--no-sp", help="Fix sequence "
                                                  "parallelism (default: try both with TP)."),
    zero: str | None = typer.Option(None, "--zero", help="ZeRO stages to try (default 1)."),
    runtime: str | None = typer.Option(None, "--runtime", help="Keep only what this runtime runs: "
                                       "megatron, torchtitan, torch, deepspeed."),
    top: int = typer.Option(5, "--top", min=1, help="How many plans to show."),
    cut_solver: str = typer.Option("exact", "--cut-solver", help=f"Stage cut solver: {', '.join(CUT_SOLVERS)}."),
    explain: bool = typer.Option(False, "--explain", help="Say why nearby alternatives lost."),
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    intra_node_bw: float | None = opt.INTRA_BW,
    inter_node_bw: float | None = opt.INTER_BW,
    max_memory_gb: float | None = opt.MAX_MEMORY,
    profile: Path | None = opt.PROFILE,
    calibration: Path | None = opt.CALIBRATION,
    as_json: bool = opt.JSON,
    out: Path | None = opt.OUT,
) -> None:
    """Search every layout and print the fastest that fit in memory."""
    if cut_solver not in CUT_SOLVERS:
        raise LayoutError(f"--cut-solver must be one of {', '.join(CUT_SOLVERS)}, got '{cut_solver}'")
    spec = opt.load_model(model)
    calibrated = opt.load_calibration(calibration)
    cluster = opt.build_cluster(gpu, gpus, gpus_per_node, intra_node_bw, inter_node_bw, max_memory_gb, calibrated)
    space = build_space(opt.int_list(tp, "--tp"), opt.int_list(pp, "--pp"), opt.int_list(cp, "--cp"),
                        opt.int_list(vpp, "--vpp"), opt.int_list(mbs, "--mbs"), opt.name_list(schedules),
                        opt.name_list(recompute), per_rank, sequence_parallel, opt.int_list(zero, "--zero"), runtime)
    cost_model = opt.build_cost_model(spec, cluster, profile, runtime_cost_options(runtime))
    accept = runtime_check(runtime, spec, cluster, global_batch, seq) if runtime else None
    result = run_search(cost_model, global_batch, seq, space, top, accept, cut_solver)
    if not result.plans:
        if result.stats.candidates == 0:
            raise NoFeasiblePlanError(
                f"no layout of {spec.name} on {gpus} GPUs matches the restrictions with global batch "
                f"{global_batch}: check that --tp/--pp/--cp divide the GPUs and dp x mbs divides the batch"
            )
        raise NoFeasiblePlanError(what_would_fit(cost_model, result, global_batch, seq, space, accept))
    entries = [entry_from_layout(f.layout, global_batch, seq, f.prediction.to_predicted()) for f in result.plans]
    document = plan_file(entries, spec, cluster, opt.cost_source(cost_model, calibrated))
    if out is not None:
        write_plan_file(out, document)
    if as_json:
        print_json(plan_json(document))
        return
    stats = result.stats
    title = (f"{spec.name} on {gpus} x {cluster.gpu.name}, global batch {global_batch} x seq {seq} "
             f"({document.cost_source} costs{', runtime ' + runtime if runtime else ''})")
    stdout.print(plans_table(entries, title))
    stdout.print(breakdown_table(entries[0], cluster.memory_limit_bytes / GiB))
    stdout.print(
        f"searched {stats.candidates:,} candidates in {stats.seconds:.2f} s: {stats.pruned_memory:,} over memory "
        f"by their state alone, {stats.out_of_memory:,} layouts over memory, {stats.pruned_bound:,} cut by "
        f"the step-time bound, {stats.simulated:,} simulated"
        + (f", {stats.rejected_by_runtime:,} refused by {runtime}" if runtime else ""),
        markup=False, highlight=False,
    )
    if explain:
        stdout.print(explain_table(alternatives(cost_model, result.plans[0], global_batch, seq, space, accept),
                                   layout_text(result.plans[0].layout)))
    if out is not None:
        stdout.print(f"wrote {out}", markup=False, highlight=False)


def explain_table(items, best_text: str) -> Table:
    """One row per single-dimension change of the best plan."""
    table = Table(title=f"why not something else (best: {best_text})", title_justify="left")
    for column in ("change", "its best layout", "step s", "MFU", "mem GiB", "why it lost"):
        table.add_column(column)
    for item in items:
        if item.found is None:
            table.add_row(item.change, "-", "-", "-", "-", item.reason)
            continue
        p = item.found.prediction
        table.add_row(item.change, layout_text(item.found.layout), f"{p.step_time_s:.3f}", f"{p.mfu:.1%}",
                      f"{p.peak_memory_bytes / GiB:.1f}", item.reason)
    return table
