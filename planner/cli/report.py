"""Showing plans: the rich table of plans, one plan's breakdowns, the JSON contract and the
plan file the exporters read. Shared by `evaluate`, `plan` and `sweep`."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from planner.errors import PlannerError
from planner.hints import planner_command
from planner.output import write_atomic
from planner.plan import PlanEntry, PlanFile, time_part_name
from planner.run_length import run_length
from planner.runtimes import resolve as resolve_runtime
from planner.schedule.registry import SCHEDULES, schedule_info
from planner.spec import Cluster, GpuSpec
from planner.uncertainty import default_memory_headroom
from planner.units import GiB


def plan_json(document: PlanFile) -> str:
    """The plan file as indented JSON text."""
    return document.model_dump_json(indent=2)


def write_plan_file(path: Path, document: PlanFile) -> None:
    """Write the plan file atomically (a finished file or none at all)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlannerError(f"cannot write plan file {path}: {exc.strerror}") from None
    write_atomic(path, plan_json(document) + "\n", what="plan file")


def cut_sizes(entry: PlanEntry) -> list[int]:
    """Layers per virtual stage in model order (chimera: per model stage, each run by both
    directions)."""
    ordered = entry.ranges_in_model_order()
    if schedule_info(entry.schedule).bidirectional and entry.vpp == 2:
        ordered = ordered[: entry.pp]
    return [end - start for start, end in ordered]


def cuts_text(entry: PlanEntry) -> str:
    """Every virtual stage's layer count in model order, e.g. '19|20|21|20'."""
    return "|".join(str(size) for size in cut_sizes(entry))


SCHEDULE_SHORT_NAMES = {
    "interleaved_1f1b": "i1f1b",
    "looped_bfs": "lbfs",
    "dualpipev": "dpv",
    "chimera": "chim",
    "seq1f1b": "s1f1b",
}
"""The terminal tables' names of the schedules whose full name is long (the JSON keeps the full name)."""


def schedule_text(entry: PlanEntry) -> str:
    """The schedule as the terminal tables name it ('i1f1b'), with seq1f1b's sequence segments
    per micro-batch ('s1f1b k4')."""
    name = SCHEDULE_SHORT_NAMES.get(entry.schedule, entry.schedule)
    return name + (f" k{entry.segments}" if entry.segments > 1 else "")


def recompute_text(entry: PlanEntry) -> str:
    """One recompute mode, or the per-rank modes by first letter, run-length ('f×2,n×6')."""
    if isinstance(entry.recompute, str):
        return entry.recompute
    return run_length([mode[0] for mode in entry.recompute])


RUNTIME_SHORT_NAMES = {"megatron": "mt", "torchtitan": "tt", "torch": "torch", "deepspeed": "ds"}
"""The `runs on` column's names for the runtimes (`planner export --to`'s names)."""


def runs_on_text(runtimes: list[str] | None) -> str:
    """'mt,tt,torch,ds' for the runtimes a plan runs on; 'none' for none, '?' when unknown."""
    if runtimes is None:
        return "?"
    return ",".join(RUNTIME_SHORT_NAMES.get(name, name) for name in runtimes) or "none"


def runs_on_meaning(plan_path: Path | None, varied: str | None = None) -> str:
    """What the `runs on` column says, its short names, and the commands that export to one
    (from `plan_path`, or from the plan file a `-o` writes; from a sweep over `varied`, the
    plan command names that input, its value left to fill in)."""
    names = ", ".join(f"{short} {name}" if short != name else name for name, short in RUNTIME_SHORT_NAMES.items())
    meaning = f"the runtimes whose exporter takes the plan as it is ({names})"
    if plan_path is not None:
        return f"{meaning}: {planner_command('export', '--to NAME', '--out launch', arguments=(str(plan_path),))}"
    export = planner_command("export", "--to NAME", "--out launch", arguments=("plan.json",))
    return f"{meaning}: {_plan_to_file_command(varied)}, then {export}"


