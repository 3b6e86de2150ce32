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
from dataclasses import dataclass, field
from functools import cache, lru_cache

from planner.cost import memory
from planner.cost.model import DENSE_BLOCK, DUALPIPEV_PAIRING, CostModel, LayerCosts
from planner.cost.segments import segment_layer_costs
from planner.cost.shapes import Shard
from planner.layout import (
    Layout,
    even_stage_counts,
    even_stage_layers,
    shared_fields,
    stage_layers_from_counts,
)
from planner.pipeline import ChunkCosts
from planner.predict import (
    combined_1f1b_runs,
    dp_equivalent_params,
    layout_memory,
    layout_shard,
    optimizer_time,
)
from planner.schedule import (
    SCHEDULES,
    generated_order,
    head_rank,
    peak_held_counts,
    schedule_info,
    virtual_stage,
)
from planner.schedule.closed_form import inflight_closed_form
from planner.search.bounds import FIRST_CHUNK_SHARE, round_trip_bound, work_bound
from planner.search.partition import Cuts, RankCosts, split_into_chunks
from planner.search.space import Candidate


@dataclass(frozen=True, slots=True)
class Parts:
    """Layer costs of one candidate: the block in each allowed mode, embedding and head; an
    MoE model's dense-MLP block and multi-token-prediction modules in each mode (empty when
    it has none)."""

    blocks: tuple[LayerCosts, ...]
    embedding: LayerCosts
    head: LayerCosts
    dense: tuple[LayerCosts, ...] = ()
    mtp: tuple[LayerCosts, ...] = ()
    counts: tuple[int, int] = (0, 0)
    """Layers of the main block's kind and of the dense one."""
    layer_params: float = field(init=False)
    """Parameters of all transformer layers (one TP shard), and the routed experts' among them."""
    layer_expert_params: float = field(init=False)
    step_terms: dict = field(init=False, compare=False, repr=False)
    least_saved: tuple[float, ...] = field(init=False)
    """Per kind (main, dense), the least activation bytes over the modes."""
    """The floors' per-mode terms (`_step_terms`), filled on first use."""

    def __post_init__(self) -> None:
        kinds = self.kinds(0)
        object.__setattr__(self, "layer_params", sum(n * b.param_count for n, b in zip(self.counts, kinds)))
        object.__setattr__(
            self, "layer_expert_params", sum(n * b.expert_param_count for n, b in zip(self.counts, kinds))
        )
        object.__setattr__(self, "step_terms", {})
        object.__setattr__(
            self,
            "least_saved",
            tuple(min(b.activation_bytes for b in blocks) for blocks in (self.blocks, self.dense) if blocks),
        )

    def kinds(self, mode: int) -> tuple[LayerCosts, ...]:
        """The block of each kind in mode `mode`: the main block, then the dense one if any."""
        return (self.blocks[mode], self.dense[mode]) if self.dense else (self.blocks[mode],)


def parts_of(model: CostModel, candidate: Candidate, seq: int) -> Parts:
    """The candidate's layer costs (cached: candidates share a few shapes), per sequence
    segment under seq1f1b."""
    return _parts(
        model, layout_shard(candidate, seq), candidate.modes, candidate_pairing(model, candidate), candidate.segments
    )


def candidate_pairing(model: CostModel, candidate: Candidate) -> bool | str:
    """`predict.pairs_moe_comm` of the candidate's layouts (their recompute modes aside):
    DualPipeV's pairing, or True where Megatron's combined 1F1B runs them (`runs_combined_1f1b`
    of a layout without full recompute; a mode `full` is costed unpaired in `_parts`)."""
    if SCHEDULES[candidate.schedule].paired:
        return DUALPIPEV_PAIRING if candidate.pp > 1 else False
    return combined_1f1b_runs(model.options, model.spec, candidate.schedule, candidate.pp, candidate.ep, ())


