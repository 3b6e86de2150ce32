"""Why the best plan won, and what would make an infeasible request fit.

`alternatives` changes one dimension of the best plan at a time (TP, PP, micro-batch size,
schedule, V, recompute, sequence parallelism, ZeRO), searches the best layout with that
change (cut points re-solved) and names what it lost to: out of memory by how much, or
the part of the step time (pipeline idle, TP/CP or DP communication, compute, optimizer)
that grew the most. `what_would_fit` re-runs the search with one relaxation at a time
(recompute, ZeRO, micro-batch 1, more GPUs, a larger GPU) for a request where nothing fits.
`nearest_layouts` answers a request with no layout at all (the GPUs or the batch do not
divide): the nearest GPU counts below and above with layouts, found by the divisibility
rules alone and then searched for their best tokens/s, and the nearest global batches that
have layouts on the requested GPUs. Every suggestion is the command to type next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from planner.catalog import resolve_gpu
from planner.cost.model import CostModel, options_for_gpu
from planner.hints import planner_command
from planner.layout import Layout
from planner.plan import RECOMPUTE_MODES
from planner.predict import Prediction, runs_combined_1f1b
from planner.schedule import SCHEDULES
from planner.search.search import Accept, Found, SearchResult, search
from planner.search.space import DEFAULT_MBS, DEFAULT_SCHEDULES, SearchSpace, candidates, meshes
from planner.spec import Cluster, ModelSpec
from planner.units import GiB

PART_NAMES = {
    "compute": "compute per GPU",
    "pipeline": "pipeline idle and uneven stages",
    "tp_cp_comm": "TP/CP communication",
    "dp_comm_exposed": "DP communication",
    "fsdp_copies": "FSDP2 copy kernels",
    "moe_all_to_all": "MoE all-to-all",
    "optimizer": "optimizer step",
}
"""How a reason names each part of `step_parts`."""
RECOMPUTE_WEIGHT = {"none": 0, "selective": 1, "full": 2}
LARGER_GPUS = ("h200", "b200", "mi300x")
NEIGHBOUR_SEARCHES = 3
"""GPU counts searched on each side of a request with no layout, nearest first, until one
has a plan that fits in memory."""
MAX_BATCH_TRIES = 64
"""Global batches tried on each side (nearest multiples of dp x mbs first)."""


@dataclass(frozen=True, slots=True)
class Alternative:
    """A one-dimension change of the best plan and how it fared."""

    change: str
    found: Found | None
    """Its best layout, or None when nothing with this change fits."""
    reason: str


def layout_text(layout: Layout) -> str:
    """A layout on one line: 'tp8 pp16 dp128 cp1 1f1b V1 mbs1 M16 recompute full'."""
    modes = sorted(set(layout.recompute))
    return (
        f"tp{layout.tp} pp{layout.pp} dp{layout.dp} cp{layout.cp} {layout.schedule} V{layout.vpp} "
        f"{f'k{layout.segments} ' if layout.segments > 1 else ''}"
        f"mbs{layout.mbs} M{layout.num_microbatches} recompute {'/'.join(modes)}"
        f"{' sp' if layout.sequence_parallel else ''} zero{layout.zero_stage}"
        f"{f' ep{layout.ep} etp{layout.expert_tp}' if layout.etp is not None else ''}"
    )


def layout_choices(layout: Layout) -> dict[str, str | None]:
    """Each choice of a layout as a word of `layout_text` (sequence parallelism off: 'no sp';
    None: not a choice of this layout)."""
    return {
        "tp": f"tp{layout.tp}",
        "pp": f"pp{layout.pp}",
        "dp": f"dp{layout.dp}",
        "cp": f"cp{layout.cp}",
        "schedule": layout.schedule,
        "V": f"V{layout.vpp}",
        "segments": f"k{layout.segments}" if layout.segments > 1 else None,
        "mbs": f"mbs{layout.mbs}",
        "M": f"M{layout.num_microbatches}",
        "recompute": f"recompute {'/'.join(sorted(set(layout.recompute)))}",
        "sp": "sp" if layout.sequence_parallel else "no sp",
        "zero": f"zero{layout.zero_stage}",
        "ep": f"ep{layout.ep}" if layout.etp is not None else None,
        "etp": f"etp{layout.expert_tp}" if layout.etp is not None else None,
    }


def layout_changes(best: Layout, other: Layout) -> str:
    """The choices of `other` that differ from `best`'s, e.g. 'tp2 dp128 M8 recompute full'."""
    before = layout_choices(best)
    return " ".join(word for name, word in layout_choices(other).items() if word and word != before[name])


