"""The report's figures against the simulator's own results and closed forms."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel
from planner.layout import Layout, even_stage_layers
from planner.report.data import plan_figures, training_budget
from planner.spec import Cluster

MICROBATCHES = 8


def _figures(schedule: str, pp: int, vpp: int = 1, recompute: str = "none"):
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    layout = Layout(
        tp=2,
        pp=pp,
        dp=64 // (2 * pp),
        cp=1,
        vpp=vpp,
        mbs=1,
        num_microbatches=MICROBATCHES,
        schedule=schedule,
        recompute=(recompute,) * pp,
        sequence_parallel=True,
        zero_stage=1,
        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule),
    )
    global_batch = layout.dp * MICROBATCHES
    return layout, plan_figures(CostModel(spec, cluster), layout, global_batch, 4096)


@pytest.mark.parametrize(
    "schedule,pp,vpp", [("1f1b", 4, 1), ("interleaved_1f1b", 2, 4), ("zb_h1", 4, 1), ("zbv", 4, 2), ("gpipe", 2, 1)]
)
def test_activation_curve_peaks_at_the_simulators_peak(schedule, pp, vpp):
    """The curve walks the timeline's times; the simulator walks each rank's action order."""
    _, figures = _figures(schedule, pp, vpp)
    timing = figures.prediction.timing
    for rank, (_, values) in enumerate(figures.activation_curves):
        assert max(values) == pytest.approx(timing.peak_activation_bytes[rank], rel=1e-9)
        assert values[-1] == pytest.approx(0.0, abs=1.0)  # every micro-batch freed by the step's end


@pytest.mark.parametrize("schedule,pp,vpp", [("1f1b", 4, 1), ("interleaved_1f1b", 2, 4), ("zb_h1", 4, 1)])
def test_compute_and_idle_bars_tile_each_rank_until_it_finishes(schedule, pp, vpp):
    layout, figures = _figures(schedule, pp, vpp)
    timing = figures.prediction.timing
    for rank in range(pp):
        compute = [b for b in figures.bars if b.rank == rank and b.kind in ("F", "B", "I", "W")]
        idle = [b for b in figures.bars if b.rank == rank and b.kind == "idle"]
        assert sum(b.end_s - b.start_s for b in compute) == pytest.approx(timing.busy_s[rank], rel=1e-9)
        covered = sorted(compute + idle, key=lambda b: b.start_s)
        assert covered[0].start_s == 0.0
        assert all(a.end_s == pytest.approx(b.start_s, abs=1e-12) for a, b in zip(covered, covered[1:]))
        assert covered[-1].end_s == pytest.approx(timing.finish_s[rank])
    split = 3 if schedule.startswith("zb") else 2  # F, I, W each, or F and B
    assert sum(b.kind in ("F", "B", "I", "W") for b in figures.bars) == split * pp * vpp * MICROBATCHES


def test_one_transfer_per_cross_rank_hop_lasting_the_p2p_time():
    """1F1B on P ranks: each micro-batch crosses P - 1 boundaries forward and P - 1 backward."""
    pp = 4
    _, figures = _figures("1f1b", pp)
    recv = [b for b in figures.bars if b.kind == "recv"]
    assert len(recv) == 2 * (pp - 1) * MICROBATCHES
    durations = {round(b.end_s - b.start_s, 12) for b in recv}
    assert len(durations) == 1 and durations.pop() > 0
    assert not any(b.rank == 0 and "activation" in b.label for b in recv)  # rank 0 receives only gradients
    assert not any(b.rank == pp - 1 and "gradient" in b.label for b in recv)


def test_the_step_tail_ends_at_the_predicted_step_time():
    _, figures = _figures("1f1b", 4)
    p = figures.prediction
    tail = [b for b in figures.bars if b.kind == "step"]
    assert len(tail) == 4 and all(b.end_s == pytest.approx(p.step_time_s) for b in tail)
    assert max(b.end_s for b in figures.bars) == pytest.approx(p.step_time_s)
    expected = sum(p.time_breakdown_s[k] for k in ("loss_scale_check", "grad_norm", "optimizer"))
    assert tail[0].end_s - tail[0].start_s == pytest.approx(expected)


def test_training_budget_closed_form():
    """8,640 steps of 10 s are one day; on 512 GPUs 12,288 GPU-hours."""
    tokens = 1024 * 4096 * 8640
    budget = training_budget(tokens, 1024, 4096, 10.0, 512, gpu_hour_price=2.0)
    assert budget.steps == 8640
    assert budget.days == pytest.approx(1.0)
    assert budget.gpu_hours == pytest.approx(24 * 512)
    assert budget.cost == pytest.approx(2 * 24 * 512)
    assert training_budget(tokens, 1024, 4096, 10.0, 512).cost is None