@lru_cache(maxsize=16384)
def _parts(model: CostModel, shard: Shard, modes: tuple[str, ...], paired: bool | str, segments: int) -> Parts:
    """Under combined 1F1B each mode but `full` is costed paired: predict pairs a layout's
    layers (all but Megatron's warm-up and cool-down passes, which cost more) unless one of its
    ranks recomputes in full, so the paired costs are the least any layout of these modes gets."""

    def costs(kind: str, mode: str = "none", pair: bool | str = False) -> LayerCosts:
        if pair is True and mode == "full":
            pair = False
        if segments == 1:
            return model.layer_costs(kind, shard, mode, pair)
        return segment_layer_costs(model, kind, shard, mode, pair, segments)

    return Parts(
        blocks=tuple(costs("transformer", mode, paired) for mode in modes),
        embedding=costs("embedding"),
        head=costs("head"),
        dense=tuple(costs(DENSE_BLOCK, mode) for mode in modes) if model.dense_block is not None else (),
        mtp=tuple(costs("mtp", mode, paired) for mode in modes) if model.spec.mtp_depth else (),
        counts=layer_counts(model),
    )


def layer_counts(model: CostModel) -> tuple[int, int]:
    """Layers of the main block's kind and of the dense-MLP kind."""
    dense = model.dense_layers_before[-1]
    return model.spec.num_layers - dense, dense


def replicas(candidate: Candidate) -> int:
    """Copies of the model the pipeline ranks hold together: 2 under chimera (one per
    direction), else 1."""
    return 2 if schedule_info(candidate.schedule).bidirectional and candidate.pp > 1 else 1


def total_s(costs: LayerCosts) -> float:
    """Forward, backward and exposed TP/CP communication of one micro-batch."""
    return costs.forward_s + costs.comm_forward_s + costs.backward_s + costs.comm_backward_s


def _forward_share(costs: LayerCosts) -> float:
    total = total_s(costs)
    return (costs.forward_s + costs.comm_forward_s) / total if total > 0 else 1.0


@cache
def _state_bytes_per_param(zero_stage: int, shards: int) -> float:
    s = memory.state_bytes_per_param(zero_stage, shards)
    return s.weights + s.grads + s.optimizer


def state_bytes(candidate: Candidate) -> float:
    """Weight, gradient and optimizer bytes per parameter under the candidate's ZeRO stage."""
    return _state_bytes_per_param(candidate.zero_stage, candidate.dp * candidate.cp)


def _expert_dp_shards(candidate: Candidate) -> int:
    return _expert_shards(candidate.tp, candidate.cp, candidate.dp, candidate.ep, candidate.etp or candidate.tp)


_expert_shards = lru_cache(maxsize=4096)(memory.expert_dp_shards)


def block_state_bytes(candidate: Candidate, block: LayerCosts) -> float:
    """Training-state bytes of one block (`sharded_state_bytes`)."""
    return sharded_state_bytes(candidate, block.param_count, block.expert_param_count)


def sharded_state_bytes(candidate: Candidate, params: float, expert_params: float) -> float:
    """Training-state bytes of `params` parameters of which `expert_params` are routed
    experts: the experts' state shards over the expert data-parallel ranks
    (EDP = TP x CP x DP / (ETP x EP)), the rest over DP x CP."""
    state = state_bytes(candidate)
    if not expert_params:
        return state * params
    expert = _state_bytes_per_param(candidate.zero_stage, _expert_dp_shards(candidate))
    return state * params + expert_params * (expert - state)


def total_params(model: CostModel, parts: Parts) -> float:
    """Parameters of one tensor-parallel shard of the whole model."""
    spec = model.spec
    params = parts.layer_params + parts.embedding.param_count + parts.head.param_count
    if spec.tie_embeddings:
        params -= parts.head.param_count
    if parts.mtp:  # its own embedding copy only when the head is on another rank than the embedding
        params += parts.mtp[0].param_count - parts.embedding.param_count
    return params


def layers_state_bytes(candidate: Candidate, parts: Parts) -> float:
    """Training-state bytes of every transformer layer of one tensor-parallel shard."""
    return sharded_state_bytes(candidate, parts.layer_params, parts.layer_expert_params)


