"""The seam between the cost model and the schedule simulator: per-chunk costs of one layout
in, the simulated pipeline timing out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.schedule import SimResult, StageCosts, compile_schedule, rank_stages, schedule_info, simulate, stage_to_rank

Table = list[list[float]]
"""[pipeline rank][chunk] -> value for one micro-batch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkCosts:
    """What one micro-batch costs on every (rank, chunk) of a layout, plus per-rank totals."""

    forward_s: Table
    """Forward compute plus exposed TP/CP communication."""
    backward_input_s: Table
    """Input-gradient backward, recomputation and exposed TP/CP communication."""
    backward_weight_s: Table
    activation_bytes: Table
    """Saved for backward from the forward until the backward ends."""
    extra_bytes: list[float]
    """Per rank, the largest transient allocation above the saved activations."""
    params: list[float]
    """Per rank, parameters held on one GPU."""
    tp_comm_s: list[float]
    """Per rank, exposed TP/CP communication of one micro-batch (forward + backward)."""
    p2p_s: float
    """Pipeline send of one micro-batch's activation (or gradient) to the next rank."""
    chunk_params: Table = field(default_factory=list)
    """Per (rank, chunk), parameters held on one GPU (their sum over chunks is `params`)."""
    held_p2p_s: tuple[float, ...] = ()
    """Per rank, the seconds of one micro-batch that blocking sends hold it (inside
    forward_s / backward_input_s; empty when sends overlap compute)."""


PipelineTiming = SimResult
"""The simulator's result: finish_s, busy_s, bubble_fraction, peak_activation_bytes per rank."""


def pipeline_timing(costs: ChunkCosts, schedule: str, pp: int, vpp: int, num_microbatches: int, *,
                    timeline: bool = False) -> PipelineTiming:
    """Simulate one step of `schedule` on (pp, vpp, num_microbatches) with these chunk costs
    (with `timeline`, every action's start and end too)."""
    stage_costs = StageCosts(
        forward_s=_frozen(costs.forward_s),
        backward_input_s=_frozen(costs.backward_input_s),
        backward_weight_s=_frozen(costs.backward_weight_s),
        activation_bytes=_frozen(costs.activation_bytes),
        p2p_s=costs.p2p_s,
    )
    return simulate(compile_schedule(schedule, pp, num_microbatches, vpp), stage_costs, timeline=timeline)


def with_blocking_p2p(costs: ChunkCosts, schedule: str, pp: int, vpp: int) -> ChunkCosts:
    """`costs` under blocking pipeline sends: each forward whose next stage, and each
    backward whose previous stage, lives on another rank holds its rank for the transfer
    (`p2p_s` added to that chunk's time), and the consumer starts when it ends (no separate
    transfer lag).

    Megatron's batched exchange (megatron/core/pipeline_parallel/p2p_communication.py
    `_communicate`, `wait_on_reqs` unless `overlap_p2p_comm`) waits for its sends and
    receives before the next chunk; in the steady state one exchange carries the forward's
    activation to the next rank and the backward's gradient to the previous one, both through
    the rank's NIC, so each costs its transfer time. A send also waits for its peer to post
    the receive; that rendezvous is not charged (a lower bound of the blocking cost).
    """
    if pp == 1 or costs.p2p_s == 0.0:
        return costs
    placement = schedule_info(schedule).placement
    last = pp * vpp - 1
    forward = [list(row) for row in costs.forward_s]
    backward = [list(row) for row in costs.backward_input_s]
    held = [0.0] * pp
    for rank in range(pp):
        for chunk, stage in enumerate(rank_stages(rank, pp, vpp, placement)):
            if stage < last and stage_to_rank(stage + 1, pp, vpp, placement) != rank:
                forward[rank][chunk] += costs.p2p_s
                held[rank] += costs.p2p_s
            if stage > 0 and stage_to_rank(stage - 1, pp, vpp, placement) != rank:
                backward[rank][chunk] += costs.p2p_s
                held[rank] += costs.p2p_s
    return replace(costs, forward_s=forward, backward_input_s=backward, p2p_s=0.0, held_p2p_s=tuple(held))


def _frozen(table: Table) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(row) for row in table)