def alternatives(
    model: CostModel, best: Found, global_batch: int, seq: int, space: SearchSpace, accept: Accept | None = None
) -> list[Alternative]:
    """The best plan with each single change, and why each is slower or does not fit."""
    layout = best.layout
    pinned = _pinned(layout, space)
    changes: list[tuple[str, SearchSpace]] = []
    for tp in (layout.tp // 2, layout.tp * 2):
        if tp >= 1 and (space.tp is None or tp in space.tp):
            changes.append((f"tp {tp}", replace(pinned, tp=(tp,))))
    for pp in (layout.pp // 2, layout.pp * 2):
        if pp >= 1 and (space.pp is None or pp in space.pp):
            changes.append(
                (
                    f"pp {pp}",
                    replace(pinned, pp=(pp,), schedules=space.schedules, vpp=space.vpp, segments=space.segments),
                )
            )
    for mbs in (layout.mbs // 2, layout.mbs * 2):
        if mbs >= 1 and (space.mbs is None or mbs in space.mbs):
            changes.append((f"mbs {mbs}", replace(pinned, mbs=(mbs,))))
    for name in space.schedules or DEFAULT_SCHEDULES:
        if name != layout.schedule and layout.pp > 1:
            changes.append(
                (f"schedule {name}", replace(pinned, schedules=(name,), vpp=space.vpp, segments=space.segments))
            )
    if layout.segments > 1:  # seq1f1b: half and twice the sequence segments
        for k in (layout.segments // 2, layout.segments * 2):
            if k >= 1 and (space.segments is None or k in space.segments):
                changes.append((f"segments {k}", replace(pinned, segments=(k,))))
    for vpp in (layout.vpp - 1, layout.vpp + 1):
        if layout.pp > 1 and SCHEDULES[layout.schedule].allows_vpp(vpp) and (space.vpp is None or vpp in space.vpp):
            changes.append((f"V {vpp}", replace(pinned, vpp=(vpp,))))
    for mode in space.recompute:
        if set(layout.recompute) != {mode}:
            changes.append(
                (f"recompute {mode} everywhere", replace(pinned, recompute=(mode,), per_rank_recompute=False))
            )
    if layout.tp > 1:
        changes.append(
            (
                f"sequence parallel {'off' if layout.sequence_parallel else 'on'}",
                replace(pinned, sequence_parallel=(not layout.sequence_parallel,)),
            )
        )
    for zero in space.zero:
        if zero != layout.zero_stage:
            changes.append((f"zero {zero}", replace(pinned, zero=(zero,))))
    if layout.etp is not None:  # an MoE layout: its expert folding, one degree at a time
        for ep in (layout.ep // 2, layout.ep * 2):
            if ep >= 1 and (space.ep is None or ep in space.ep):
                changes.append((f"ep {ep}", replace(pinned, ep=(ep,))))
        for etp in sorted({1, layout.tp} - {layout.expert_tp}):
            if space.etp is None or etp in space.etp:
                changes.append((f"etp {etp}", replace(pinned, etp=(etp,))))
    limit = model.cluster.memory_limit_bytes
    result = []
    for change, other_model in _moe_mechanisms(model, layout):
        result.append(_mechanism_alternative(change, other_model, best, global_batch, seq, pinned, accept))
    for change, changed in changes:
        found = search(model, global_batch, seq, changed, top=1, accept=accept)
        if found.plans:
            result.append(Alternative(change, found.plans[0], _slower_because(model.spec, best, found.plans[0])))
        elif found.smallest_need_bytes < float("inf"):
            over = found.smallest_need_bytes - limit
            result.append(
                Alternative(
                    change,
                    None,
                    f"out of memory: needs {found.smallest_need_bytes / GiB:.1f} GiB, "
                    f"{over / GiB:.1f} GiB over the limit",
                )
            )
    return result


def _moe_mechanisms(model: CostModel, layout: Layout) -> list[tuple[str, CostModel]]:
    """For an MoE layout with EP > 1: the cost model with the other token dispatcher, and with
    Megatron's combined-1F1B all-to-all overlap switched the other way."""
    if not model.spec.is_moe or layout.ep == 1:
        return []
    options, moe = model.options, model.options.moe
    dispatcher = "alltoall" if moe.moe_dispatcher == "deepep" else "deepep"
    changed = [
        (f"dispatcher {dispatcher}", options.with_fields(moe_dispatcher=dispatcher)),
        (
            f"EP overlap {'off' if moe.moe_ep_overlap else 'on'}",
            options.with_fields(moe_ep_overlap=not moe.moe_ep_overlap),
        ),
    ]
    return [
        (change, CostModel(model.spec, model.cluster, other, model.source, model.network)) for change, other in changed
    ]


def _mechanism_alternative(
    change: str, other: CostModel, best: Found, global_batch: int, seq: int, pinned: SearchSpace, accept: Accept | None
) -> Alternative:
    """The best plan's dimensions priced with another MoE mechanism: how much faster or slower,
    and by how much its exposed all-to-all moves (or why Megatron would not run the overlap)."""
    layout = best.layout
    if other.options.moe.moe_ep_overlap and not runs_combined_1f1b(other.options, other.spec, layout):
        return Alternative(
            change,
            None,
            "Megatron runs no combined 1F1B on this layout: it needs EP > 1, "
            "no pipeline or interleaved 1F1B, no full recompute, at most one MTP layer",
        )
    found = search(other, global_batch, seq, pinned, top=1, accept=accept)
    if not found.plans:
        return Alternative(change, None, "nothing fits")
    before, after = best.prediction, found.plans[0].prediction
    moved = after.time_breakdown_s.get("moe_all_to_all", 0.0) - before.time_breakdown_s.get("moe_all_to_all", 0.0)
    ratio = after.step_time_s / before.step_time_s - 1
    pace = "as fast" if abs(ratio) < 5e-4 else f"{abs(ratio):.1%} {'slower' if ratio > 0 else 'faster'}"
    return Alternative(change, found.plans[0], f"{pace}: MoE all-to-all {moved:+.3f} s")


def what_would_fit(
    model: CostModel,
    result: SearchResult,
    global_batch: int,
    seq: int,
    space: SearchSpace,
    accept: Accept | None = None,
) -> str:
    """One paragraph for an infeasible request: the smallest need found and what fits instead."""
    cluster = model.cluster
    limit = cluster.memory_limit_bytes
    need = result.smallest_need_bytes
    where = result.smallest_need
    lines = [
        f"no layout of {model.spec.name} on {cluster.num_gpus} x {cluster.gpu.name} fits in "
        f"{limit / GiB:.1f} GiB per GPU"
    ]
    if need < float("inf"):
        shown = layout_text(where) if isinstance(where, Layout) else "its weight and optimizer state alone"
        lines.append(f"the smallest need found is {need / GiB:.1f} GiB ({shown})")

    def fits(text: str, other_model: CostModel, other_space: SearchSpace) -> str | None:
        found = search(other_model, global_batch, seq, other_space, top=1, accept=accept)
        if not found.plans:
            return None
        p = found.plans[0].prediction
        return f"{text}: fits with {p.peak_memory_bytes / GiB:.1f} GiB, step {p.step_time_s:.2f} s, MFU {p.mfu:.1%}"

    tries: list[tuple[str, CostModel, SearchSpace]] = []
    if set(space.recompute) != set(RECOMPUTE_MODES) or not space.per_rank_recompute:
        tries.append(
            (
                planner_command("plan", f"--recompute {','.join(RECOMPUTE_MODES)}", "--per-rank-recompute"),
                model,
                replace(space, recompute=RECOMPUTE_MODES, per_rank_recompute=True),
            )
        )
    if 3 not in space.zero:
        tries.append(
            (
                planner_command("plan", "--zero 1,2,3") + " (ZeRO-3 shards weights, gradients and optimizer state)",
                model,
                replace(space, zero=(1, 2, 3)),
            )
        )
    if space.mbs != (1,):
        tries.append((planner_command("plan", "--mbs 1"), model, replace(space, mbs=(1,))))
    helps = [h for h in (fits(*t) for t in tries) if h]
    for factor in (2, 4, 8):  # only the smallest cluster that fits is worth naming
        num_gpus = cluster.num_gpus * factor
        bigger = CostModel(model.spec, cluster.model_copy(update={"num_gpus": num_gpus}), model.options, model.source)
        if h := fits(f"{factor}x the GPUs, {planner_command('plan', f'--gpus {num_gpus}')}", bigger, space):
            helps.append(h)
            break
    for name in LARGER_GPUS:
        gpu = resolve_gpu(name)
        if gpu.memory_gib * GiB > limit and cluster.memory_limit_gib is None:
            h = fits(
                f"{planner_command('plan', f'--gpu {name}')} ({gpu.memory_gib:.0f} GiB)",
                CostModel(model.spec, Cluster.of(gpu, cluster.num_gpus), options_for_gpu(model.options, gpu)),
                space,
            )
            helps += [h] if h else []
    if helps:
        lines.append("what would fit: " + "; ".join(helps))
    else:
        lines.append("none of recompute, ZeRO-3, micro-batch 1, up to 8x the GPUs or a larger GPU fits either")
    return "; ".join(lines)


def nearest_layouts(
    model: CostModel,
    global_batch: int,
    seq: int,
    space: SearchSpace,
    accept_for: Callable[[Cluster], Accept | None] = lambda cluster: None,
) -> str:
    """The message for a request with no layout at all: why, the nearest GPU counts below
    and above that have layouts (with their best predicted tokens/s), and the nearest global
    batches that have layouts on the requested GPUs. `accept_for` gives a cluster's runtime check."""
    spec, cluster = model.spec, model.cluster
    restricted = any(getattr(space, f) is not None for f in ("tp", "pp", "cp", "vpp", "mbs", "schedules"))
    lines = [
        f"no layout of {spec.name} on {cluster.num_gpus} GPUs with global batch {global_batch}"
        f"{' within the restrictions given' if restricted else ''}: a layout needs tp x pp x dp x cp = "
        f"the GPUs, tp dividing the {spec.num_attention_heads} heads, pp at most the {spec.num_layers} "
        "layers and dp x mbs dividing the global batch"
    ]
    counts = []
    for side in (_counts_below(cluster), _counts_above(cluster)):
        if (found := _nearest_count(model, global_batch, seq, space, accept_for, side)) is not None:
            counts.append(found)
    if counts:
        lines.append("nearest GPU counts with layouts: " + "; ".join(counts))
    batches = _nearest_batches(spec, cluster, global_batch, seq, space)
    if batches:
        lines.append(
            f"nearest global batches with layouts on {cluster.num_gpus} GPUs: "
            + "; ".join(f"{b} {planner_command('plan', f'--global-batch {b}')}" for b in batches)
        )
    if not counts and not batches:
        lines.append(
            f"no GPU count from 1 to {2 * cluster.num_gpus} and no global batch has one either"
            f"{': loosen the restrictions' if restricted else ''}"
        )
    return "\n  ".join(lines)


def _has_layouts(spec: ModelSpec, cluster: Cluster, global_batch: int, seq: int, space: SearchSpace) -> bool:
    """Whether the divisibility rules leave any candidate (no costs are computed)."""
    return next(candidates(spec, cluster, global_batch, seq, space), None) is not None


def _resized(cluster: Cluster, num_gpus: int) -> Cluster:
    """The cluster with `num_gpus` GPUs (a node no larger than that), its wiring unchanged."""
    return cluster.model_copy(update={"num_gpus": num_gpus, "gpus_per_node": min(cluster.gpus_per_node, num_gpus)})


def _counts_below(cluster: Cluster) -> Iterator[Cluster]:
    """Smaller clusters, nearest first: whole nodes, then fewer GPUs than a node."""
    n, per_node = cluster.num_gpus, cluster.gpus_per_node
    whole = range((n - 1) // per_node * per_node, per_node - 1, -per_node) if n > per_node else range(0)
    for count in (*whole, *range(min(n, per_node) - 1, 0, -1)):
        yield _resized(cluster, count)


def _counts_above(cluster: Cluster) -> Iterator[Cluster]:
    """Larger clusters up to twice the GPUs, nearest first (whole nodes past one node)."""
    n, per_node = cluster.num_gpus, cluster.gpus_per_node
    for count in range(n + 1, min(2 * n, per_node) + 1):
        yield _resized(cluster, count)
    for count in range(max(n // per_node + 1, 2) * per_node, 2 * n + 1, per_node):
        yield _resized(cluster, count)


def _nearest_count(
    model: CostModel,
    global_batch: int,
    seq: int,
    space: SearchSpace,
    accept_for: Callable[[Cluster], Accept | None],
    clusters: Iterator[Cluster],
) -> str | None:
    """The nearest of `clusters` with layouts, preferring one whose best plan fits in memory
    (searched for at most NEIGHBOUR_SEARCHES counts), as text with the command to type."""
    first = None
    searched = 0
    for cluster in clusters:
        if not _has_layouts(model.spec, cluster, global_batch, seq, space):
            continue
        command = planner_command("plan", f"--gpus {cluster.num_gpus}")
        first = first or f"{cluster.num_gpus} {command} (none fits in memory)"
        result = search(
            CostModel(model.spec, cluster, model.options, model.source),
            global_batch,
            seq,
            space,
            top=1,
            accept=accept_for(cluster),
        )
        if result.plans:
            p = result.plans[0].prediction
            return f"{cluster.num_gpus} {command} (best {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%})"
        searched += 1
        if searched == NEIGHBOUR_SEARCHES:
            break
    return first


def _nearest_batches(spec: ModelSpec, cluster: Cluster, global_batch: int, seq: int, space: SearchSpace) -> list[int]:
    """The nearest global batches below and above `global_batch` with layouts on `cluster`:
    among the multiples of some mesh's dp x mbs, the nearest MAX_BATCH_TRIES on each side are
    checked by the divisibility rules, nearest first."""
    units = {dp * mbs for _, _, dp, _ in meshes(spec, cluster, seq, space) for mbs in space.mbs or DEFAULT_MBS}
    below = {(global_batch - 1) // u * u - k * u for u in units for k in range(MAX_BATCH_TRIES)}
    above = {(global_batch // u + 1 + k) * u for u in units for k in range(MAX_BATCH_TRIES)}
    found = []
    for side in (sorted((b for b in below if b > 0), reverse=True), sorted(above)):
        found += [next((b for b in side[:MAX_BATCH_TRIES] if _has_layouts(spec, cluster, b, seq, space)), None)]
    return [b for b in found if b is not None]


def _pinned(layout: Layout, space: SearchSpace) -> SearchSpace:
    """A space holding exactly the layout's choices (recompute left to the space)."""
    return replace(
        space,
        tp=(layout.tp,),
        pp=(layout.pp,),
        cp=(layout.cp,),
        vpp=(layout.vpp,),
        mbs=(layout.mbs,),
        schedules=(layout.schedule,),
        sequence_parallel=(layout.sequence_parallel,),
        zero=(layout.zero_stage,),
        ep=(layout.ep,),
        etp=(layout.etp,) if layout.etp is not None else space.etp,
        segments=(layout.segments,),
    )


def step_parts(prediction: Prediction) -> dict[str, float]:
    """The step's parts for comparing plans: `time_breakdown_s`, with the compute and idle time
    of the rank that finishes last recast as the pipeline ranks' mean compute ("compute") and
    the rest of that rank's time to its last action ("pipeline": its idle time and its work
    over the mean), so that a change of which rank finishes last moves neither."""
    parts = dict(prediction.time_breakdown_s)
    busy = prediction.timing.busy_s
    compute = sum(busy) / len(busy) - parts.get("tp_cp_comm", 0.0) - parts.get("moe_all_to_all", 0.0)
    pipeline = parts.pop("compute") + parts.pop("pipeline_bubble") + parts.pop("pp_p2p_blocked", 0.0) - compute
    return {"compute": compute, "pipeline": pipeline, **parts}


def compute_causes(spec: ModelSpec, best: Layout, other: Layout) -> list[str]:
    """What makes `other` compute more per GPU than `best`: more recompute, smaller GEMMs, and
    (an MoE model) the busiest expert rank's extra tokens."""
    causes = []
    if sum(RECOMPUTE_WEIGHT[m] for m in other.recompute) > sum(RECOMPUTE_WEIGHT[m] for m in best.recompute):
        causes.append(f"recompute {'/'.join(sorted(set(other.recompute) - {'none'}))}")
    if other.tp * other.cp > best.tp * best.cp or other.mbs < best.mbs:
        causes.append("smaller GEMMs")
    if spec.is_moe and other.ep > best.ep:
        causes.append("the busiest expert rank's extra tokens")
    return causes


def _slower_because(spec: ModelSpec, best: Found, other: Found) -> str:
    """How much slower `other` is than `best`, and the part of the step that grew the most."""
    slower = other.prediction.step_time_s / best.prediction.step_time_s - 1
    if slower <= 0:
        return "as fast (a tie)"
    before, after = step_parts(best.prediction), step_parts(other.prediction)
    deltas = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in before.keys() | after.keys()}
    part = max(deltas, key=deltas.get)
    name = PART_NAMES.get(part, part.replace("_", " "))
    if part == "compute" and (causes := compute_causes(spec, best.layout, other.layout)):
        name += f" ({', '.join(causes)})"
    return f"{slower:.1%} slower: {name} +{deltas[part]:.3f} s"