def memory_floor(model: CostModel, candidate: Candidate, parts: Parts, inflight: tuple[int, ...]) -> float:
    """Bytes the most loaded GPU needs at least, whatever the cuts and recompute modes.

    Rank r with n_r layers holds their state and, at its in-flight peak, `inflight[r]`
    chunk activations of at least floor(n_r / V) layers each (its smallest chunk), in the
    mode that saves the least. Both are linear in n_r, c_r + k_r n_r, so the continuous
    relaxation of min over cuts of max_r (sum n_r = L) is exact in closed form:
    T = (L + sum c_r / k_r) / sum 1 / k_r; it is never above the best integer cuts. With
    layers of two kinds it holds for the main kind's layers alone (the others only add) and
    for all layers at the lesser kind's bytes; the larger of the two is the floor."""
    kinds = [parts.blocks] + ([parts.dense] if parts.dense else [])
    per_kind = [
        (n, block_state_bytes(candidate, blocks[0]), saved)
        for n, blocks, saved in zip(parts.counts, kinds, parts.least_saved)
    ]
    options = (
        [per_kind[0]]
        if len(per_kind) == 1
        else [per_kind[0], (model.spec.num_layers, min(k[1] for k in per_kind), min(k[2] for k in per_kind))]
    )
    state = state_bytes(candidate)
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    fixed = _fixed_state_per_rank(model, candidate, parts, last, state)
    copies = replicas(candidate)  # chimera: every layer on two ranks
    tensors = max(
        _relaxed_peak(candidate, inflight, fixed, last, copies * option[0], *option[1:])
        for option in options
        if option[0]
    )
    outside_layers = total_params(model, parts) - parts.layer_params
    tensors = max(tensors, copies * (outside_layers * state + layers_state_bytes(candidate, parts)) / candidate.pp)
    return (1 + memory.FRAGMENTATION) * tensors + outside_tensor_bytes(model, candidate)


def _relaxed_peak(
    candidate: Candidate,
    inflight: tuple[int, ...],
    fixed_state: list[float],
    last: int,
    layers: int,
    layer_state: float,
    least_saved: float,
) -> float:
    """The continuous relaxation of `memory_floor` for `layers` layers (over all ranks) of
    `layer_state` state and `least_saved` activation bytes each, beside each rank's `fixed_state`."""
    vpp = candidate.vpp
    slack = (vpp - 1) / vpp  # floor(n / V) >= n / V - slack
    no_layer_activations = (0, last) if candidate.empty_ends else ()
    inverse_sum = weighted_sum = 0.0
    for rank, held in enumerate(inflight):
        per_layer_act = 0.0 if rank in no_layer_activations else held * least_saved
        fixed = fixed_state[rank] - per_layer_act * slack
        per_layer = layer_state + per_layer_act / vpp
        inverse_sum += 1.0 / per_layer
        weighted_sum += fixed / per_layer
    return (layers + weighted_sum) / inverse_sum


def layout_memory_floor(
    model: CostModel, candidate: Candidate, parts: Parts, inflight: tuple[int, ...]
) -> Callable[[Layout], float]:
    """For layouts cut from `candidate`: the bytes the most loaded GPU needs at least, each
    rank's state and its in-flight count times its smallest chunk's activations."""
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    fixed = _fixed_state_per_rank(model, candidate, parts, last, state_bytes(candidate))
    per_mode = {mode: _per_layer_bytes(candidate, parts.kinds(index)) for index, mode in enumerate(candidate.modes)}
    grow = 1 + memory.FRAGMENTATION
    least_fixed = outside_tensor_bytes(model, candidate)
    dense_before = model.dense_layers_before

    def floor(layout: Layout) -> float:
        worst = 0.0
        for rank, per_rank in enumerate(layout.stage_layers):
            main_state, main_act, dense_state, dense_act = per_mode[layout.recompute[rank]]
            state = 0.0
            least_chunk = float("inf")
            for start, end in per_rank:
                dense = dense_before[end] - dense_before[start]
                main = end - start - dense
                state += main * main_state + dense * dense_state
                chunk = main * main_act + dense * dense_act
                if chunk < least_chunk:
                    least_chunk = chunk
            need = fixed[rank] + state + inflight[rank] * least_chunk
            if need > worst:
                worst = need
        return grow * worst + least_fixed

    return floor


