"""What one candidate costs: its floors before cut points (memory, step time), the per-rank
cost tables the cut solvers take, and the Layout a set of cuts makes.

Memory of pipeline rank r mirrors `planner.predict` exactly for one chunk per rank:

    (1 + FRAGMENTATION) x (params_r x state + peak activations_r + transient_r)
        + cuBLAS workspace + CUDA context + NCCL buffers of r's communicators

with params_r = n_r x block + the embedding (first stage) and head (last stage), peak
activations = the micro-batch x chunk activations the schedule keeps in flight on r (its
`peak_inflight`, counted from the action order) times the rank's activations per chunk.
With V > 1 chunks per rank the in-flight count is spread evenly over the chunks, which the
final `predict` of each plan checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from planner.cost import memory
from planner.cost.model import CostModel, LayerCosts
from planner.cost.segments import segment_layer_costs
from planner.cost.shapes import Shard
from planner.layout import Layout, even_stage_counts, even_stage_layers, stage_layers_from_counts
from planner.plan import virtual_stage
from planner.predict import PAIRED_SCHEDULES, layout_memory, optimizer_time
from planner.pipeline import ChunkCosts
from planner.schedule import SCHEDULES, generate, head_rank, peak_held_counts
from planner.schedule.closed_form import inflight_closed_form
from planner.search.bounds import FIRST_CHUNK_SHARE, work_bound
from planner.search.partition import Cuts, RankCosts, split_into_chunks
from planner.search.space import Candidate


@dataclass(frozen=True, slots=True)
class Parts:
    """Layer costs of one candidate: the block in each allowed mode, embedding and head."""

    blocks: tuple[LayerCosts, ...]
    embedding: LayerCosts
    head: LayerCosts


def shard_of(candidate: Candidate, seq: int) -> Shard:
    """The micro-batch shape one GPU of the candidate sees."""
    return Shard(mbs=candidate.mbs, seq=seq, tp=candidate.tp, cp=candidate.cp,
                 sequence_parallel=candidate.sequence_parallel, ep=candidate.ep, etp=candidate.etp)


def parts_of(model: CostModel, candidate: Candidate, seq: int) -> Parts:
    """The candidate's layer costs (cached), per sequence segment under seq1f1b."""
    shard, k = shard_of(candidate, seq), candidate.segments
    paired = candidate.schedule in PAIRED_SCHEDULES and candidate.pp > 1
    if k == 1:
        return Parts(
            blocks=tuple(model.layer_costs("transformer", shard, mode, paired) for mode in candidate.modes),
            embedding=model.layer_costs("embedding", shard),
            head=model.layer_costs("head", shard),
        )
    return Parts(
        blocks=tuple(segment_layer_costs(model, "transformer", shard, mode, paired, k) for mode in candidate.modes),
        embedding=segment_layer_costs(model, "embedding", shard, segments=k),
        head=segment_layer_costs(model, "head", shard, segments=k),
    )


def replicas(candidate: Candidate) -> int:
    """Copies of the model the pipeline ranks hold together: 2 under chimera (one per
    direction), else 1."""
    return 2 if candidate.schedule == "chimera" and candidate.pp > 1 else 1


def total_s(costs: LayerCosts) -> float:
    """Forward, backward and exposed TP/CP communication of one micro-batch."""
    return costs.forward_s + costs.comm_forward_s + costs.backward_s + costs.comm_backward_s


def _forward_share(costs: LayerCosts) -> float:
    total = total_s(costs)
    return (costs.forward_s + costs.comm_forward_s) / total if total > 0 else 1.0


def state_bytes(candidate: Candidate) -> float:
    """Weight, gradient and optimizer bytes per parameter under the candidate's ZeRO stage."""
    s = memory.state_bytes_per_param(candidate.zero_stage, candidate.dp * candidate.cp)
    return s.weights + s.grads + s.optimizer


def block_state_bytes(candidate: Candidate, block: LayerCosts) -> float:
    """Training-state bytes of one block: its routed experts' state shards over the expert
    data-parallel ranks (EDP = TP x CP x DP / (ETP x EP)), the rest over DP x CP."""
    dense = state_bytes(candidate) * block.param_count
    if not block.expert_param_count:
        return dense
    edp = memory.expert_dp_shards(candidate.tp, candidate.cp, candidate.dp, candidate.ep,
                                  candidate.etp or candidate.tp)
    s = memory.state_bytes_per_param(candidate.zero_stage, edp)
    return dense + block.expert_param_count * (s.weights + s.grads + s.optimizer - state_bytes(candidate))


