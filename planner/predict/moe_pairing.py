"""Where an MoE layout's passes pair up (Megatron's combined 1F1B, DualPipeV) and what pairing saves."""

from __future__ import annotations

from functools import cache

from planner.cost.model import DUALPIPEV_PAIRING, CostModel, CostOptions
from planner.cost.overlap import combined_1f1b_step_excess
from planner.layout import Layout
from planner.predict.shards import kind_counts, layout_shard
from planner.runtimes.megatron_exchange import has_combined_1f1b_loop
from planner.schedule.registry import SCHEDULES
from planner.spec import ModelSpec


def pairs_moe_comm(model: CostModel, layout: Layout) -> bool | str:
    """Whether the layout's schedule hides each micro-batch's MoE all-to-all behind another's
    compute, as `CostModel.layer_costs`'s `paired` takes it: DUALPIPEV_PAIRING for DualPipeV
    with a pipeline (its own whole-pass overlap, whatever `moe_ep_overlap` says), True where
    Megatron's combined 1F1B runs the layout (`runs_combined_1f1b`), else False."""
    if SCHEDULES[layout.schedule].paired:
        return DUALPIPEV_PAIRING if layout.pp > 1 else False
    return runs_combined_1f1b(model.options, model.spec, layout)


def runs_combined_1f1b(options: CostOptions, spec: ModelSpec, layout: Layout) -> bool:
    """Whether Megatron's combined 1F1B (`CostOptions.moe.moe_ep_overlap`: --overlap-moe-expert-
    parallel-comm with --delay-wgrad-compute) runs this layout, as megatron-core 0.19.2 decides:
    schedules.py sends training without a pipeline (forward_backward_no_pipelining ->
    combined_1f1b_schedule_for_no_pipelining) and interleaved 1F1B
    (forward_backward_pipelining_with_interleaving -> combined_1f1b_schedule_for_interleaved_
    pipelining) to it, and TransformerConfig.__post_init__ refuses the overlap with PP > 1 and no
    virtual stages, without expert parallelism (EP 1), with full recompute, and with more than
    one MTP layer. Not under DualPipeV (Megatron-LM does not run it; `pairs_moe_comm` pairs it
    on its own)."""
    return combined_1f1b_runs(options, spec, layout.schedule, layout.pp, layout.ep, layout.recompute)


def combined_1f1b_runs(
    options: CostOptions, spec: ModelSpec, schedule: str, pp: int, ep: int, recompute: tuple[str, ...]
) -> bool:
    """`runs_combined_1f1b` of a layout of this schedule, PP and EP whose ranks recompute
    in the modes `recompute` (the search asks with none, then costs a mode `full` unpaired)."""
    if not (options.moe.moe_ep_overlap and spec.is_moe) or SCHEDULES[schedule].paired:
        return False
    if ep == 1 or spec.mtp_depth > 1 or "full" in recompute:
        return False
    return has_combined_1f1b_loop(schedule, pp)


def priced_options(options: CostOptions, spec: ModelSpec, layout: Layout) -> dict:
    """The cost options a plan of `layout` was priced with, as PlanEntry fields: its GEMM
    precision, the MoE token dispatcher ("deepep" only where DeepEP's kernels were costed: an
    MoE model with EP > 1) and whether Megatron's combined-1F1B all-to-all overlap was
    (`runs_combined_1f1b`). A dense model records the MoE defaults whatever was asked. The
    attention kernel, always."""
    deepep = options.moe.moe_dispatcher == "deepep" and spec.is_moe and layout.ep > 1
    return {
        "precision": options.kernels.precision,
        "moe_dispatcher": "deepep" if deepep else "alltoall",
        "moe_ep_overlap": runs_combined_1f1b(options, spec, layout),
        "attention": options.kernels.attention,
    }


def unpaired_share(model: CostModel, layout: Layout, rank: int) -> float:
    """Share of a rank's micro-batch passes that Megatron's combined 1F1B runs alone, their
    all-to-all exposed: the warm-up forwards (and as many cool-down backwards) of
    schedules.get_pp_rank_microbatches, 2 (PP - rank - 1) + (V - 1) x PP + 1 of M x V with
    interleaving (microbatch_group_size_per_vp_stage defaults to PP; the + 1 is the extra forward
    the overlap schedules "to ensure the forward and backward computations are independent"),
    and without a pipeline the first forward and the last backward (1 of M). 0 where nothing is
    paired, and under DualPipeV (charged paired throughout)."""
    if not pairs_moe_comm(model, layout) or SCHEDULES[layout.schedule].paired:
        return 0.0
    total = layout.num_microbatches * layout.vpp
    if layout.pp == 1:
        return min(1.0, 1 / layout.num_microbatches)
    warmup = 2 * (layout.pp - rank - 1) + (layout.vpp - 1) * layout.pp + 1
    return min(1.0, warmup / total)


@cache
def combined_1f1b_chunk_pairs(
    pp: int, vpp: int, microbatches: int, rank: int
) -> tuple[tuple[tuple[int, int], int], ...]:
    """(forward model chunk, backward model chunk) of each steady-state combined step on `rank`
    of Megatron's interleaved schedule with the MoE overlap, with how many steps pair them:
    step k runs virtual micro-batch k + W forward beside k backward (W the warm-up of
    `unpaired_share`), each chunk from schedules.get_schedule_table (groups of PP micro-batches,
    `microbatch_group_size_per_vp_stage` defaulting to PP, run through every chunk in turn) and
    get_model_chunk_id (the backward runs the chunks in reverse). Without a pipeline, chunk 0
    beside chunk 0, M - 1 times."""
    total = microbatches * vpp
    if pp == 1:
        return (((0, 0), microbatches - 1),) if microbatches > 1 else ()
    chunk_of = []
    for first in range(0, microbatches, pp):
        group = min(pp, microbatches - first)
        chunk_of += [chunk for chunk in range(vpp) for _ in range(group)]
    warmup = min(total, 2 * (pp - rank - 1) + (vpp - 1) * pp + 1)
    counts: dict[tuple[int, int], int] = {}
    for k in range(total - warmup):
        pair = (chunk_of[k + warmup], vpp - 1 - chunk_of[k])
        counts[pair] = counts.get(pair, 0) + 1
    return tuple(sorted(counts.items()))


def combined_1f1b_excess(model: CostModel, layout: Layout, seq: int) -> list[float]:
    """Per pipeline rank, seconds per micro-batch that Megatron's combined 1F1B takes beyond the
    steady-state per-layer costs: each combined step's joined start and end and the layers of
    the longer chunk that find no partner (planner/cost/overlap.py `combined_1f1b_step_excess`),
    summed over the rank's steady-state steps (`combined_1f1b_chunk_pairs`, each chunk's MoE
    blocks counted) over M. Zeros where the layout does not run combined 1F1B."""
    if not (runs_combined_1f1b(model.options, model.spec, layout) and layout.ep > 1):
        return [0.0] * layout.pp
    layer = model.combined_1f1b_layer(layout_shard(layout, seq))
    out = []
    for rank, per_rank in enumerate(layout.stage_layers):
        moe = [dict(kind_counts(model, start, end)).get("transformer", 0) for start, end in per_rank]
        pairs = combined_1f1b_chunk_pairs(layout.pp, layout.vpp, layout.num_microbatches, rank)
        total = sum(n * combined_1f1b_step_excess(layer, moe[f], moe[b]) for (f, b), n in pairs)
        out.append(total / layout.num_microbatches)
    return out