def _per_layer_bytes(candidate: Candidate, kinds: tuple[LayerCosts, ...]) -> tuple[float, float, float, float]:
    """State and activation bytes of one main block, then of one dense block (0, 0 without
    dense blocks): a layout floor's per-layer terms."""
    pairs = [(block_state_bytes(candidate, block), block.activation_bytes) for block in kinds]
    (main_state, main_act), (dense_state, dense_act) = pairs[0], pairs[1] if len(pairs) > 1 else (0.0, 0.0)
    return main_state, main_act, dense_state, dense_act


def outside_tensor_bytes(model: CostModel, candidate: Candidate, rank: int | None = None) -> float:
    """Bytes of pipeline rank `rank` beside its tensors and their fragmentation (cuBLAS
    workspace, CUDA context, NCCL buffers), as `planner.predict` counts them; without `rank`,
    the least over the ranks."""
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    embedding_group = rank is not None and model.spec.tie_embeddings and last != 0 and rank in (0, last)
    return memory.CUBLAS_WORKSPACE_BYTES + memory.outside_allocator_bytes(
        candidate.tp, candidate.cp, candidate.dp, candidate.pp, embedding_group, model.options.memory.cuda_context_bytes
    )


def _fixed_params(model: CostModel, parts: Parts, rank: int, last: int, candidate: Candidate) -> float:
    """Parameters of rank `rank` outside its transformer layers: the embedding on the
    first rank, the head on `last` (once when tied and on the same rank); the MTP modules'
    beside the head (less their embedding copy when the first rank holds the head too); under
    chimera the embedding, the head and the MTP modules (with their own embedding copy) on
    both the first and the last rank (one replica's embedding, the other's head)."""
    if replicas(candidate) == 2:
        if rank not in (0, candidate.pp - 1):
            return 0.0
        return parts.embedding.param_count + parts.head.param_count + (parts.mtp[0].param_count if parts.mtp else 0.0)
    params = (parts.embedding.param_count if rank == 0 else 0) + (parts.head.param_count if rank == last else 0)
    if model.spec.tie_embeddings and rank == 0 and last == 0:
        params -= parts.head.param_count
    if parts.mtp and rank == last:
        params += parts.mtp[0].param_count - (parts.embedding.param_count if last == 0 else 0)
    return params


def _fixed_state_per_rank(model: CostModel, candidate: Candidate, parts: Parts, last: int, state: float) -> list[float]:
    """Per rank, training-state bytes outside its transformer layers at `state` bytes per
    parameter (the MTP modules' routed experts shard over EDP; chimera's on its two end ranks)."""
    fixed = [0.0] * candidate.pp
    ends = {0, candidate.pp - 1} if replicas(candidate) == 2 else {0, last}
    for rank in ends:
        fixed[rank] = state * _fixed_params(model, parts, rank, last, candidate)
        if parts.mtp and (rank == last or replicas(candidate) == 2):
            mtp = parts.mtp[0]  # its routed experts' state over EDP rather than DP x CP
            fixed[rank] += block_state_bytes(candidate, mtp) - state * mtp.param_count
    return fixed


def step_floor(model: CostModel, candidate: Candidate, parts: Parts, mode: int | None = None) -> float:
    """Seconds the step takes at least, whatever the cuts (the chain bound plus the Adam step);
    with `mode`, for layouts running that recompute mode (an index into candidate.modes) everywhere."""
    work, least_share = _step_terms(model, parts, mode)[:2]
    split = SCHEDULES[candidate.schedule].split_backward if candidate.pp > 1 else False
    share = FIRST_CHUNK_SHARE / candidate.vpp
    if split:
        share *= least_share
    if replicas(candidate) == 2:  # a rank may start with either direction: no chain, the mean work
        share = 0.0
    units = candidate.num_microbatches * candidate.segments
    pipeline = work_bound(work, share, units, candidate.pp, candidate.empty_ends)
    return pipeline + _optimizer_floor(model, candidate, parts, mode)