def total_params(model: CostModel, parts: Parts) -> float:
    """Parameters of one tensor-parallel shard of the whole model."""
    spec = model.spec
    params = spec.num_layers * parts.blocks[0].param_count + parts.embedding.param_count + parts.head.param_count
    if spec.tie_embeddings:
        params -= parts.head.param_count
    return params


def memory_floor(model: CostModel, candidate: Candidate, parts: Parts, inflight: tuple[int, ...]) -> float:
    """Bytes the most loaded GPU needs at least, whatever the cuts and recompute modes.

    Rank r with n_r layers holds their state and, at its in-flight peak, `inflight[r]`
    chunk activations of at least floor(n_r / V) layers each (its smallest chunk), in the
    mode that saves the least. Both are linear in n_r, c_r + k_r n_r, so the continuous
    relaxation of min over cuts of max_r (sum n_r = L) is exact in closed form:
    T = (L + sum c_r / k_r) / sum 1 / k_r; it is never above the best integer cuts."""
    pp, vpp = candidate.pp, candidate.vpp
    state = state_bytes(candidate)
    last = head_rank(candidate.schedule, pp, vpp)
    layer_count = replicas(candidate) * model.spec.num_layers
    least_saved = min(block.activation_bytes for block in parts.blocks)
    slack = (vpp - 1) / vpp  # floor(n / V) >= n / V - slack
    inverse_sum = weighted_sum = 0.0
    for rank in range(pp):
        per_layer_act = 0.0 if candidate.empty_ends and rank in (0, last) else inflight[rank] * least_saved
        fixed = state * _fixed_params(model, parts, rank, last, candidate) - per_layer_act * slack
        per_layer = block_state_bytes(candidate, parts.blocks[0]) + per_layer_act / vpp
        inverse_sum += 1.0 / per_layer
        weighted_sum += fixed / per_layer
    tensors = (layer_count + weighted_sum) / inverse_sum
    layer_state = block_state_bytes(candidate, parts.blocks[0]) - state * parts.blocks[0].param_count
    tensors = max(tensors, replicas(candidate) * (total_params(model, parts) * state
                                                  + model.spec.num_layers * layer_state) / pp)
    return (1 + memory.FRAGMENTATION) * tensors + outside_tensor_bytes(model, candidate)


def layout_memory_floor(model: CostModel, candidate: Candidate, parts: Parts,
                        inflight: tuple[int, ...]) -> Callable[[Layout], float]:
    """For layouts cut from `candidate`: the bytes the most loaded GPU needs at least, each
    rank's state and its in-flight count times its smallest chunk's activations."""
    state = state_bytes(candidate)
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    fixed = [state * _fixed_params(model, parts, rank, last, candidate) for rank in range(candidate.pp)]
    per_mode = {mode: (block_state_bytes(candidate, block), block.activation_bytes)
                for mode, block in zip(candidate.modes, parts.blocks)}
    grow = 1 + memory.FRAGMENTATION
    least_fixed = outside_tensor_bytes(model, candidate)

    def floor(layout: Layout) -> float:
        worst = 0.0
        for rank, per_rank in enumerate(layout.stage_layers):
            layers = [end - start for start, end in per_rank]
            layer_state, activation = per_mode[layout.recompute[rank]]
            need = fixed[rank] + sum(layers) * layer_state + inflight[rank] * min(layers) * activation
            worst = max(worst, need)
        return grow * worst + least_fixed

    return floor


def outside_tensor_bytes(model: CostModel, candidate: Candidate, rank: int | None = None) -> float:
    """Bytes of pipeline rank `rank` beside its tensors and their fragmentation (cuBLAS
    workspace, CUDA context, NCCL buffers), as `planner.predict` counts them; without `rank`,
    the least over the ranks."""
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    embedding_group = (rank is not None and model.spec.tie_embeddings and last != 0
                       and rank in (0, last))
    return memory.CUBLAS_WORKSPACE_BYTES + memory.outside_allocator_bytes(
        candidate.tp, candidate.cp, candidate.dp, candidate.pp, embedding_group)


