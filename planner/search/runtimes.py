"""Keeping the search to what one training runtime can run (`planner plan --runtime`).

Two layers: `restrict` narrows the space up front with the runtime version's rules
(planner/runtimes/: its schedules, one recompute setting for every stage, its parallel
dimensions), which keeps the search fast; `runtime_check` then asks the version's exporter
about every plan that would enter the answer, so a plan `plan --runtime R` returns is one
`export --to R` writes. `with_runtimes` records, for each plan shown, every runtime whose
exporter takes it.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost.model import CostOptions
from planner.errors import PlannerError
from planner.export import refusal, runs_on
from planner.export.common import replan_for
from planner.layout import Layout, entry_from_layout
from planner.plan import ClusterSummary, PlanEntry, PlanFile
from planner.predict import priced_options
from planner.runtimes import exporting_runtimes, resolve
from planner.schedule.registry import SCHEDULES
from planner.search.space import SearchSpace
from planner.spec import Cluster, ModelSpec


def restrict(space: SearchSpace, runtime: str) -> SearchSpace:
    """The space narrowed to what `runtime` (NAME[@VERSION]) can run."""
    version = resolve(runtime)
    changes = {}
    for rule in version.rules:
        if rule.dimension == "per_rank_recompute":
            changes[rule.dimension] = space.per_rank_recompute and True in rule.allowed
            continue
        current = getattr(space, rule.dimension)
        kept = rule.allowed if current is None else tuple(v for v in current if v in rule.allowed)
        if not kept:
            raise PlannerError(
                f"{version.runtime} runs {rule.dimension} {', '.join(map(str, rule.allowed))} only, but the search "
                f"was restricted to {', '.join(map(str, current))}"
            )
        changes[rule.dimension] = kept
    named = changes.get("schedules", space.schedules)
    if named is not None:  # no runtime runs chimera or seq1f1b (every exporter refuses them)
        runnable = tuple(name for name in named if SCHEDULES[name].simulated_only is None)
        if not runnable:
            raise PlannerError(
                f"{version.runtime} runs none of the schedules {', '.join(named)}: no runtime the "
                "planner exports to runs them; plan for no runtime to compare them"
            )
        changes["schedules"] = runnable
    return replace(space, **changes)


def runtime_check(
    runtime: str, spec: ModelSpec, cluster: Cluster, global_batch: int, seq: int, options: CostOptions | None = None
):
    """A search `accept` callback: None when the exporter of `runtime` (NAME[@VERSION]) takes
    the layout (as priced under `options`: its precision and MoE mechanisms), else its reason
    (less its advice to re-plan for the runtime, which is what the search is doing). None
    (no check) for a version without an exporter."""
    exporter = resolve(runtime).exporter
    if exporter is None:
        return None
    summary = ClusterSummary(gpu=cluster.gpu.name, num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node)

    def check(layout: Layout) -> str | None:
        priced = {} if options is None else priced_options(options, spec, layout)
        entry = entry_from_layout(layout, global_batch, seq, None, **priced)
        document = PlanFile(plans=[entry], model=spec, cluster=summary, planner_version="", cost_source="")
        reason = refusal(document, exporter)
        return None if reason is None else reason.replace(f"; {replan_for(exporter)}", "")

    return check


def with_runtimes(document: PlanFile) -> PlanFile:
    """The plan file with each plan's `runtimes`: those whose exporter takes it as it is."""
    plans = [
        entry.model_copy(update={"runtimes": runs_on(document, index)}) for index, entry in enumerate(document.plans)
    ]
    return document.model_copy(update={"plans": plans})


def model_refusal(spec: ModelSpec, runtime: str) -> str | None:
    """Why `runtime` (NAME[@VERSION]) runs no layout of `spec` at all (its exporter refuses
    the simplest one: one GPU, no pipeline, no recompute), or None when the model itself is no
    obstacle or the version has no exporter to ask."""
    exporter = resolve(runtime).exporter
    if exporter is None:
        return None
    entry = PlanEntry(
        tp=1,
        pp=1,
        dp=1,
        mbs=1,
        num_microbatches=1,
        global_batch=1,
        seq=128,
        schedule="1f1b",
        stage_layers=[(0, spec.num_layers)],
    )
    return refusal(PlanFile(plans=[entry], model=spec), exporter)


def model_runtimes(spec: ModelSpec) -> list[str]:
    """The runtimes that run some layout of `spec` (see `model_refusal`)."""
    return [name for name in exporting_runtimes() if model_refusal(spec, name) is None]