def round_trip_floor(model: CostModel, candidate: Candidate, parts: Parts) -> float:
    """Seconds the step takes at least, whatever the cuts and recompute modes: the round
    trip bound (planner/search/bounds.py) of the whole model's forward and backward (each
    layer in its quickest mode) plus the Adam step; 0 under chimera (two pipelines)."""
    if replicas(candidate) == 2:
        return 0.0
    forward, input_grad, weight_grad = _step_terms(model, parts, None)[4]
    split = SCHEDULES[candidate.schedule].split_backward
    backward = input_grad if split else weight_grad
    units = candidate.num_microbatches * candidate.segments
    return round_trip_bound(forward, backward, units, candidate.pp * candidate.vpp) + _optimizer_floor(
        model, candidate, parts, None
    )


def _step_terms(model: CostModel, parts: Parts, mode: int | None) -> tuple:
    """The floors' per-mode terms of a candidate's layers (with `mode` None, each layer's
    least over the modes), cached on `parts`: the work of one micro-batch, the least forward
    share, the parameters and routed-expert parameters of one TP shard, and the whole
    model's (forward, backward-input, full backward) seconds of one micro-batch."""
    terms = parts.step_terms.get(mode)
    if terms is None:
        modes = range(len(parts.blocks)) if mode is None else (mode,)
        per_kind = [min(total_s(parts.kinds(m)[k]) for m in modes) for k in range(len(parts.kinds(0)))]
        work = sum(n * t for n, t in zip(parts.counts, per_kind)) + total_s(parts.embedding)
        least_share = min(_forward_share(x) for m in modes for x in (*parts.kinds(m), parts.embedding))
        experts = parts.layer_expert_params + (parts.mtp[0].expert_param_count if parts.mtp else 0.0)
        options = [[parts.kinds(m)[k] for m in modes] for k in range(len(parts.kinds(0)))]
        counts = list(parts.counts[: len(options)])
        options += [[parts.embedding], [parts.head]] + ([[parts.mtp[m] for m in modes]] if parts.mtp else [])
        counts += [1] * (len(options) - len(counts))
        trip = tuple(
            sum(n * min(part(x) for x in blocks) for n, blocks in zip(counts, options))
            for part in (
                lambda x: x.forward_s + x.comm_forward_s,
                lambda x: x.backward_input_s + x.comm_backward_s,
                lambda x: x.backward_input_s + x.backward_weight_s + x.comm_backward_s,
            )
        )
        terms = parts.step_terms[mode] = (work, least_share, total_params(model, parts), experts, trip)
    return terms


def _optimizer_floor(model: CostModel, candidate: Candidate, parts: Parts, mode: int | None) -> float:
    """The Adam step over the mean rank's owned parameters."""
    _, _, params, experts, _ = _step_terms(model, parts, mode)
    edp = _expert_dp_shards(candidate) if experts else 1
    owned_like = dp_equivalent_params(candidate.zero_stage, candidate.dp * candidate.cp, edp, params, experts)
    return optimizer_time(
        model, candidate.zero_stage, candidate.dp * candidate.cp, replicas(candidate) * owned_like / candidate.pp
    )