def _plan_to_file_command(varied: str | None) -> str:
    """`planner plan ... -o plan.json` for the command line being served, with the input a
    sweep varies as `--NAME N` (N: the row's value)."""
    if varied == "gpus":
        return planner_command("plan", "--gpus N", "-o plan.json")
    if varied == "global-batch":
        return planner_command("plan", "--global-batch N", "-o plan.json")
    if varied == "seq":
        return planner_command("plan", "--seq N", "-o plan.json")
    return planner_command("plan", "-o plan.json")


def runtime_plan_command(name: str, attention: str | None, gpu: GpuSpec) -> str:
    """The command that plans for runtime `name` (`--runtime NAME`), with its own attention kernel
    on `gpu` where the plans' kernel `attention` is one it does not run (the user's `--attention`
    would have the search refused)."""
    version = resolve_runtime(name)
    if attention is not None and version.unsupported_reason("attention", attention) is not None:
        return planner_command("plan", f"--runtime {name}", f"--attention {version.default_attention(gpu)}")
    return planner_command("plan", f"--runtime {name}")


def other_runtimes_hint(entries: list[PlanEntry], model_runtimes: list[str], gpu: GpuSpec) -> str | None:
    """For the runtimes of `model_runtimes` (those that run the model at all) that no plan of
    `entries` (on `gpu`) runs on, the command that finds the best plan they do run; None when
    there is none."""
    missing = [
        name
        for name in model_runtimes
        if all(entry.runtimes is not None and name not in entry.runtimes for entry in entries)
    ]
    if not missing:
        return None
    unexported = sorted({entry.schedule for entry in entries if SCHEDULES[entry.schedule].simulated_only})
    if unexported and len(unexported) == len({entry.schedule for entry in entries}):
        return (
            f"no runtime the planner exports to runs {' or '.join(unexported)}; to find the best plan that "
            "exports, plan with the default schedules or name another"
        )
    commands = ", ".join(runtime_plan_command(name, entries[0].attention, gpu) for name in missing)
    return f"no plan above runs on {' or '.join(missing)}; to find the best that does: {commands}"


PLAN_COLUMNS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "etp",
    "sched",
    "V",
    "mbs",
    "M",
    "recomp",
    "sp",
    "zero",
    "cuts",
    "step s",
    "tokens/s",
    "tokens/s/GPU",
    "MFU",
    "bubble",
    "mem GiB",
    "runs on",
)
"""The plans table's columns after the plan's number, in order (ep and etp only where a plan
has experts, tokens/s/GPU only where asked)."""
TEXT_COLUMNS = frozenset({"sched", "recomp", "cuts", "runs on"})
"""Left-justified columns; the rest are numbers, right-justified."""
MOVABLE_COLUMNS = ("runs on", "tokens/s", "tokens/s/GPU", "cuts")
"""Columns moved under the table, in this order, while it is wider than the terminal."""


def plan_cells(entry: PlanEntry, wide: bool) -> dict[str, str]:
    """One plan's cells by column (`wide`: every stage's layer count, else runs)."""
    p = entry.predicted
    figures = (
        dict.fromkeys(("step s", "tokens/s", "tokens/s/GPU", "MFU", "bubble", "mem GiB"), "-")
        if p is None
        else {
            "step s": f"{p.step_time_s:.3f}",
            "tokens/s": f"{p.tokens_per_s:,.0f}",
            "tokens/s/GPU": f"{p.tokens_per_s / entry.num_gpus:,.0f}",
            "MFU": f"{p.mfu:.1%}",
            "bubble": f"{p.bubble_fraction:.1%}",
            "mem GiB": f"{max(p.memory_gb_per_stage):.1f}",
        }
    )
    recompute = recompute_text(entry)
    return {
        "tp": str(entry.tp),
        "pp": str(entry.pp),
        "dp": str(entry.dp),
        "cp": str(entry.cp),
        "ep": str(entry.ep),
        "etp": str(entry.etp or entry.tp),
        "sched": schedule_text(entry),
        "V": str(entry.vpp),
        "mbs": str(entry.mbs),
        "M": str(entry.num_microbatches),
        "recomp": "sel" if recompute == "selective" else recompute,
        "sp": "y" if entry.sequence_parallel else "n",
        "zero": str(entry.zero_stage),
        "cuts": " ".join(map(str, cut_sizes(entry))) if wide else run_length(cut_sizes(entry)),
        **figures,
        "runs on": runs_on_text(entry.runtimes),
    }


