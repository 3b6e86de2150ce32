"""Peak device memory per pipeline rank: training state, saved activations, buffers."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import memory
from planner.cost.model import DENSE_BLOCK, CostModel
from planner.cost.segments import attention_share, segment_fractions
from planner.layout import Layout
from planner.pipeline import ChunkCosts, PipelineTiming
from planner.predict.shards import (
    dp_shards,
    fsdp_root_params,
    kind_counts,
    layers_on,
    layout_shard,
)
from planner.schedule import head_rank
from planner.schedule.seq1f1b import weighted_inflight


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMemory:
    """Bytes on one pipeline rank at its peak."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float
    """Beyond the tensors: the caching allocator's overhead and what lies outside it."""
    outside_allocator: float = 0.0
    """The part of `other` the caching allocator does not hold (CUDA context, NCCL buffers)."""

    @property
    def allocated(self) -> float:
        """The tensors' bytes (torch.cuda.max_memory_allocated)."""
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def reserved(self) -> float:
        """The caching allocator's segments (torch.cuda.max_memory_reserved)."""
        return self.total - self.outside_allocator

    @property
    def total(self) -> float:
        """Device memory in use (nvidia-smi): what must fit in the GPU."""
        return self.allocated + self.other


def peak_activation_bytes(
    model: CostModel, layout: Layout, seq: int, costs: ChunkCosts, timing: PipelineTiming
) -> tuple[float, ...]:
    """Per pipeline rank, the most activation bytes it holds at once: the simulator's, but
    under seq1f1b with its segments' unequal lengths (the computation-wise partition,
    planner/cost/segments.py) weighing the held segments."""
    if layout.segments == 1:
        return timing.peak_activation_bytes
    share = attention_share(model, layout_shard(layout, seq), layout.recompute[0], layout.segments)
    held = weighted_inflight(layout.pp, layout.num_microbatches, segment_fractions(layout.segments, share))
    return tuple(held[r] * sum(costs.activation_bytes[r]) for r in range(layout.pp))


def layout_memory(
    model: CostModel, layout: Layout, costs: ChunkCosts, peak_activation_bytes: tuple[float, ...]
) -> tuple[RankMemory, ...]:
    """Memory of every pipeline rank, given the peak bytes of activations each holds."""
    experts = costs.expert_params or [0.0] * layout.pp
    state = memory.state_bytes_per_param(layout.zero_stage, dp_shards(layout))
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp)
    expert = memory.state_bytes_per_param(layout.zero_stage, edp)  # routed experts shard over EDP
    return tuple(
        _rank_memory(model, layout, costs, peak_activation_bytes[r], r, experts[r], state, expert)
        for r in range(layout.pp)
    )


def _rank_memory(
    model: CostModel,
    layout: Layout,
    costs: ChunkCosts,
    peak_activations: float,
    rank: int,
    expert_params: float,
    state: memory.StateBytes,
    expert: memory.StateBytes,
) -> RankMemory:
    """Memory of pipeline rank `rank`: `state` bytes per dense parameter, `expert` per routed
    expert parameter (`memory.state_bytes_per_param` over DP x CP and over EDP)."""
    params = costs.params[rank]
    activations = peak_activations + costs.extra_bytes[rank]
    if model.options.memory.parameter_copies > 1:  # the schedule's further copies of the rank's layers
        layer_params, layer_experts = _layer_params(model, layout, rank)
        params += (model.options.memory.parameter_copies - 1) * layer_params
        expert_params += (model.options.memory.parameter_copies - 1) * layer_experts
    dense = params - expert_params
    weights = dense * state.weights + expert_params * expert.weights
    if layout.zero_stage == 3:  # unsharded bf16 copies of the block being computed, the one
        root = fsdp_root_params(model, layout, rank)  # prefetched, and the root unit
        block = (costs.params[rank] - root) / max(1, layers_on(layout, rank))
        weights += model.dtype_bytes * (2 * block + root)
    grads = dense * state.grads + expert_params * expert.grads
    fp32_accumulator = model.options.data.bf16_optimizer or model.options.data.wgrad_accumulation == "fp32_buffer"
    if fp32_accumulator and layout.zero_stage <= 1:  # bf16 .grad beside the fp32 buffer
        grads += params * model.dtype_bytes
    optimizer = dense * state.optimizer + expert_params * expert.optimizer
    tensors = weights + grads + optimizer + activations
    outside = memory.outside_allocator_bytes(
        layout.tp,
        layout.cp,
        layout.dp,
        layout.pp,
        _in_embedding_group(model, layout, rank),
        model.options.memory.cuda_context_bytes,
    )
    segments = costs.cached_segment_bytes[rank] if costs.cached_segment_bytes else 0.0
    return RankMemory(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        other=memory.other_bytes(tensors, outside) + segments,
        outside_allocator=outside,
    )


def _layer_params(model: CostModel, layout: Layout, rank: int) -> tuple[float, float]:
    """Parameters of the transformer layers on pipeline rank `rank` (one shard), and the routed
    experts' among them: what `CostOptions.memory.parameter_copies` repeats (the embedding, head and
    multi-token-prediction modules are not: DualPipe holds them once on each end rank)."""
    spec, etp = model.spec, layout.expert_tp
    per_kind = {
        "transformer": (
            memory.transformer_param_count(spec, layout.tp, layout.ep, etp),
            memory.routed_expert_param_count(spec, layout.ep, etp) if spec.is_moe else 0.0,
        ),
        DENSE_BLOCK: (memory.transformer_param_count(spec, layout.tp, moe=False), 0.0),
    }
    params = experts = 0.0
    for start, end in layout.stage_layers[rank]:
        for kind, n in kind_counts(model, start, end):
            params += n * per_kind[kind][0]
            experts += n * per_kind[kind][1]
    return params, experts


def _in_embedding_group(model: CostModel, layout: Layout, rank: int) -> bool:
    """Whether `rank` all-reduces the tied word embedding's grads with another pipeline rank."""
    last = head_rank(layout.schedule, layout.pp, layout.vpp)
    return model.spec.tie_embeddings and last != 0 and rank in (0, last)
