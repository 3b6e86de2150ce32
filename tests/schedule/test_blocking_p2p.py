"""Blocking pipeline send/recv (`StageCosts.send_hold_*_s`) against an independent rendezvous
simulation of the runtimes' own call sequences.

The references below replay, rank by rank, the calls each runtime makes and treat every
blocking send/recv as a rendezvous: a call ends `hold` seconds after the later of its own post
and its peer's matching post (NCCL's send cannot finish before the receiver posts; torch waits
on it before the next kernel). They know nothing of the simulator's dependency graph.

- Megatron-LM's 1F1B (megatron/schedules.py, p2p_communication.py 2021-2022): warm-up
  recv_forward / F / send_forward, steady F / send_forward_recv_backward / B /
  send_backward_recv_forward, cool-down recv_backward / B / send_backward; each call one
  batch_isend_irecv then torch.cuda.synchronize(), its messages in parallel.
- DeepSpeed's PipelineEngine TrainSchedule (runtime/pipe/schedule.py): 2 (M + P - 1) steps;
  stage s runs micro-batch k's forward at step 2k + s and its backward at step
  2k + 2P - 1 - s; a forward step first receives the activation from s - 1 and sends the
  previous backward's gradient to s - 1, a backward step first sends the previous forward's
  activation to s + 1 and receives the gradient from s + 1, each a separate blocking call.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.runtimes.megatron_exchange import exchange_program
from planner.schedule import StageCosts, compile_schedule, generate, simulate
from planner.schedule.actions import Action, F


def _megatron(name: str, pp: int, m: int, v: int = 1):
    """Schedule `name` compiled with Megatron-LM's blocking calls, where it has them."""
    return compile_schedule(name, pp, m, v, exchanges=exchange_program(name, pp, m))


def _rendezvous(ops: list[list[tuple]], costs: dict[str, list[float]]) -> float:
    """Makespan of per-rank call lists: ("F",) / ("B",) compute, ("C", sends, recvs, hold) a
    blocking call whose messages (channel keys) pair FIFO with the peer's calls."""
    ranks = len(ops)
    send_at, recv_at = {}, {}
    for r in range(ranks):
        sent, got = {}, {}
        for j, op in enumerate(ops[r]):
            if op[0] == "C":
                for ch in op[1]:
                    send_at[(ch, sent.setdefault(ch, 0))] = (r, j)
                    sent[ch] += 1
                for ch in op[2]:
                    recv_at[(ch, got.setdefault(ch, 0))] = (r, j)
                    got[ch] += 1
    assert send_at.keys() == recv_at.keys()
    peers: dict[tuple, set] = {}
    for key, s in send_at.items():
        peers.setdefault(s, set()).add(recv_at[key])
        peers.setdefault(recv_at[key], set()).add(s)
    posted: dict[tuple, float] = {}
    ptr, clock = [0] * ranks, [0.0] * ranks
    moved = True
    while moved:
        moved = False
        for r in range(ranks):
            while ptr[r] < len(ops[r]):
                j, op = ptr[r], ops[r][ptr[r]]
                if op[0] == "C":
                    posted[(r, j)] = clock[r]
                    if any(p not in posted for p in peers[(r, j)]):
                        break
                    clock[r] = max([clock[r]] + [posted[p] for p in peers[(r, j)]]) + op[3]
                else:
                    clock[r] += costs[op[0]][r]
                ptr[r] += 1
                moved = True
    assert ptr == [len(o) for o in ops], "the call sequences deadlock"
    return max(clock)


def _megatron_1f1b(pp: int, m: int, hold: float) -> list[list[tuple]]:
    ops = []
    for r in range(pp):
        warm, calls = min(pp - r - 1, m), []
        first, last = r == 0, r == pp - 1
        for _ in range(warm):
            if not first:
                calls.append(("C", [], [("act", r - 1)], hold))
            calls.append(("F",))
            if not last:
                calls.append(("C", [("act", r)], [], hold))
        if m > warm and not first:
            calls.append(("C", [], [("act", r - 1)], hold))
        for i in range(m - warm):
            calls.append(("F",))
            if not last:
                calls.append(("C", [("act", r)], [("grad", r + 1)], hold))
            calls.append(("B",))
            if not first:
                more = i < m - warm - 1
                calls.append(("C", [("grad", r)], [("act", r - 1)] if more else [], hold))
        for _ in range(warm):
            if not last:
                calls.append(("C", [], [("grad", r + 1)], hold))
            calls.append(("B",))
            if not first:
                calls.append(("C", [("grad", r)], [], hold))
        ops.append(calls)
    return ops


