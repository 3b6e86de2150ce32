"""Simulator figures against the papers' formulas and an independent DAG evaluation."""

from __future__ import annotations

import pytest

from planner.errors import ScheduleError
from planner.schedule import (
    Action,
    StageCosts,
    compile_order,
    compile_schedule,
    generate,
    simulate,
    zb_h1_idle_time,
)

from .conftest import reference_times


def _uniform(pp, vpp, f, i, w, p2p=0.0):
    return StageCosts.uniform(pp, vpp, f, i, w, p2p)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 4), (4, 8), (4, 13), (8, 8), (8, 32)])
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (1.0, 1.0), (0.3, 0.7)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, pp, m, f, b):
    """Uniform F and B (= I + W), zero communication: GPipe (Huang et al. 2019) and 1F1B
    (DAPPLE) idle (P-1)(F+B) per rank, bubble (P-1)/(M+P-1)."""
    result = simulate(generate(name, pp, m), _uniform(pp, 1, f, b / 2, b / 2))
    assert result.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), abs=1e-12)
    assert result.step_time_s == pytest.approx((m + pp - 1) * (f + b))


@pytest.mark.parametrize(
    ("pp", "m", "vpp"), [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2), (4, 12, 3), (4, 10, 2), (8, 12, 2)]
)
def test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(pp, m, vpp):
    """Megatron interleaving (Narayanan et al. 2021): with each chunk costing 1/V of the
    rank's F and B, the bubble is (P-1)/(V*M+P-1) when M is a multiple of P; torch's rounds
    keep it for the other M >= P it accepts (M=10, 12 above)."""
    f, b = 1.0 / vpp, 2.0 / vpp
    result = simulate(generate("interleaved_1f1b", pp, m, vpp), _uniform(pp, vpp, f, b / 2, b / 2))
    assert result.bubble_fraction == pytest.approx((pp - 1) / (vpp * m + pp - 1), abs=1e-12)


@pytest.mark.parametrize(("f", "i", "w"), [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5), (1, 2, 0), (2, 3, 1.5)])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 4), (4, 9), (6, 12)])
def test_zb_h1_idles_p_minus_1_times_f_plus_i_minus_w(f, i, w, pp, m):
    """Qi et al. 2024, section 2.1: ZB-H1's bubble per rank is (P-1)(T_F + T_B - T_W) (their B
    is our I), a third of 1F1B's (P-1)(T_F + T_B + T_W) when the three are equal. Holds for
    W <= min(F, I) and M >= P."""
    costs = _uniform(pp, 1, f, i, w)
    zb = simulate(generate("zb_h1", pp, m), costs)
    one_f_one_b = simulate(generate("1f1b", pp, m), costs)
    for r in range(pp):
        assert zb.span_s - zb.busy_s[r] == pytest.approx(zb_h1_idle_time(pp, f, i, w))
        assert one_f_one_b.span_s - one_f_one_b.busy_s[r] == pytest.approx((pp - 1) * (f + i + w))


@pytest.mark.parametrize("pp", [2, 3, 4, 6])
def test_zb_h2_and_zbv_have_zero_bubble_once_m_is_large_enough(pp):
    """ZB-H2 and ZB-V reach zero bubble (the paper's per-rank-span definition) for
    F = I = W once M >= 2P-1, and not before."""
    for name, vpp in (("zb_h2", 1), ("zbv", 2)):
        costs = _uniform(pp, vpp, 1.0, 1.0, 1.0)
        for m in (2 * pp - 1, 2 * pp, 3 * pp + 1):
            assert simulate(generate(name, pp, m, vpp), costs).bubble_fraction == pytest.approx(0, abs=1e-12)
        assert simulate(generate(name, pp, 2 * pp - 2, vpp), costs).bubble_fraction > 0


def test_zb_h2_is_a_parallelogram():
    """Each rank is busy without a gap from its first action: rank r spans [r, r + 3M]."""
    pp, m = 4, 10
    result = simulate(generate("zb_h2", pp, m), _uniform(pp, 1, 1, 1, 1), timeline=True)
    for r in range(pp):
        entries = [e for e in result.timeline if e.rank == r]
        assert entries[0].start_s == r
        assert result.finish_s[r] == r + 3 * m