def _fixed_params(model: CostModel, parts: Parts, rank: int, last: int, candidate: Candidate) -> float:
    """Parameters of rank `rank` outside its transformer layers: the embedding on the
    first rank, the head on `last` (once when tied and on the same rank); under chimera both
    on the first and the last rank (one per direction)."""
    if replicas(candidate) == 2:
        return parts.embedding.param_count + parts.head.param_count if rank in (0, candidate.pp - 1) else 0.0
    params = (parts.embedding.param_count if rank == 0 else 0) + (parts.head.param_count if rank == last else 0)
    if model.spec.tie_embeddings and rank == 0 and last == 0:
        params -= parts.head.param_count
    return params


def step_floor(model: CostModel, candidate: Candidate, parts: Parts, mode: int | None = None) -> float:
    """Seconds the step takes at least, whatever the cuts (the chain bound plus the Adam step);
    with `mode`, for layouts running that recompute mode (an index into candidate.modes) everywhere."""
    spec = model.spec
    blocks = parts.blocks if mode is None else (parts.blocks[mode],)
    work = spec.num_layers * min(total_s(b) for b in blocks) + total_s(parts.embedding)
    split = SCHEDULES[candidate.schedule].split_backward if candidate.pp > 1 else False
    share = FIRST_CHUNK_SHARE / candidate.vpp
    if split:
        share *= min(_forward_share(x) for x in (*blocks, parts.embedding))
    if replicas(candidate) == 2:  # a rank may start with either direction: no chain, the mean work
        share = 0.0
    units = candidate.num_microbatches * candidate.segments
    pipeline = work_bound(work, share, units, candidate.pp, candidate.empty_ends)
    optimizer = optimizer_time(model, candidate.zero_stage, candidate.dp * candidate.cp,
                               replicas(candidate) * total_params(model, parts) / candidate.pp)
    return pipeline + optimizer