def _deepspeed_train_schedule(pp: int, m: int, act: float, grad: float) -> list[list[tuple]]:
    ops = []
    for s in range(pp):
        calls, prev = [], None
        for step in range(2 * (m + pp - 1)):
            forward = (step - s) % 2 == 0
            mb = (step - s) // 2 if forward else (step - 2 * pp + 1 + s) // 2
            valid, prev_valid = 0 <= mb < m, prev is not None and 0 <= prev < m
            if forward:
                if valid and s > 0:
                    calls.append(("C", [], [("act", s - 1)], act))
                if prev_valid and s > 0:
                    calls.append(("C", [("grad", s)], [], grad))
            else:
                if prev_valid and s < pp - 1:
                    calls.append(("C", [("act", s)], [], act))
                if valid and s < pp - 1:
                    calls.append(("C", [], [("grad", s + 1)], grad))
            if valid:
                calls.append(("F",) if forward else ("B",))
            prev = mb
        ops.append(calls)
    return ops


def _costs(fs: list[float], bs: list[float], hold_f: float, hold_b: float) -> StageCosts:
    return StageCosts(
        forward_s=tuple((f,) for f in fs),
        backward_input_s=tuple((b / 2,) for b in bs),
        backward_weight_s=tuple((b / 2,) for b in bs),
        send_hold_forward_s=hold_f,
        send_hold_backward_s=hold_b,
    )


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 4), (4, 8), (6, 6), (8, 32), (12, 40)])
@pytest.mark.parametrize(("f", "b", "hold"), [(1.0, 2.0, 0.1), (1.0, 3.0, 0.3), (0.04, 0.116, 0.0085)])
def test_megatron_1f1b_holds_match_the_rendezvous_of_its_calls(pp, m, f, b, hold):
    """Uniform stages: the simulator's holds give the exact makespan of Megatron-LM's blocking
    call sequence (in 1F1B every exchange pairs a rank ending a forward with a neighbour ending
    a backward at the same moment, so no rank waits beyond the transfer)."""
    reference = _rendezvous(_megatron_1f1b(pp, m, hold), {"F": [f] * pp, "B": [b] * pp})
    simulated = simulate(generate("1f1b", pp, m), _costs([f] * pp, [b] * pp, hold, hold)).step_time_s
    assert simulated == pytest.approx(reference, rel=1e-12)


@pytest.mark.parametrize(
    ("fs", "bs"),
    [
        ([1.0, 1.0, 1.0, 1.3], [2.0, 2.0, 2.0, 2.5]),
        ([1.2, 1.0, 1.0, 1.0], [2.2, 2.0, 2.0, 2.0]),
        ([1.0, 1.5, 1.0, 1.0, 1.0], [2.0, 3.0, 2.0, 2.0, 2.0]),
    ],
)
def test_uneven_stages_lose_at_most_the_unmodelled_rendezvous_wait(fs, bs):
    """Uneven stages: a sender may also wait for a late receiver, which the holds leave out:
    the simulator is never longer than the rendezvous and within 1% of it here."""
    pp, m, hold = len(fs), 2 * len(fs), 0.1
    reference = _rendezvous(_megatron_1f1b(pp, m, hold), {"F": fs, "B": bs})
    simulated = simulate(generate("1f1b", pp, m), _costs(fs, bs, hold, hold)).step_time_s
    assert simulated <= reference + 1e-12
    assert simulated == pytest.approx(reference, rel=0.01)