@pytest.mark.parametrize(("pp", "m"), [(2, 3), (4, 8), (4, 4), (8, 16)])
def test_inflight_peaks(pp, m):
    """GPipe holds all M on every rank; 1F1B holds P-k on rank k; ZB-H1 holds P on every
    rank until W (its defining property: same in-flight count everywhere) and P-k until I;
    ZB-H2 holds 2P-1 until W."""
    costs = _uniform(pp, 1, 1, 1, 1)
    gpipe = simulate(generate("gpipe", pp, m), costs)
    assert gpipe.peak_inflight == (m,) * pp
    one = simulate(generate("1f1b", pp, m), costs)
    assert one.peak_inflight == tuple(min(m, pp - k) for k in range(pp))
    zb1 = simulate(generate("zb_h1", pp, m), costs)
    assert zb1.peak_inflight == (min(m, pp),) * pp
    assert zb1.peak_inflight_freed_at_input_grad == one.peak_inflight
    if m >= 2 * pp - 1:
        assert simulate(generate("zb_h2", pp, m), costs).peak_inflight == (2 * pp - 1,) * pp


@pytest.mark.parametrize(("pp", "m", "vpp"), [(4, 8, 2), (4, 16, 3), (8, 16, 2)])
def test_interleaved_inflight_is_warmup_plus_one(pp, m, vpp):
    """Megatron's interleaved rank r holds (V-1)P + 2(P-1-r) + 1 micro-batch chunks at most."""
    result = simulate(generate("interleaved_1f1b", pp, m, vpp), _uniform(pp, vpp, 1, 1, 1))
    assert result.peak_inflight == tuple(min(vpp * m, (vpp - 1) * pp + 2 * (pp - 1 - r) + 1) for r in range(pp))


def test_peak_bytes_split_backward_accounting():
    """Activation bytes a are held from F start to I end, then weight-grad bytes g until W
    (the paper's M_B and M_W). ZB-H1 rank r: (P-r) full sets plus r sets waiting for their W,
    so the first rank's peak is 1F1B's P*a and no rank exceeds it."""
    pp, m, a, g = 4, 8, 10.0, 3.0
    table = tuple((a,) for _ in range(pp))
    held = tuple((g,) for _ in range(pp))
    costs = StageCosts(
        forward_s=((1.0,),) * pp,
        backward_input_s=((1.0,),) * pp,
        backward_weight_s=((1.0,),) * pp,
        activation_bytes=table,
        weight_grad_bytes=held,
    )
    zb = simulate(generate("zb_h1", pp, m), costs)
    assert zb.peak_activation_bytes == tuple((pp - r) * a + r * g for r in range(pp))
    one = simulate(generate("1f1b", pp, m), costs)
    assert one.peak_activation_bytes == tuple((pp - r) * a for r in range(pp))
    conservative = StageCosts(
        forward_s=((1.0,),) * pp,
        backward_input_s=((1.0,),) * pp,
        backward_weight_s=((1.0,),) * pp,
        activation_bytes=table,
    )
    assert simulate(generate("zb_h1", pp, m), conservative).peak_activation_bytes == (pp * a,) * pp
    assert simulate(generate("1f1b", pp, m), _uniform(pp, 1, 1, 1, 1)).peak_activation_bytes is None


