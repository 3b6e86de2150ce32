"""The seam between the cost model and the schedule simulator: per-chunk costs of one layout
in, the simulated pipeline timing out."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.schedule import ExchangeProgram, SimResult, StageCosts, compile_schedule, simulate

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
    send_hold_forward_s: float = 0.0
    """Blocking send/recv: seconds a rank's stream is held after a forward that sends
    (`StageCosts.send_hold_forward_s`); 0 when sends overlap compute."""
    send_hold_backward_s: float = 0.0
    """The same after a backward that sends its input gradient."""
    exchanges: ExchangeProgram | None = None
    """The runtime's blocking exchange calls the holds belong to: the simulator pairs them
    (`compile_schedule`); None: a hold after each sender."""
    expert_params: list[float] | None = None
    """Per rank, the part of `params` that are routed experts (their grads and optimizer
    state shard over the expert data-parallel group); None: no experts."""
    segments: int = 1
    """Units per micro-batch (seq1f1b's sequence segments, of equal cost): with k > 1 every
    time and byte above is one segment's mean, and a micro-batch is k units."""
    cached_segment_bytes: list[float] | None = None
    """Per rank, caching-allocator segments reserved for transients requested outside the
    activation peak that no cached block can hold (DeepSpeed's BF16_Optimizer:
    planner/cost/memory.py `bf16_optimizer_transients`); None: none."""


PipelineTiming = SimResult
"""The simulator's result: finish_s, busy_s, bubble_fraction, peak_activation_bytes per rank."""


def pipeline_timing(
    costs: ChunkCosts, schedule: str, pp: int, vpp: int, num_microbatches: int, *, timeline: bool = False
) -> PipelineTiming:
    """Simulate one step of `schedule` on (pp, vpp, num_microbatches) with these chunk costs
    (with `timeline`, every action's start and end too)."""
    holds = bool(costs.send_hold_forward_s or costs.send_hold_backward_s)
    order = compile_schedule(schedule, pp, num_microbatches, vpp, costs.segments, costs.exchanges if holds else None)
    return simulate(order, stage_costs(costs), timeline=timeline)


def stage_costs(costs: ChunkCosts) -> StageCosts:
    """The simulator's view of a layout's chunk costs (times, p2p, send holds, activations)."""
    return StageCosts(
        forward_s=_frozen(costs.forward_s),
        backward_input_s=_frozen(costs.backward_input_s),
        backward_weight_s=_frozen(costs.backward_weight_s),
        activation_bytes=_frozen(costs.activation_bytes),
        p2p_s=costs.p2p_s,
        send_hold_forward_s=costs.send_hold_forward_s,
        send_hold_backward_s=costs.send_hold_backward_s,
    )


def _frozen(table: Table) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(row) for row in table)
