"""Megatron-LM's blocking pipeline exchange: the send/receive calls its 1F1B loops make
between compute actions, as an `ExchangeProgram` the simulator pairs and times.

megatron/core/pipeline_parallel/schedules.py with overlap_p2p_comm=False and
batch_p2p_comm=True (p2p_mode "blocking"):

- plain 1F1B (forward_backward_pipelining_without_interleaving): recv_forward / F /
  send_forward in warm-up, F / send_forward_recv_backward / B / send_backward_recv_forward in
  the steady state, recv_backward / B / send_backward in cool-down: a gap between two forwards
  or two backwards holds a send call then a receive call, one between a forward and a backward
  a combined call.
- interleaved 1F1B (forward_backward_pipelining_with_interleaving): one combined call after
  each warm-up forward (send_forward_recv_forward, the last one
  send_forward_backward_recv_forward_backward), after each steady (F, B) pair
  (send_forward_backward_recv_forward_backward: no call between the pair's F and B) and after
  each cool-down backward (send_backward_recv_backward).

A rank with no steady state (all warm-up: no forward after a backward) sends its last forward,
then receives its first backward's gradient in a call of its own (both functions'
recv_backward). Paired, these calls charge what a hold after each sender misses: a sender's
wait for a late receiver on uneven stages and in warm-up / cool-down, and interleaved 1F1B's
single call per (F, B) pair (in plain 1F1B's steady state on equal stages the two coincide:
each exchange pairs a rank ending a forward with a neighbour ending a backward at the same
moment). Megatron runs the interleaved loop blocking only where M is a multiple of P,
M > P (at M = P every micro-batch is warm-up, an order the generators do not make) and P > 2
(megatron/training/arguments.py refuses interleaving without p2p overlap at P = 2); other
schedules and shapes have no program here and keep a hold after each sender.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.schedule.actions import Action, F
from planner.schedule.generators import interleave_rounds
from planner.schedule.validate import OrderInfo


@dataclass(frozen=True, slots=True)
class MegatronExchange:
    """One of Megatron-LM's blocking call programs (see the module docstring)."""

    name: str
    interleaved: bool

    def _warmup_forwards(self, rank: int, info: OrderInfo) -> int:
        """Forwards rank `rank` runs before its first backward (Megatron-LM's
        num_warmup_microbatches, as the generators order them)."""
        pp, m, vpp = info.num_ranks, info.num_microbatches, info.vpp
        if not self.interleaved:
            return min(pp - 1 - rank, m)
        per_round = interleave_rounds(pp, m)[1]
        return min((vpp - 1) * per_round + 2 * (pp - 1 - rank), vpp * m)

    def call_gaps(self, rank: int, actions: Sequence[Action], info: OrderInfo) -> list[int]:
        """Per gap of the rank's action list, how many calls Megatron-LM makes there (the
        `ExchangeProgram` contract)."""
        kinds = [action.computation_type for action in actions]
        steady = kinds.count(F) > self._warmup_forwards(rank, info)
        gaps = [1] * (len(kinds) + 1)
        for i in range(1, len(kinds)):
            before, after = kinds[i - 1], kinds[i]
            if before != after and steady:
                gaps[i] = 0 if self.interleaved and before == F else 1
            elif before == after and self.interleaved:
                gaps[i] = 1
            else:
                gaps[i] = 2
        return gaps


PLAIN_1F1B = MegatronExchange(name="megatron_1f1b", interleaved=False)
INTERLEAVED_1F1B = MegatronExchange(name="megatron_interleaved", interleaved=True)


def exchange_program(schedule: str, pp: int, num_microbatches: int) -> MegatronExchange | None:
    """The blocking call program Megatron-LM runs `schedule` with at this shape: plain 1F1B's
    for 1f1b, the interleaved one for interleaved_1f1b where Megatron runs it blocking with
    the generators' order (M a multiple of P, M > P, P > 2); None: holds after each sender."""
    if schedule == "1f1b":
        return PLAIN_1F1B
    if schedule == "interleaved_1f1b" and pp > 2 and num_microbatches % pp == 0 and num_microbatches > pp:
        return INTERLEAVED_1F1B
    return None


def megatron_send_mode(schedule: str, vpp: int) -> str:
    """How today's Megatron-LM training script runs a schedule's pipeline sends: "blocking" in
    plain 1F1B (send_forward_recv_backward waits on its requests), "overlapped" in interleaved
    1F1B (--overlap-p2p-communication is on by default there). Source: megatron/training/
    arguments.py, megatron-core pipeline_parallel/schedules.py."""
    return "overlapped" if schedule == "interleaved_1f1b" and vpp > 1 else "blocking"


def reduces_per_chunk(schedule: str, vpp: int) -> bool:
    """Whether Megatron-LM launches a rank's gradient reduction model chunk by chunk: its
    interleaved loop (forward_backward_pipelining_with_interleaving) with V > 1, whose
    `grad_sync_func` runs per chunk; the other loops reduce the rank's gradients once."""
    return schedule == "interleaved_1f1b" and vpp > 1


def has_combined_1f1b_loop(schedule: str, pp: int) -> bool:
    """Whether megatron-core 0.19.2 has a combined-1F1B loop for this schedule: training
    without a pipeline (combined_1f1b_schedule_for_no_pipelining) and interleaved 1F1B
    (combined_1f1b_schedule_for_interleaved_pipelining); plain 1F1B with PP > 1 has none."""
    return pp == 1 or schedule == "interleaved_1f1b"
