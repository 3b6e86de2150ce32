"""Showing plans: the rich table of plans, one plan's breakdowns, the JSON contract and the
plan file the exporters read. Shared by `evaluate`, `plan` and `sweep`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rich.table import Table

from planner import __version__
from planner.errors import PlannerError
from planner.hints import planner_command
from planner.plan import SIMULATED_ONLY_SCHEDULES, ClusterSummary, PlanEntry, PlanFile
from planner.spec import Cluster, ModelSpec


def plan_file(entries: list[PlanEntry], spec: ModelSpec, cluster: Cluster, cost_source: str) -> PlanFile:
    """The DESIGN JSON contract, with what an exporter needs to rebuild model and cluster."""
    return PlanFile(
        plans=entries,
        model=spec,
        cluster=ClusterSummary(gpu=cluster.gpu.name, num_gpus=cluster.num_gpus,
                               gpus_per_node=cluster.gpus_per_node),
        planner_version=__version__,
        cost_source=cost_source,
    )


def plan_json(document: PlanFile) -> str:
    """The plan file as indented JSON text."""
    return document.model_dump_json(indent=2)


def write_plan_file(path: Path, document: PlanFile) -> None:
    """Write the plan file atomically (a finished file or none at all)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        with os.fdopen(handle, "w") as out:
            out.write(plan_json(document) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise PlannerError(f"cannot write plan file {path}: {exc.strerror}") from None


def cuts_text(entry: PlanEntry) -> str:
    """Layers per virtual stage in model order, e.g. '19|20|21|20' (chimera: per model stage,
    each run by both directions)."""
    ordered = entry.ranges_in_model_order()
    if entry.schedule == "chimera" and entry.vpp == 2:
        ordered = ordered[: entry.pp]
    return "|".join(str(end - start) for start, end in ordered)


def schedule_text(entry: PlanEntry) -> str:
    """The schedule's name, with seq1f1b's sequence segments per micro-batch ('seq1f1b k4')."""
    return entry.schedule + (f" k{entry.segments}" if entry.segments > 1 else "")


def recompute_text(entry: PlanEntry) -> str:
    """One recompute mode, or the per-rank list compressed to first letters."""
    if isinstance(entry.recompute, str):
        return entry.recompute
    return ",".join(mode[0] for mode in entry.recompute)


RUNTIME_SHORT_NAMES = {"megatron": "mt", "torchtitan": "tt", "torch": "torch", "deepspeed": "ds"}
"""The `runs on` column's names for the runtimes (`planner export --to`'s names)."""


def runs_on_text(runtimes: list[str] | None) -> str:
    """'mt,tt,torch,ds' for the runtimes a plan runs on; 'none' for none, '?' when unknown."""
    if runtimes is None:
        return "?"
    return ",".join(RUNTIME_SHORT_NAMES.get(name, name) for name in runtimes) or "none"


def runs_on_legend() -> str:
    """What the `runs on` short names stand for, and the command that exports to one."""
    names = ", ".join(f"{short} {name}" if short != name else name for name, short in RUNTIME_SHORT_NAMES.items())
    return f"runs on: the runtimes whose exporter takes the plan as it is ({names}): " \
           f"{planner_command('export', '--to NAME')}"


def other_runtimes_hint(entries: list[PlanEntry], model_runtimes: list[str]) -> str | None:
    """For the runtimes of `model_runtimes` (those that run the model at all) that no plan of
    `entries` runs on, the command that finds the best plan they do run; None when there is none."""
    missing = [name for name in model_runtimes
               if all(entry.runtimes is not None and name not in entry.runtimes for entry in entries)]
    if not missing:
        return None
    unexported = sorted({entry.schedule for entry in entries if entry.schedule in SIMULATED_ONLY_SCHEDULES})
    if unexported and len(unexported) == len({entry.schedule for entry in entries}):
        return (f"no runtime the planner exports to runs {' or '.join(unexported)}; to find the best plan that "
                "exports, plan with the default schedules or name another")
    commands = ", ".join(planner_command("plan", f"--runtime {name}") for name in missing)
    return f"no plan above runs on {' or '.join(missing)}; to find the best that does: {commands}"


def plans_table(entries: list[PlanEntry], title: str) -> Table:
    """One row per plan: mesh, schedule, batching, recompute, cuts, the predictions and the
    runtimes that run it."""
    table = Table(title=title, title_justify="left", caption=runs_on_legend(), caption_justify="left")
    moe = any(entry.etp is not None for entry in entries)
    columns = ("#", "tp", "pp", "dp", "cp", *(("ep", "etp") if moe else ()), "schedule", "V", "mbs", "M",
               "recompute", "sp", "zero", "cuts", "step s", "tokens/s", "MFU", "bubble", "mem GiB", "runs on")
    for column in columns:
        table.add_column(column, justify="left" if column in ("schedule", "recompute", "cuts", "runs on")
                         else "right", overflow="fold" if column == "cuts" else "ellipsis")
    for rank, entry in enumerate(entries, start=1):
        p = entry.predicted
        figures = ("-",) * 5 if p is None else (
            f"{p.step_time_s:.3f}", f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}",
            f"{p.bubble_fraction:.1%}", f"{max(p.memory_gb_per_stage):.1f}",
        )
        table.add_row(
            str(rank), str(entry.tp), str(entry.pp), str(entry.dp), str(entry.cp),
            *((str(entry.ep), str(entry.etp or entry.tp)) if moe else ()), schedule_text(entry),
            str(entry.vpp), str(entry.mbs), str(entry.num_microbatches), recompute_text(entry),
            "y" if entry.sequence_parallel else "n", str(entry.zero_stage), cuts_text(entry), *figures,
            runs_on_text(entry.runtimes),
        )
    return table


def breakdown_table(entry: PlanEntry, memory_limit_gib: float) -> Table:
    """Where one plan's step time and its most loaded GPU's memory go."""
    p = entry.predicted
    table = Table(title="breakdown", title_justify="left", show_header=False)
    table.add_column("item")
    table.add_column("value", justify="right")
    if p is None:
        return table
    for name, seconds in p.time_breakdown_s.items():
        table.add_row(f"time: {name.replace('_', ' ')}", f"{seconds:.3f} s ({seconds / p.step_time_s:.1%})")
    m = p.memory_breakdown_gb
    for name in ("weights", "grads", "optimizer", "activations", "other"):
        table.add_row(f"memory: {name}", f"{getattr(m, name):.2f} GiB")
    per_rank = " ".join(f"{g:.1f}" for g in p.memory_gb_per_stage)
    table.add_row("memory per pipeline rank", f"{per_rank} GiB (limit {memory_limit_gib:.1f})")
    for name, values in (("reserved", p.memory_reserved_gb_per_stage),
                         ("allocated", p.memory_allocated_gb_per_stage)):
        if values:
            table.add_row(f"memory {name} per pipeline rank", " ".join(f"{g:.1f}" for g in values) + " GiB")
    return table
