"""Seq1F1B's per-segment layer costs: one sequence segment of a micro-batch through a layer.

A micro-batch of s tokens cut into k segments runs each as s/k tokens (Sun et al. 2024,
arXiv 2406.03488, section 3): its GEMMs, norms, TP/CP communication and saved activations
are those of an s/k-token micro-batch (`CostModel.layer_costs` of the segment's shard, so
small segments pay the smaller GEMMs' lower efficiency), its K and V among the activations,
held until its backward, which comes after the later segments' backwards that read them.

Causal attention is not linear in tokens: a segment's queries attend to every earlier key,
so over the k segments the attention work is the whole sequence's, 1/k per segment on
average, where an s/k-token sequence on its own does 1/k^2. The mean segment therefore adds
the difference, attention(s)/k - attention(s/k), to its forward and input-grad backward (and
to the recomputation of a mode that re-runs the attention core).

Segment lengths: cut evenly, later segments would cost more (segment j does (2j+1)/k^2 of the
attention; `seq1f1b.causal_segment_scales`, what `planner simulate --attention-share` draws)
and the pipeline would idle on the imbalance. The paper partitions the sequence
"computation-wise" instead (section 3.3): segments of equal cost, the earlier ones longer.
With a share `a` of a micro-batch's time in causal attention (`attention_share`), the first
x s tokens cost (1 - a) x + a x^2 of it, so boundary j of k equal-cost segments solves
a x^2 + (1 - a) x = j / k (`segment_fractions`). Every segment then costs the mean, and holds
its own share of the micro-batch's activations (`seq1f1b.weighted_inflight`). The GEMMs of
the unequal segments are costed at the mean s/k shape.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from planner.cost.model import DENSE_BLOCK, CostModel, LayerCosts
from planner.cost.shapes import Shard, layer_work
from planner.errors import LayoutError


def segment_shard(shard: Shard, segments: int) -> Shard:
    """The shape of one of `segments` sequence segments of the micro-batch `shard`."""
    if shard.seq % (segments * (2 * shard.cp if shard.cp > 1 else 1)):
        raise LayoutError(f"{segments} sequence segments of seq {shard.seq} do not split over cp {shard.cp}")
    return replace(shard, seq=shard.seq // segments)


@lru_cache(maxsize=8192)
def segment_layer_costs(
    model: CostModel, kind: str, shard: Shard, recompute: str = "none", paired: bool = False, segments: int = 1
) -> LayerCosts:
    """The mean segment's costs of layer `kind` when micro-batch `shard` runs as `segments`
    sequence segments (the whole micro-batch's for one segment): every kind the cost model
    knows, the attention of each block (an MoE model's dense-MLP block, each of the
    multi-token-prediction modules' blocks) causal over the earlier segments."""
    if segments == 1:
        return model.layer_costs(kind, shard, recompute, paired)
    part = segment_shard(shard, segments)
    costs = model.layer_costs(kind, part, recompute, paired)
    blocks = _attention_blocks(model, kind)
    if not blocks:
        return costs
    forward, backward = (blocks * t for t in _causal_attention_extra(model, shard, part, segments))
    reruns_attention = _reruns_attention(model, recompute)
    return replace(
        costs,
        forward_s=costs.forward_s + forward,
        backward_input_s=costs.backward_input_s + backward + (forward if reruns_attention else 0.0),
        recompute_s=costs.recompute_s + (forward if reruns_attention else 0.0),
    )


def attention_share(model: CostModel, shard: Shard, recompute: str, segments: int) -> float:
    """The part of the mean segment's time (forward and backward) in one transformer layer that
    is causal attention over the earlier segments' keys (0 for one segment)."""
    if segments == 1:
        return 0.0
    mean = segment_layer_costs(model, "transformer", shard, recompute, False, segments)
    total = mean.forward_s + mean.comm_forward_s + mean.backward_s + mean.comm_backward_s
    forward, backward = _attention_times(model, shard)
    attention = (forward * (2 if _reruns_attention(model, recompute) else 1) + backward) / segments
    return min(1.0, attention / total) if total > 0 else 0.0


@lru_cache(maxsize=4096)
def segment_fractions(segments: int, attention: float) -> tuple[float, ...]:
    """Each segment's share of the sequence's tokens under the computation-wise partition of
    Sun et al. 2024: equal cost when `attention` of the cost is causal attention, i.e.
    boundaries x_j solving attention x^2 + (1 - attention) x = j / k (even for 0)."""
    if not 0.0 <= attention <= 1.0:
        raise ValueError(f"attention share must be within 0..1, got {attention}")
    linear = 1.0 - attention

    def boundary(j: int) -> float:
        if attention < 1e-12:
            return j / segments
        return (-linear + math.sqrt(linear * linear + 4.0 * attention * j / segments)) / (2.0 * attention)

    edges = [boundary(j) for j in range(segments + 1)]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def _attention_blocks(model: CostModel, kind: str) -> int:
    """Attention cores in one layer of `kind`: one per block (the model's and its dense-MLP
    variant, whose attention is the same), one per multi-token-prediction module, none in the
    embedding and the head."""
    if kind in ("transformer", DENSE_BLOCK):
        return 1
    return model.spec.mtp_depth if kind == "mtp" else 0


def _reruns_attention(model: CostModel, recompute: str) -> bool:
    """Whether the recompute mode re-runs the attention core before the backward."""
    policy = model.options.recompute.selective_policy
    return recompute == "full" or (recompute == "selective" and policy == "core_attention")


def _attention_times(model: CostModel, shard: Shard) -> tuple[float, float]:
    kernels = model.options.kernels
    work = layer_work(model.spec, "transformer", shard, attention=kernels.attention, dropout=kernels.dropout)
    return model.analytic.attention_core_times(work, kernels.attention)


def _causal_attention_extra(model: CostModel, shard: Shard, part: Shard, segments: int) -> tuple[float, float]:
    """Forward and backward seconds the mean segment's attention takes beyond an s/k-token
    sequence's: attention(s)/k - attention(s/k)."""
    whole_fwd, whole_bwd = _attention_times(model, shard)
    part_fwd, part_bwd = _attention_times(model, part)
    return max(0.0, whole_fwd / segments - part_fwd), max(0.0, whole_bwd / segments - part_bwd)