@pytest.mark.parametrize("pp", [2, 4, 5, 8])
@pytest.mark.parametrize(("act", "grad"), [(0.05, 0.2), (0.01, 0.08)])
def test_deepspeed_train_schedule_is_1f1b_with_send_and_receive_holds(pp, act, grad):
    """DeepSpeed's TrainSchedule runs 1F1B's compute order; in its steady state each forward
    and backward that sends is followed by two separate blocking calls, the activation and the
    gradient transfer (`p2p_mode = "deepspeed"` holds act + grad): the simulator's cost per
    extra micro-batch is the reference's exactly. In the warm-up and cool-down a step sends
    without receiving, which the holds charge anyway: never shorter, at most P - 1 holds longer."""
    f, b, hold = 1.0, 2.0, act + grad

    def both(m):
        reference = _rendezvous(_deepspeed_train_schedule(pp, m, act, grad), {"F": [f] * pp, "B": [b] * pp})
        return reference, simulate(generate("1f1b", pp, m), _costs([f] * pp, [b] * pp, hold, hold)).step_time_s

    (ref_a, sim_a), (ref_b, sim_b) = both(2 * pp), both(4 * pp)
    assert (sim_b - sim_a) == pytest.approx(ref_b - ref_a, rel=1e-12)
    sending_sides = 2 if pp > 2 else 1  # an inner rank sends both ways, an end rank one
    assert (ref_b - ref_a) / (2 * pp) == pytest.approx(f + b + sending_sides * hold, rel=1e-12)
    for ref, sim in ((ref_a, sim_a), (ref_b, sim_b)):
        assert ref - 1e-12 <= sim <= ref + (pp - 1) * hold + 1e-12


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (6, 9)])
def test_blocked_time_is_the_holds_of_each_ranks_sending_actions(pp, m):
    """Rank 0 sends after each forward, the last rank after each backward, the others after
    both: M, M and 2M holds; busy time stays the compute, and no holds change nothing."""
    base = StageCosts.uniform(pp, 1, 1.0, 1.0, 1.0)
    held = simulate(generate("1f1b", pp, m), replace(base, send_hold_forward_s=0.3, send_hold_backward_s=0.2))
    plain = simulate(generate("1f1b", pp, m), base)
    assert held.blocked_s[0] == pytest.approx(m * 0.3)
    assert held.blocked_s[-1] == pytest.approx(m * 0.2)
    assert all(x == pytest.approx(m * 0.5) for x in held.blocked_s[1:-1])
    assert held.busy_s == plain.busy_s
    assert plain.blocked_s == ()
    assert held.step_time_s > plain.step_time_s


# The rendezvous itself (planner/runtimes/megatron_exchange.py has Megatron-LM's blocking
# exchange calls for 1f1b and interleaved_1f1b): the simulator pairs each call with its peers'
# matching calls.


def _megatron_interleaved(pp: int, m: int, v: int, hold: float) -> list[list[tuple]]:
    """Megatron-LM's forward_backward_pipelining_with_interleaving with overlap_p2p_comm=False
    (megatron/core/pipeline_parallel/schedules.py): its warm-up count, its recv_prev /
    recv_next flags (the first and last rank's "ahead by P - 1" rule) and one call per
    warm-up forward, steady (F, B) pair and cool-down backward; M a multiple of P, M > P."""
    total = m * v

    def fwd_chunk(k):
        return (k // pp) % v

    def bwd_chunk(k):
        return v - 1 - fwd_chunk(k)

    ops = []
    for r in range(pp):
        first, last = r == 0, r == pp - 1
        warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
        calls = []

        def sends_f(k, last=last, r=r):
            return [] if last and fwd_chunk(k) == v - 1 else [("act", r)]

        def sends_b(k, first=first, r=r):
            return [] if first and bwd_chunk(k) == 0 else [("grad", r)]

        prev_ch, next_ch = ("act", (r - 1) % pp), ("grad", (r + 1) % pp)
        if not first:
            calls.append(("C", [], [prev_ch], hold))
        for k in range(warm):
            calls.append(("F",))
            recv_prev = not (first and fwd_chunk(k + 1) == 0) and k != total - 1
            recvs = [prev_ch] if recv_prev else []
            if k == warm - 1 and warm < total and not last:
                recvs.append(next_ch)
            calls.append(("C", sends_f(k), recvs, hold))
        remaining = total - warm
        for k in range(remaining):
            fk = k + warm
            calls += [("F",), ("B",)]
            recv_prev = fwd_chunk(fk - (pp - 1)) != v - 1 if first else True
            if k == remaining - 1:
                recv_prev = False
            recv_next = bwd_chunk(k - (pp - 1)) != 0 if last else True
            recvs = ([prev_ch] if recv_prev else []) + ([next_ch] if recv_next else [])
            calls.append(("C", sends_f(fk) + sends_b(k), recvs, hold))
        for k in range(remaining, total):
            calls.append(("B",))
            recv_next = not (last and bwd_chunk(k + 1) == v - 1) and k != total - 1
            calls.append(("C", sends_b(k), [next_ch] if recv_next else [], hold))
        ops.append([c for c in calls if c[0] != "C" or c[1] or c[2]])
    return ops


def _chunked(fs: list[float], bs: list[float], v: int, hold: float) -> StageCosts:
    return StageCosts(
        forward_s=tuple((f,) * v for f in fs),
        backward_input_s=tuple((b / 2,) * v for b in bs),
        backward_weight_s=tuple((b / 2,) * v for b in bs),
        send_hold_forward_s=hold,
        send_hold_backward_s=hold,
    )


UNEVEN = [
    ([1.0, 1.0, 1.0, 1.3], [2.0, 2.0, 2.0, 2.5]),
    ([1.2, 1.0, 1.0, 1.0], [2.2, 2.0, 2.0, 2.0]),
    ([1.0, 1.5, 1.0, 1.0, 1.0], [2.0, 3.0, 2.0, 2.0, 2.0]),
    ([1.0, 0.4, 1.7], [1.1, 3.0, 2.0]),
]


@pytest.mark.parametrize(("fs", "bs"), UNEVEN)
@pytest.mark.parametrize("mult", [1, 2, 3])
def test_megatron_1f1b_rendezvous_matches_its_calls_on_uneven_stages(fs, bs, mult):
    """Uneven stages: with the calls paired, the simulated makespan is the reference's exactly
    (where the holds alone were short by the senders' waits for late receivers)."""
    pp, hold = len(fs), 0.1
    m = mult * pp + 1
    reference = _rendezvous(_megatron_1f1b(pp, m, hold), {"F": fs, "B": bs})
    simulated = simulate(_megatron("1f1b", pp, m), _costs(fs, bs, hold, hold))
    assert simulated.step_time_s == pytest.approx(reference, rel=1e-12)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 4), (4, 8), (6, 6), (8, 32)])