NAMES = [
    ("gpipe", 4, 6, 1),
    ("1f1b", 4, 6, 1),
    ("interleaved_1f1b", 4, 8, 2),
    ("looped_bfs", 3, 5, 2),
    ("zb_h1", 4, 6, 1),
    ("zb_h1", 4, 8, 2),
    ("zb_h2", 4, 9, 1),
    ("zbv", 4, 8, 2),
    ("dualpipev", 4, 9, 2),
]


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), NAMES)
def test_heterogeneous_costs_match_the_reference_evaluation(name, pp, m, vpp):
    """Embedding on the first stage, head + loss on the last, a straggler and p2p latency:
    every start and end equals the independent DAG evaluation."""
    f = [[1.0 + 0.1 * r + 0.05 * c for c in range(vpp)] for r in range(pp)]
    i = [[1.2 + 0.07 * r for _ in range(vpp)] for r in range(pp)]
    w = [[0.8 - 0.03 * c for c in range(vpp)] for _ in range(pp)]
    f[0][0] += 0.4
    last_rank = pp - 1 if name not in ("zbv", "dualpipev") else 0
    f[last_rank][-1] += 0.9
    i[last_rank][-1] += 0.5
    slowdown = tuple(1.3 if r == 1 else 1.0 for r in range(pp))
    costs = StageCosts(
        forward_s=tuple(map(tuple, f)),
        backward_input_s=tuple(map(tuple, i)),
        backward_weight_s=tuple(map(tuple, w)),
        p2p_s=0.15,
        slowdown=slowdown,
    )
    order = generate(name, pp, m, vpp)
    result = simulate(order, costs, timeline=True)
    reference = reference_times(order, costs)
    for entry in result.timeline:
        assert (entry.start_s, entry.end_s) == pytest.approx(reference[entry.action])
    assert result.step_time_s == pytest.approx(max(end for _, end in reference.values()))
    busy = [sum(end - start for a, (start, end) in reference.items() if a in set(order[r])) for r in range(pp)]
    assert result.busy_s == pytest.approx(busy)


def test_straggler_slows_the_whole_pipeline():
    pp, m = 4, 16
    base = simulate(generate("1f1b", pp, m), _uniform(pp, 1, 1, 1, 1))
    slow = StageCosts(
        forward_s=((1.0,),) * pp,
        backward_input_s=((1.0,),) * pp,
        backward_weight_s=((1.0,),) * pp,
        slowdown=(1.0, 1.0, 1.5, 1.0),
    )
    result = simulate(generate("1f1b", pp, m), slow)
    assert result.busy_s[2] == pytest.approx(1.5 * base.busy_s[2])
    assert result.step_time_s >= m * 3 * 1.5


def test_p2p_adds_latency_on_the_critical_path():
    pp, m, c = 4, 8, 0.25
    order = generate("1f1b", pp, m)
    result = simulate(order, _uniform(pp, 1, 1, 1, 1, p2p=c))
    assert result.step_time_s > simulate(order, _uniform(pp, 1, 1, 1, 1)).step_time_s
    assert result.step_time_s == pytest.approx(
        max(e for _, e in reference_times(order, _uniform(pp, 1, 1, 1, 1, c)).values())
    )


def test_deadlock_is_refused_naming_the_waiting_ranks():
    order = {
        0: [Action.from_str(t) for t in ["0F0", "0B0", "0F1", "0B1"]],
        1: [Action.from_str(t) for t in ["1F1", "1F0", "1B0", "1B1"]],
    }
    with pytest.raises(ScheduleError, match=r"deadlocks: rank 0 waits at 0B0 for 1B0 \(rank 1\); rank 1 waits at 1F1"):
        simulate(order, _uniform(2, 1, 1, 1, 1))


@pytest.mark.parametrize(
    ("texts", "needle"),
    [
        ({0: "0F0 0F1 0B0", 1: "1F0 1F1 1B0 1B1"}, "never runs 0B1"),
        ({0: "0F0 0F0 0B0", 1: "1F0 1B0"}, "listed twice"),
        ({0: "0F0 0I0 0B0", 1: "1F0 1B0"}, "both a full backward"),
        ({0: "0F0 0I0", 1: "1F0 1B0"}, "never runs 0W0"),
        ({0: "0B0 0F0", 1: "1F0 1B0"}, "put the forward first"),
        ({0: "0F0 0W0 0I0", 1: "1F0 1B0"}, "W needs I first"),
        ({0: "0F0 0B0 1F0", 1: "1F0 1B0"}, "stage 1 appears on rank 0 and rank 1"),
        ({0: "0F0 0SEND_F0 0B0", 1: "1F0 1B0"}, "not a compute action"),
        ({0: "0F0 0B0", 2: "1F0 1B0"}, "numbered 0..P-1"),
        ({0: "0F0 0B0 2F0 2B0", 1: "1F0 1B0"}, "same number of stages"),
    ],
)
def test_malformed_orders_are_refused(texts, needle):
    order = {r: [Action.from_str(t) for t in text.split()] for r, text in texts.items()}
    with pytest.raises(ScheduleError, match=needle):
        compile_order(order)


