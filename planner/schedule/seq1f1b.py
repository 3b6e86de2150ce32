"""Seq1F1B (Sun et al. 2024, arXiv 2406.03488): 1F1B over sequence segments.

Each micro-batch's sequence is cut into k segments and the pipelined unit is one
(micro-batch m, segment j), written as micro-batch index u = m*k + j in the actions. Forwards
run units in order (segment j of a micro-batch after segment j-1 on the same rank: causal
attention reads the keys and values of the earlier segments); backwards run the segments of
a micro-batch in reverse (segment j's K/V gradients come from the later segments' backward).
Rank r warms up with (P-1-r) + (k-1) forwards, so the last rank has all k segments of a
micro-batch before its first backward; then one forward, one backward, then the drain. With
k = 1 this is 1F1B. With equal segment costs it is 1F1B on kM units: bubble (P-1)/(kM+P-1).

Memory: a unit holds 1/k of a micro-batch's activations (its own tokens, including its K/V,
which the later segments of the micro-batch read), so rank r's (P-1-r) + k units in flight
are ((P-r) + (k-1))/k micro-batches' worth against 1F1B's P-r.

Cost. With causal attention, segment j's queries attend to (j+1)s/k keys, j of its k x k
blocks full and one half-masked diagonal block: (j + 1/2)/k^2 of the full s^2 score and
value products, i.e. attention FLOPs of segment j = (2j+1)/k^2 of the whole sequence's
(sum over j: k^2/k^2 = 1). The rest of a layer (GEMMs, norms) is linear in tokens: 1/k each,
costed at seq/k tokens (a smaller GEMM, less efficient). `causal_segment_scales` gives the
per-segment factors on a segment's mean cost.
"""

from __future__ import annotations

from planner.errors import ScheduleError
from planner.schedule.actions import Action, B, F, PipelineOrder


def seq1f1b(pp: int, num_microbatches: int, segments: int) -> PipelineOrder:
    """Seq1F1B's order for P ranks, M micro-batches of k = `segments` segments (kM units)."""
    k, units = segments, num_microbatches * segments
    backward_units = [m * k + j for m in range(num_microbatches) for j in reversed(range(k))]
    order: PipelineOrder = {}
    for r in range(pp):
        warmup = min(units, (pp - 1 - r) + (k - 1))
        out = [Action(r, F, u) for u in range(warmup)]
        for step, u in enumerate(backward_units):
            if warmup + step < units:
                out.append(Action(r, F, warmup + step))
            out.append(Action(r, B, u))
        order[r] = out
    return order


def weighted_inflight(pp: int, num_microbatches: int, fractions: tuple[float, ...]) -> tuple[float, ...]:
    """Most activations each rank holds at once, in mean segments, when segment j of every
    micro-batch holds `fractions[j]` of its activations (k = len(fractions); fractions sum to
    1): the held units' k x fractions summed, at its peak over the rank's order (a unit is
    held from its F to its B). Equal fractions give the unit count min(kM, P - r + k - 1)."""
    k = len(fractions)
    order = seq1f1b(pp, num_microbatches, k)
    peaks = []
    for r in range(pp):
        held = peak = 0.0
        for _, kind, unit in order[r]:
            weight = k * fractions[unit % k]
            held += weight if kind == F else -weight
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


def causal_segment_scales(segments: int, attention_share: float) -> tuple[float, ...]:
    """Factor on the mean segment cost of each segment j = 0..k-1 when `attention_share` of
    the cost is the causal s^2 attention term: 1 + a((2j+1)/k - 1); the factors average 1."""
    if not 0.0 <= attention_share <= 1.0:
        raise ScheduleError(f"attention share must be within 0..1, got {attention_share}")
    k = segments
    return tuple(1.0 + attention_share * ((2 * j + 1) / k - 1.0) for j in range(k))