GAPS = (2, 1)
"""Spaces between the plans table's columns: two, or one where two do not fit."""


def grid(rows: list[dict[str, str]], columns: list[str], gap: int = GAPS[0]) -> Table:
    """A borderless table of `columns` under a header rule, one row per plan, `gap` spaces
    between columns."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, gap - 1, 0, 0))
    for column in columns:
        text = column in TEXT_COLUMNS
        table.add_column(column, justify="left" if text else "right", no_wrap=not text)
    for row in rows:
        table.add_row(*(row[column] for column in columns))
    return table


UNBOUNDED_WIDTH = 10_000
"""A width no table reaches (to measure tables at their natural width)."""


def natural_width(table: Table) -> int:
    """Columns the table takes with no cell wrapped."""
    return Console(width=UNBOUNDED_WIDTH).measure(table).maximum


def fitted(
    rows: list[dict[str, str]], columns: list[str], width: int, wide: bool, movable: tuple[str, ...]
) -> tuple[list[str], int]:
    """The columns to move under the table (the first of `movable` first) and the gap between
    columns, so that the table fits in `width`: two spaces with as few moved as can be, else
    one (the last try is taken even when too wide)."""
    movable = tuple(c for c in movable if c in columns)
    tries = [(["cuts"] if wide else []) + list(movable[:n]) for n in range(len(movable) + 1)]
    for gap in GAPS:
        for moved in tries:
            if natural_width(grid(rows, [c for c in columns if c not in moved], gap)) <= width:
                return moved, gap
    return tries[-1], GAPS[-1]


def plans_view(
    entries: list[PlanEntry],
    title: str,
    width: int,
    wide: bool = False,
    keys: tuple[str, list[str]] | None = None,
    per_gpu: bool = False,
    movable: tuple[str, ...] = MOVABLE_COLUMNS,
    plan_path: Path | None = None,
) -> Group:
    """The title and one row per plan (mesh, schedule, batching, recompute, cuts, the
    predictions, the runtimes that run it) in `width` columns: the columns that do not fit
    (`movable`, first to last; with `wide` the full cut list always) go under it, a
    line for a column equal in every plan, a second table by plan number for the others; then
    what the short names stand for. `keys`: the first column's name and cells (default: the
    plans' numbers); `per_gpu`: a tokens/s/GPU column too; `plan_path`: the plan file written,
    which the export command names."""
    key, labels = keys or ("#", [str(rank) for rank in range(1, len(entries) + 1)])
    rows = [{key: label, **plan_cells(entry, wide)} for label, entry in zip(labels, entries)]
    moe = any(entry.etp is not None for entry in entries)
    columns = [key, *(c for c in PLAN_COLUMNS if (moe or c not in ("ep", "etp")) and (per_gpu or c != "tokens/s/GPU"))]
    moved, gap = fitted(rows, columns, width, wide, movable)
    moved = [c for c in columns if c in moved]
    parts: list = [Text(title), grid(rows, [c for c in columns if c not in moved], gap)]
    every = "" if len(rows) == 1 else " (every plan)"
    same = [c for c in moved if len({row[c] for row in rows}) == 1]
    if differ := [c for c in moved if c not in same]:
        parts.append(grid(rows, [key, *differ], gap))
    legend = plans_legend(entries, wide, plan_path, varied=keys[0] if keys else None)
    parts += [
        Text(f"{column}{every}: {rows[0][column]}" + (f"; {legend.pop(column)}" if column in legend else ""))
        for column in same
    ]
    return Group(*parts, *(Text(f"{column}: {meaning}") for column, meaning in legend.items()))


def plans_legend(
    entries: list[PlanEntry], wide: bool, plan_path: Path | None = None, varied: str | None = None
) -> dict[str, str]:
    """What the plans table's columns with short names say, by column: the schedules
    shortened, the cuts, the runtimes (`varied`: the input a sweep varies)."""
    shortened = sorted({e.schedule for e in entries if e.schedule in SCHEDULE_SHORT_NAMES})
    legend = {"sched": ", ".join(f"{SCHEDULE_SHORT_NAMES[name]} = {name}" for name in shortened)} if shortened else {}
    legend["cuts"] = "layers per virtual stage in model order" + ("" if wide else ", 3×20 = 20 stages of 3 layers")
    legend["runs on"] = runs_on_meaning(plan_path, varied)
    return legend


def memory_limit_line(cluster: Cluster, headroom_given: bool) -> str:
    """What memory the plans were held to and why: the capacity, the headroom and where its
    value comes from, and a calibration's memory scale."""
    capacity, limit = cluster.memory_capacity_bytes / GiB, cluster.memory_limit_bytes / GiB
    if headroom_given:
        basis = "--memory-headroom"
    else:
        default = default_memory_headroom()
        basis = (
            f"the largest memory under-prediction of {default.runs} published runs, {default.worst_run}; "
            "--memory-headroom sets it"
        )
    line = f"memory: plans use at most {limit:.1f} of {capacity:.1f} GiB per GPU ({cluster.memory_headroom:.1%} headroom: {basis}"
    if cluster.memory_scale != 1:
        line += f"; over the calibration's measured/predicted memory {cluster.memory_scale:.3f}"
    return line + ")"