def test_costs_must_fit_the_schedule():
    with pytest.raises(ScheduleError, match="4 ranks x 1 chunks"):
        simulate(generate("1f1b", 4, 8), _uniform(4, 2, 1, 1, 1))
    with pytest.raises(ScheduleError, match="rows of 1 chunks"):
        StageCosts(forward_s=((1.0,),) * 2, backward_input_s=((1.0, 1.0),) * 2, backward_weight_s=((1.0,),) * 2)
    with pytest.raises(ScheduleError, match="negative"):
        _uniform(2, 1, -1, 1, 1)
    with pytest.raises(ScheduleError, match="cannot exceed"):
        StageCosts(
            forward_s=((1.0,),),
            backward_input_s=((1.0,),),
            backward_weight_s=((1.0,),),
            activation_bytes=((1.0,),),
            weight_grad_bytes=((2.0,),),
        )
    with pytest.raises(ScheduleError, match="retained_bytes .* cannot exceed weight_grad_bytes"):
        StageCosts(
            forward_s=((1.0,),),
            backward_input_s=((1.0,),),
            backward_weight_s=((1.0,),),
            activation_bytes=((3.0,),),
            weight_grad_bytes=((1.0,),),
            retained_bytes=((2.0,),),
        )


@pytest.mark.parametrize(
    ("name", "pp", "m", "vpp"), [("1f1b", 4, 8, 1), ("zb_h1", 4, 8, 1), ("zbv", 2, 8, 2), ("interleaved_1f1b", 2, 4, 2)]
)
def test_retained_bytes_stay_until_the_step_ends(name, pp, m, vpp):
    """Bytes retained after each backward pile up: with everything retained a rank ends holding
    every micro-batch of every chunk; with a part r retained, the last of them adds r per
    earlier micro-batch on top of the held-count peak it could not exceed otherwise."""
    compiled = compile_schedule(name, pp, m, vpp)
    base = _uniform(pp, vpp, 1, 1, 1)
    ones = tuple((1.0,) * vpp for _ in range(pp))

    def peaks(retained):
        costs = StageCosts(
            forward_s=base.forward_s,
            backward_input_s=base.backward_input_s,
            backward_weight_s=base.backward_weight_s,
            activation_bytes=ones,
            retained_bytes=retained,
        )
        return simulate(compiled, costs).peak_activation_bytes

    assert peaks(ones) == (float(m * vpp),) * pp
    plain, none_kept = peaks(None), peaks(tuple((0.0,) * vpp for _ in range(pp)))
    assert plain == none_kept
    half = peaks(tuple((0.5,) * vpp for _ in range(pp)))
    for r in range(pp):
        assert plain[r] < half[r] <= plain[r] + 0.5 * m * vpp


def test_timeline_and_compiled_cache():
    compiled = compile_schedule("zb_h1", 4, 8, 1)
    assert compile_schedule("zb_h1", 4, 8, 1) is compiled
    fast = simulate(compiled, _uniform(4, 1, 1, 1, 1))
    assert fast.timeline is None
    result = simulate(compiled, _uniform(4, 1, 1, 1, 1), timeline=True)
    assert len(result.timeline) == 3 * 4 * 8
    assert result.step_time_s == fast.step_time_s


@pytest.mark.parametrize(("pp", "m", "vpp"), [(4, 8, 2), (4, 12, 3), (8, 16, 2), (4, 10, 2), (4, 6, 2)])
def test_interleaved_zb_h1_inflight(pp, m, vpp):
    """torch's interleaved ZB1P keeps (V-1)R + P chunks until W on every rank and
    (V-1)R + P - r until I, R = M / max(1, M // P) micro-batches per round."""
    per_round = m // max(1, m // pp)
    result = simulate(generate("zb_h1", pp, m, vpp), _uniform(pp, vpp, 1, 1, 1))
    assert result.peak_inflight == ((vpp - 1) * per_round + pp,) * pp
    assert result.peak_inflight_freed_at_input_grad == tuple((vpp - 1) * per_round + pp - r for r in range(pp))
