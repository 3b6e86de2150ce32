"""What one rank of a layout holds: its shard shape, layer counts, replicas and data-parallel shards."""

from __future__ import annotations

from typing import Any

from planner.cost import memory
from planner.cost.model import DENSE_BLOCK, CostModel, LayerCosts
from planner.cost.shapes import Shard
from planner.layout import Layout
from planner.schedule import head_rank, schedule_info


def layout_shard(layout: Layout | Any, seq: int) -> Shard:
    """The micro-batch shape one GPU of the layout (or of a search candidate, which holds the
    same degrees: layout.SHARED_FIELDS) sees."""
    return Shard(
        mbs=layout.mbs,
        seq=seq,
        tp=layout.tp,
        cp=layout.cp,
        sequence_parallel=layout.sequence_parallel,
        ep=layout.ep,
        etp=layout.etp,
    )


def kind_counts(model: CostModel, start: int, end: int) -> tuple[tuple[str, int], ...]:
    """The block kinds of layers [start, end) and how many of each (none with no layer)."""
    dense = model.dense_layers_before[end] - model.dense_layers_before[start]
    counts = (("transformer", end - start - dense), (DENSE_BLOCK, dense))
    return tuple((kind, n) for kind, n in counts if n)


def two_replicas(layout: Layout) -> bool:
    """Whether the pipeline ranks hold two copies of the model (chimera's two directions)."""
    return schedule_info(layout.schedule).bidirectional and layout.pp > 1


def replica_ends(layout: Layout, embedding: LayerCosts, head: LayerCosts) -> tuple[tuple[LayerCosts, int, int], ...]:
    """(costs, rank, chunk) of the embedding and head of Chimera's up pipeline (its stage P,
    the model's first, and the down pipeline's last, both on rank P-1); none otherwise."""
    if not two_replicas(layout):
        return ()
    return ((embedding, layout.pp - 1, 1), (head, layout.pp - 1, 0))


def dp_shards(layout: Layout) -> int:
    return layout.dp * layout.cp


def layers_on(layout: Layout, rank: int) -> int:
    return sum(end - start for start, end in layout.stage_layers[rank])


def dp_equivalent_params(zero_stage: int, dp_shards: int, edp: int, params: float, expert_params: float) -> float:
    """`params` with the routed experts among them (`expert_params`) weighted so that a ZeRO
    shard over `dp_shards` (DP x CP) of the result is what the GPU owns: the dense
    parameters' share of DP x CP and the experts' share of their `edp` expert data-parallel
    ranks (Megatron's MoE parallel folding)."""
    if not expert_params or zero_stage == 0:
        return params
    return params + expert_params * (dp_shards / edp - 1)


def fsdp_root_params(model: CostModel, layout: Layout, rank: int) -> float:
    """Parameters of `rank` that FSDP keeps unsharded from the first forward to the end of the
    backward, the step's memory peak included: those outside the wrapped transformer blocks (the
    embedding, the final norm and the head), which the root module's own unit holds. FSDP1 does
    not free the root's parameters after its forward ("Do not free the root's parameters in the
    post-forward for `FULL_SHARD` with the intention that they are immediately used for backward
    computation": _runtime_utils._post_forward_reshard), FSDP2 likewise ("For the root, do not
    reshard after forward since for training, the parameters would be freed and all-gathered
    immediately": FSDPState._lazy_init); both reshard it only after the backward."""
    spec, last = model.spec, head_rank(layout.schedule, layout.pp, layout.vpp)
    params = memory.embedding_param_count(spec, layout.tp) if rank == 0 else 0.0
    if rank == last:
        params += memory.head_param_count(spec, layout.tp, shares_rank_with_embedding=last == 0)
    return params