@pytest.mark.parametrize(("f", "b", "hold"), [(1.0, 2.0, 0.1), (0.04, 0.116, 0.0085)])
def test_megatron_1f1b_rendezvous_equals_the_holds_on_equal_stages(pp, m, f, b, hold):
    """The docstring's argument: equal stages in plain 1F1B pair a rank ending a forward with a
    neighbour ending a backward, so the paired calls give today's hold-only makespan."""
    costs = _costs([f] * pp, [b] * pp, hold, hold)
    paired = simulate(_megatron("1f1b", pp, m), costs).step_time_s
    held = simulate(generate("1f1b", pp, m), costs).step_time_s
    assert paired == pytest.approx(held, rel=1e-12)


@pytest.mark.parametrize(("pp", "m", "v"), [(3, 6, 2), (4, 8, 2), (4, 12, 3), (5, 10, 2)])
@pytest.mark.parametrize("stages", ["equal", "uneven"])
def test_megatron_interleaved_rendezvous_matches_its_calls(pp, m, v, stages):
    """Interleaved 1F1B: the simulator's paired calls give the makespan of Megatron-LM's own
    call sequence, written from its loop (flags and all), equal or uneven ranks."""
    hold = 0.07
    fs = [1.0] * pp if stages == "equal" else [1.0 + 0.37 * ((3 * r) % pp) / pp for r in range(pp)]
    bs = [2.0 * f + (0.3 if r == 1 else 0.0) for r, f in enumerate(fs)]
    reference = _rendezvous(_megatron_interleaved(pp, m, v, hold), {"F": fs, "B": bs})
    simulated = simulate(_megatron("interleaved_1f1b", pp, m, v), _chunked(fs, bs, v, hold))
    assert simulated.step_time_s == pytest.approx(reference, rel=1e-12)


def test_a_slow_receiver_holds_its_sender_hand_enumerated():
    """P = 3, M = 3, F 1, B 2 (I 1 + W 1), hold 0.5, rank 1 twice as slow. Rank 0 warms up
    with F0, send F0, F1, send F1. Rank 1: recv F0 (ends 0 + ... 1 + 0.5 = 1.5), F0 [1.5, 3.5],
    send F0 to rank 2 (posted at 0: ends 4.0), then posts recv F1 at 4.0. So rank 0's send F1,
    posted at 2.5, ends at 4.0 + 0.5 = 4.5, and its F2 starts there: the holds alone start it
    at 2.5 + 0.5 = 3.0."""
    costs = replace(
        StageCosts.uniform(3, 1, 1.0, 1.0, 1.0),
        send_hold_forward_s=0.5,
        send_hold_backward_s=0.5,
        slowdown=(1.0, 2.0, 1.0),
    )

    def start(result, rank, mb):
        return next(e.start_s for e in result.timeline if e.rank == rank and e.action == Action(0, F, mb))

    paired = simulate(_megatron("1f1b", 3, 3), costs, timeline=True)
    held = simulate(generate("1f1b", 3, 3), costs, timeline=True)
    assert [start(paired, 0, mb) for mb in range(3)] == pytest.approx([0.0, 1.5, 4.5], abs=1e-12)
    assert start(held, 0, 2) == pytest.approx(3.0, abs=1e-12)
    assert paired.step_time_s >= held.step_time_s