def rank_costs(
    model: CostModel, candidate: Candidate, parts: Parts, inflight: tuple[int, ...], limit_bytes: float
) -> RankCosts:
    """The cut solvers' input: per rank and mode, fixed and per-layer time and bytes (under
    chimera per pair of ranks r and P-1-r, which hold the same two model stages). Layers of
    two kinds (an MoE model's dense-MLP blocks) are listed per kind for contiguous ranks
    (V = 1); with V > 1 (and chimera's pairs) a rank's layers are not contiguous, and every
    layer gets the mean time and the larger bytes of the kinds (the cuts are then near, not
    at, the optimum; `predict` costs each layer as what it is)."""
    pp, vpp = candidate.pp, candidate.vpp
    state = state_bytes(candidate)
    grow = 1 + memory.FRAGMENTATION
    last = head_rank(candidate.schedule, candidate.pp, candidate.vpp)
    modes = range(len(candidate.modes))
    fixed_s, fixed_bytes, kind_bytes = [], [], []
    fixed_states = _fixed_state_per_rank(model, candidate, parts, last, state)
    two = replicas(candidate) == 2
    for rank in range(pp // 2 if two else pp):
        fixed = [p for p, on in ((parts.embedding, rank == 0), (parts.head, rank == last)) if on]
        mtp = bool(parts.mtp) and rank == last
        fixed_state = fixed_states[rank]
        held = (max(inflight[rank], inflight[pp - 1 - rank]) if two else inflight[rank]) / vpp
        fixed_s.append(sum(total_s(p) for p in fixed) + (total_s(parts.mtp[0]) if mtp else 0.0))
        fixed_bytes.append(
            tuple(
                grow
                * (
                    fixed_state
                    + held * (sum(p.activation_bytes for p in fixed) + (parts.mtp[m].activation_bytes if mtp else 0.0))
                    + max(
                        [b.peak_extra_bytes for b in parts.kinds(m)]
                        + [p.peak_extra_bytes for p in fixed]
                        + ([parts.mtp[m].peak_extra_bytes] if mtp else [])
                    )
                )
                + outside_tensor_bytes(model, candidate, rank)
                for m in modes
            )
        )
        kind_bytes.append(
            tuple(
                tuple(
                    grow * (block_state_bytes(candidate, parts.kinds(m)[k]) + held * parts.kinds(m)[k].activation_bytes)
                    for m in modes
                )
                for k in range(len(parts.kinds(0)))
            )
        )
    kind_s = tuple(tuple(total_s(parts.kinds(m)[k]) for m in modes) for k in range(len(parts.kinds(0))))
    counts = parts.counts
    if len(kind_s) == 1 or not counts[0] or not counts[1]:
        main = 0 if counts[0] else 1
        return RankCosts(
            modes=candidate.modes,
            fixed_s=tuple(fixed_s),
            fixed_bytes=tuple(fixed_bytes),
            layer_s=kind_s[main],
            layer_bytes=tuple(per_rank[main] for per_rank in kind_bytes),
            limit_bytes=limit_bytes,
            min_layers=vpp,
        )
    layers = model.spec.num_layers
    mean_s = tuple(sum(n * t[m] for n, t in zip(counts, kind_s)) / layers for m in modes)
    most_bytes = tuple(tuple(max(per_kind[m] for per_kind in per_rank) for m in modes) for per_rank in kind_bytes)
    sequence = vpp == 1 and not SCHEDULES[candidate.schedule].v_shaped
    return RankCosts(
        modes=candidate.modes,
        fixed_s=tuple(fixed_s),
        fixed_bytes=tuple(fixed_bytes),
        layer_s=mean_s,
        layer_bytes=most_bytes,
        limit_bytes=limit_bytes,
        min_layers=vpp,
        layer_kinds=tuple(int(kind == DENSE_BLOCK) for kind in model.block_kinds) if sequence else (),
        kind_s=kind_s if sequence else (),
        kind_bytes=tuple(kind_bytes) if sequence else (),
    )


def layout_of(candidate: Candidate, stage_layers, recompute: tuple[str, ...]) -> Layout:
    """The Layout of a candidate with these cuts and per-rank recompute modes."""
    return Layout(**shared_fields(candidate), recompute=recompute, stage_layers=stage_layers)


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
def held_counts(
    schedule: str, pp: int, num_microbatches: int, vpp: int, segments: int = 1
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """`peak_held_counts` of a schedule shape, cached across candidates."""
    return peak_held_counts(generated_order(schedule, pp, num_microbatches, vpp, segments), vpp)


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
    return _inflight(candidate.schedule, candidate.pp, candidate.num_microbatches, candidate.vpp, candidate.segments)


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
        max(sum(n * b for n, b in zip(v, costs.activation_bytes[r])) for v in held[r]) for r in range(layout.pp)
    )
    need = max(m.total for m in layout_memory(model, layout, costs, exact))
    return need if need > limit else None