def rank_costs(model: CostModel, candidate: Candidate, parts: Parts, inflight: tuple[int, ...],
               limit_bytes: float) -> RankCosts:
    """The cut solvers' input: per rank and mode, fixed and per-layer time and bytes (under
    chimera per pair of ranks r and P-1-r, which hold the same two model stages)."""
    pp, vpp = candidate.pp, candidate.vpp
    state = state_bytes(candidate)
    grow = 1 + memory.FRAGMENTATION
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    fixed_s, fixed_bytes, layer_bytes = [], [], []
    two = replicas(candidate) == 2
    for rank in range(pp // 2 if two else pp):
        fixed = [p for p, on in ((parts.embedding, rank == 0), (parts.head, rank == last)) if on]
        params = _fixed_params(model, parts, rank, last, candidate)
        held = (max(inflight[rank], inflight[pp - 1 - rank]) if two else inflight[rank]) / vpp
        fixed_s.append(sum(total_s(p) for p in fixed))
        fixed_bytes.append(tuple(
            grow * (params * state + held * sum(p.activation_bytes for p in fixed)
                    + max([block.peak_extra_bytes] + [p.peak_extra_bytes for p in fixed]))
            + outside_tensor_bytes(model, candidate, rank)
            for block in parts.blocks
        ))
        layer_bytes.append(tuple(
            grow * (block_state_bytes(candidate, block) + held * block.activation_bytes) for block in parts.blocks
        ))
    return RankCosts(
        modes=candidate.modes,
        fixed_s=tuple(fixed_s),
        fixed_bytes=tuple(fixed_bytes),
        layer_s=tuple(total_s(b) for b in parts.blocks),
        layer_bytes=tuple(layer_bytes),
        limit_bytes=limit_bytes,
        min_layers=vpp,
    )


def layout_of(candidate: Candidate, stage_layers, recompute: tuple[str, ...]) -> Layout:
    """The Layout of a candidate with these cuts and per-rank recompute modes."""
    return Layout(
        tp=candidate.tp, pp=candidate.pp, dp=candidate.dp, cp=candidate.cp, vpp=candidate.vpp,
        mbs=candidate.mbs, num_microbatches=candidate.num_microbatches, schedule=candidate.schedule,
        recompute=recompute, sequence_parallel=candidate.sequence_parallel,
        zero_stage=candidate.zero_stage, stage_layers=stage_layers, ep=candidate.ep, etp=candidate.etp,
        segments=candidate.segments,
    )


def solved_layout(candidate: Candidate, cuts: Cuts, num_layers: int) -> Layout:
    """The Layout of the cut solver's answer: each rank's layers spread over its chunks."""
    pp, vpp = candidate.pp, candidate.vpp
    if replicas(candidate) == 2:  # pair q (ranks q, P-1-q) runs model stages q and P-1-q
        counts = [0] * pp
        for pair, layers in enumerate(cuts.layers):
            counts[pair], counts[pp - 1 - pair] = split_into_chunks(layers, 2)
        modes = tuple(cuts.modes[min(rank, pp - 1 - rank)] for rank in range(pp))
        return layout_of(candidate, stage_layers_from_counts(counts, num_layers, pp, vpp, "chimera"), modes)
    counts = [0] * (pp * vpp)
    for rank, layers in enumerate(cuts.layers):
        for chunk, n in enumerate(split_into_chunks(layers, vpp)):
            counts[virtual_stage(rank, chunk, pp, candidate.schedule)] = n
    stage_layers = stage_layers_from_counts(counts, num_layers, pp, vpp, candidate.schedule)
    return layout_of(candidate, stage_layers, cuts.modes)


def even_layouts(candidate: Candidate, num_layers: int) -> list[Layout]:
    """Even cuts in each allowed mode, the same on every rank: the cuts `planner evaluate`
    assumes or, for an `empty_ends` candidate, the same over all but the first and last
    virtual stages, which hold only the embedding and the head."""
    pp, vpp, schedule = candidate.pp, candidate.vpp, candidate.schedule
    if candidate.empty_ends:
        counts = [0, *even_stage_counts(num_layers, pp * vpp - 2), 0]
        cuts = stage_layers_from_counts(counts, num_layers, pp, vpp, schedule)
    else:
        cuts = even_stage_layers(num_layers, pp, vpp, schedule)
    return [layout_of(candidate, cuts, (mode,) * pp) for mode in candidate.modes]


@lru_cache(maxsize=4096)
def held_counts(schedule: str, pp: int, num_microbatches: int, vpp: int,
                segments: int = 1) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """`peak_held_counts` of a schedule shape, cached across candidates."""
    return peak_held_counts(generate(schedule, pp, num_microbatches, vpp, segments), vpp)


@lru_cache(maxsize=4096)
def _inflight(schedule: str, pp: int, num_microbatches: int, vpp: int, segments: int = 1) -> tuple[int, ...]:
    known = inflight_closed_form(schedule, pp, num_microbatches, vpp, segments)
    if known is not None:
        return known
    held = held_counts(schedule, pp, num_microbatches, vpp, segments)
    return tuple(max(sum(v) for v in per_rank) for per_rank in held)


def inflight_of(candidate: Candidate) -> tuple[int, ...]:
    """Most micro-batch x chunk activations (seq1f1b: segment x chunk) each rank holds at
    once under the candidate's schedule."""
    return _inflight(candidate.schedule, candidate.pp, candidate.num_microbatches, candidate.vpp,
                     candidate.segments)


def excess_memory(model: CostModel, layout: Layout, costs: ChunkCosts) -> float | None:
    """The most loaded GPU's need in bytes when the layout is over the memory limit, else None.

    Exact for one chunk per rank (in-flight count x activations). With V chunks the held
    micro-batches spread unevenly over chunks of unequal size, so the in-flight count times
    the smallest and the largest chunk bracket the peak; the order's held counts decide only
    when the bracket straddles the limit."""
    limit = model.cluster.memory_limit_bytes
    inflight = _inflight(layout.schedule, layout.pp, layout.num_microbatches, layout.vpp, layout.segments)
    low = tuple(n * min(costs.activation_bytes[r]) for r, n in enumerate(inflight))
    need = max(m.total for m in layout_memory(model, layout, costs, low))
    if need > limit:
        return need
    if layout.vpp == 1:
        return None
    high = tuple(n * max(costs.activation_bytes[r]) for r, n in enumerate(inflight))
    if max(m.total for m in layout_memory(model, layout, costs, high)) <= limit:
        return None
    held = held_counts(layout.schedule, layout.pp, layout.num_microbatches, layout.vpp, layout.segments)
    exact = tuple(
        max(sum(n * b for n, b in zip(v, costs.activation_bytes[r])) for v in held[r])
        for r in range(layout.pp)
    )
    need = max(m.total for m in layout_memory(model, layout, costs, exact))
    return need if need > limit else None