@pytest.mark.parametrize(("name", "pp", "m", "v"), [("1f1b", 4, 8, 1), ("interleaved_1f1b", 4, 8, 2)])
def test_paired_calls_keep_busy_time_and_count_one_transfer_per_call(name, pp, m, v):
    """Busy time stays the compute; blocked time is one hold per call after the rank's first
    action. Plain 1F1B with w warm-up forwards: rank 0 makes w sends, M - w
    send_forward_recv_backward and w recv_backward calls (M + w); an inner rank a receive and a
    send around each warm-up forward and cool-down backward plus recv_forward and two calls per
    steady pair (2M + 2w, its first receive before its first action not counted); the last
    rank one send_backward_recv_forward per micro-batch (M). Interleaved 1F1B: one call per
    warm-up forward, steady (F, B) pair and cool-down backward (V M + w) that carries a message."""
    base = StageCosts.uniform(pp, v, 1.0, 1.0, 1.0)
    held = simulate(_megatron(name, pp, m, v), replace(base, send_hold_forward_s=0.1, send_hold_backward_s=0.1))
    plain = simulate(_megatron(name, pp, m, v), base)
    assert held.busy_s == plain.busy_s
    if name == "1f1b":
        warm = [pp - 1 - r for r in range(pp)]
        calls = [m + warm[0]] + [2 * m + 2 * w for w in warm[1:-1]] + [m]
    else:
        calls = [v * m + (v - 1) * pp + 2 * (pp - 1 - r) for r in range(pp)]
        calls[0] -= 1  # rank 0's last backward (stage 0) sends nothing and receives nothing
    assert held.blocked_s == pytest.approx([0.1 * c for c in calls], rel=1e-12)
    assert held.step_time_s > plain.step_time_s


@settings(max_examples=60, deadline=None)
@given(
    pp=st.integers(2, 6),
    rounds=st.integers(2, 4),
    v=st.integers(1, 3),
    fs=st.lists(st.floats(0.1, 3.0), min_size=6, max_size=6),
    bs=st.lists(st.floats(0.1, 6.0), min_size=6, max_size=6),
    hold=st.floats(0.0, 1.0),
)
def test_paired_calls_only_add_time(pp, rounds, v, fs, bs, hold):
    """Waits and transfers only add time: any costs, the paired step is at least the step
    without holds (so the search's compute-only lower bounds stay lower bounds), and a
    receiver never starts before its producer's end plus one transfer."""
    name, m = ("1f1b", rounds * pp) if v == 1 else ("interleaved_1f1b", rounds * pp)
    costs = _chunked(fs[:pp], bs[:pp], v, hold)
    paired = simulate(_megatron(name, pp, m, v), costs, timeline=True)
    free = simulate(_megatron(name, pp, m, v), replace(costs, send_hold_forward_s=0.0, send_hold_backward_s=0.0))
    assert paired.step_time_s >= free.step_time_s - 1e-9
    ends = {e.action: e for e in paired.timeline}
    for e in paired.timeline:
        stage, kind, mb = e.action
        producer = Action(stage - 1, F, mb) if kind == F else Action(stage + 1, kind, mb)
        if producer in ends and ends[producer].rank != e.rank:
            source = ends[producer]  # its end_s includes its trailing calls: use its compute
            compute = (fs if kind == F else bs)[source.rank]
            assert e.start_s >= source.start_s + compute + hold - 1e-9


def test_unpaired_compile_keeps_holds_after_each_sender():
    """Without an exchange program (DeepSpeed's engine, another call program, or overlapped
    sends) a compiled 1f1b keeps the holds after each sender, as the raw order does."""
    costs = _costs([1.0, 1.5, 1.0, 1.0], [2.0, 3.0, 2.0, 2.0], 0.2, 0.2)
    assert compile_schedule("1f1b", 4, 8).exchanges is None
    assert simulate(compile_schedule("1f1b", 4, 8), costs) == simulate(generate("1f1b", 4, 8), costs)
    assert _megatron("1f1b", 4, 8).exchanges is not None