def memory_warning(peak_bytes: float, cluster: Cluster) -> str | None:
    """What a layout's predicted peak memory risks: over the capacity it runs out of memory;
    within the headroom it fits the prediction, not the development runs' errors; else None."""
    peak = peak_bytes * cluster.memory_scale
    capacity, limit = cluster.memory_capacity_bytes, cluster.memory_limit_bytes
    calibrated = " (calibrated)" if cluster.memory_scale != 1 else ""
    if peak > capacity:
        return (
            f"needs {peak / GiB:.1f} GiB{calibrated} on its most loaded GPU, over the {capacity / GiB:.1f} GiB "
            "it has: this layout runs out of memory"
        )
    if peak_bytes > limit:
        return (
            f"needs {peak / GiB:.1f} GiB{calibrated} of the {capacity / GiB:.1f} GiB on its most loaded GPU, within "
            f"the {cluster.memory_headroom:.1%} headroom (the model has under-predicted memory by as much): it may "
            "run out of memory; `planner plan` keeps plans under "
            f"{limit / GiB:.1f} GiB"
        )
    return None


def breakdown_table(entry: PlanEntry, memory_limit_gib: float) -> Table:
    """Where one plan's step time (on the rank that finishes last) and its most loaded GPU's
    memory go, and the plans table's bubble beside that rank's pipeline idle time."""
    p = entry.predicted
    table = Table(title="breakdown", title_justify="left", show_header=False)
    table.add_column("item")
    table.add_column("value", justify="right")
    if p is None:
        return table
    for name, seconds in p.time_breakdown_s.items():
        table.add_row(f"time: {time_part_name(name)}", f"{seconds:.3f} s ({seconds / p.step_time_s:.1%})")
    table.add_row("bubble: ranks' mean idle / span", f"{p.bubble_fraction:.1%}")
    if p.step_time_interval_s:
        low, high = p.step_time_interval_s
        table.add_row("step: what comparable runs measured", f"{low:.2f}-{high:.2f} s ({p.interval_basis})")
    m = p.memory_breakdown_gb
    for name in ("weights", "grads", "optimizer", "activations", "other"):
        table.add_row(f"memory: {name}", f"{getattr(m, name):.2f} GiB")
    per_rank = " ".join(f"{g:.1f}" for g in p.memory_gb_per_stage)
    table.add_row("memory per pipeline rank", f"{per_rank} GiB (limit {memory_limit_gib:.1f})")
    for name, values in (("reserved", p.memory_reserved_gb_per_stage), ("allocated", p.memory_allocated_gb_per_stage)):
        if values:
            table.add_row(f"memory {name} per pipeline rank", " ".join(f"{g:.1f}" for g in values) + " GiB")
    return table
