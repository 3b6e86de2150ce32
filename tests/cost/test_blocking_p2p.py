"""Blocking pipeline sends (`CostOptions.pipeline.p2p_mode = "blocking"`, Megatron's batched
exchange): each action that sends across ranks holds its rank for the transfer.

Checked against an independent count of the sends, the lowering that planner's torch export
uses (`schedule.add_send_recv`, one SEND_F / SEND_B per cross-rank transfer), on looped and
V-shaped placements, and against megatron-core's own defaults."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.job import runtime_cost_options
from planner.layout import Layout, even_stage_layers
from planner.pipeline import pipeline_timing
from planner.predict import chunk_costs, predict
from planner.schedule import add_send_recv, generate
from planner.schedule.actions import SEND_B, SEND_F
from planner.spec import Cluster

SEQ = 4096


def _case(schedule: str, pp: int, vpp: int, m: int, blocking: bool) -> tuple[CostModel, Layout]:
    spec = resolve_model("llama3-8b")
    layout = Layout(
        tp=2,
        pp=pp,
        dp=2,
        vpp=vpp,
        mbs=1,
        num_microbatches=m,
        schedule=schedule,
        recompute=("none",) * pp,
        sequence_parallel=True,
        zero_stage=1,
        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule),
    )
    cluster = Cluster.of(resolve_gpu("h100"), 2 * pp * 2)
    return CostModel(spec, cluster, CostOptions.of(p2p_mode="blocking" if blocking else "overlapped")), layout


SHAPES = [
    ("1f1b", 4, 1, 8),
    ("interleaved_1f1b", 4, 2, 8),
    ("interleaved_1f1b", 2, 4, 4),
    ("zbv", 4, 2, 8),
    ("zb_h1", 4, 1, 8),
]


MEGATRON_CALLS = {
    # Megatron-LM's blocking calls after each rank's first action (tests/schedule/test_blocking_p2p.py):
    # 1F1B, warm-up w = P-1-r: M + w on rank 0, 2M + 2w inside, M on the last rank
    ("1f1b", 4, 1, 8): [11, 20, 18, 8],
    # interleaved, warm-up w = (V-1)P + 2(P-1-r): V M + w, rank 0's last (empty) call left out
    ("interleaved_1f1b", 4, 2, 8): [25, 24, 22, 20],
}


@pytest.mark.parametrize(("schedule", "pp", "vpp", "m"), SHAPES)
def test_each_rank_is_held_once_per_send_or_megatron_call(schedule, pp, vpp, m):
    """Each rank is held for the p2p time once per SEND_F / SEND_B action of the lowering, or,
    where the simulator pairs Megatron-LM's blocking calls, once per call."""
    overlapped = chunk_costs(*_case(schedule, pp, vpp, m, blocking=False), SEQ)
    blocking = chunk_costs(*_case(schedule, pp, vpp, m, blocking=True), SEQ)
    assert overlapped.p2p_s > 0.0 and blocking.p2p_s == 0.0
    assert (blocking.exchanges is not None) == ((schedule, pp, vpp, m) in MEGATRON_CALLS)
    assert overlapped.exchanges is None
    held = pipeline_timing(blocking, schedule, pp, vpp, m).blocked_s
    lowered = add_send_recv(generate(schedule, pp, m, vpp))
    for rank in range(pp):
        sends = sum(1 for a in lowered[rank] if a.computation_type in (SEND_F, SEND_B))
        calls = MEGATRON_CALLS.get((schedule, pp, vpp, m), [sends] * pp)[rank]
        assert held[rank] == pytest.approx(calls * overlapped.p2p_s, rel=1e-9)


def test_v_placement_turn_sends_nothing():
    """ZB-V keeps stages P-1 and P on the last rank: its chunks there send one way fewer."""
    m = 8
    held = pipeline_timing(chunk_costs(*_case("zbv", 4, 2, m, blocking=True), SEQ), "zbv", 4, 2, m).blocked_s
    p2p_s = chunk_costs(*_case("zbv", 4, 2, m, blocking=False), SEQ).p2p_s
    assert held[3] == pytest.approx(2 * m * p2p_s)
    assert held[1] == pytest.approx(4 * m * p2p_s)
    assert held[0] == pytest.approx(2 * m * p2p_s)  # stage 0 and 2P-1 end the chain


@pytest.mark.parametrize(("schedule", "pp", "vpp", "m"), SHAPES)
def test_blocking_step_is_longer_and_its_term_is_in_the_breakdown(schedule, pp, vpp, m):
    fast = predict(*_case(schedule, pp, vpp, m, blocking=False), 2 * m, SEQ)
    slow = predict(*_case(schedule, pp, vpp, m, blocking=True), 2 * m, SEQ)
    assert slow.step_time_s > fast.step_time_s
    assert "pp_p2p_blocked" not in fast.time_breakdown_s
    assert slow.time_breakdown_s["pp_p2p_blocked"] > 0.0
    assert sum(slow.time_breakdown_s.values()) == pytest.approx(slow.step_time_s, rel=1e-12)


def test_no_pipeline_no_change():
    fast = predict(*_case("1f1b", 1, 1, 4, blocking=False), 8, SEQ)
    slow = predict(*_case("1f1b", 1, 1, 4, blocking=True), 8, SEQ)
    assert slow.step_time_s == fast.step_time_s


def test_megatron_core_defaults_are_the_blocking_exchange():
    """megatron-core's ModelParallelConfig: batch_p2p_comm on, overlap_p2p_comm off: what
    CostOptions.of(p2p_mode="blocking") prices."""
    config = pytest.importorskip("megatron.core.model_parallel_config")
    defaults = config.ModelParallelConfig()
    assert defaults.batch_p2p_comm is True
    assert defaults.overlap_p2p_comm is False


def _step(schedule: str, vpp: int, mode: str) -> float:
    model, layout = _case(schedule, 4, vpp, 8, blocking=False)
    model = CostModel(model.spec, model.cluster, CostOptions.of(p2p_mode=mode))
    return predict(model, layout, 16, SEQ).step_time_s


def test_megatron_lm_mode_blocks_plain_1f1b_and_overlaps_interleaved():
    assert _step("1f1b", 1, "megatron-lm") == _step("1f1b", 1, "blocking") > _step("1f1b", 1, "overlapped")
    assert _step("interleaved_1f1b", 2, "megatron-lm") == _step("interleaved_1f1b", 2, "overlapped")


@pytest.mark.parametrize(
    ("runtime", "mode"),
    [
        (None, "overlapped"),
        ("megatron", "megatron-lm"),
        ("torchtitan", "overlapped"),
        ("torch", "overlapped"),
        ("deepspeed", "deepspeed"),
    ],
)
def test_plans_for_a_runtime_are_charged_its_pipeline_exchange(runtime, mode):
    assert runtime_cost_options(runtime).pipeline.p2p_mode == mode


def _deepspeed_holds(mode: str, tp: int) -> tuple[tuple[float, float], CostModel, float]:
    spec = resolve_model("llama3-8b")
    layout = Layout(
        tp=tp,
        pp=4,
        dp=1,
        vpp=1,
        mbs=1,
        num_microbatches=8,
        schedule="1f1b",
        recompute=("none",) * 4,
        sequence_parallel=False,
        zero_stage=1,
        stage_layers=even_stage_layers(spec.num_layers, 4, 1, "1f1b"),
    )
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 4 * tp), CostOptions.of(p2p_mode=mode))
    part_bytes = model.dtype_bytes * SEQ * spec.hidden_size / tp
    costs = chunk_costs(model, layout, SEQ)
    return (costs.send_hold_forward_s, costs.send_hold_backward_s), model, part_bytes


def test_deepspeed_engine_partitions_gradients_since_v0_5_4_and_not_before():
    """Per 1F1B pair, today's engine (is_grad_partitioned = is_model_parallel) moves two 1/TP
    partitions and gathers three times over TP (the activation on arrival; the stage output and
    the gradient before the backward); before v0.5.4 the gradient went whole and only the
    activation and the restored output were gathered."""
    tp = 8
    (fwd, bwd), model, part = _deepspeed_holds("deepspeed", tp)
    net, stride = model.network, tp
    p2p_part, p2p_whole = net.p2p(part, 4, stride), net.p2p(part * tp, 4, stride)
    gather = net.all_gather(part * tp, tp, 1)
    assert (fwd, bwd) == pytest.approx((2 * p2p_part + 2 * gather, 2 * p2p_part + gather), rel=1e-12)
    (old_fwd, old_bwd), _, _ = _deepspeed_holds("deepspeed-whole-grads", tp)
    assert (old_fwd, old_bwd) == pytest.approx((p2p_part + p2p_whole + gather,) * 2, rel=1e-12)
    assert _deepspeed_holds("deepspeed", 1)[0] == _deepspeed_holds("deepspeed-whole-grads", 1)[0]


def test_installed_deepspeed_partitions_pipeline_gradients_by_default():
    """What `--runtime deepspeed` is charged ("deepspeed") is the engine's default config."""
    config = pytest.importorskip("deepspeed.runtime.config")
    assert config.get_pipeline_config({})["grad_partitioned"] is True
    assert config.get_pipeline_config({})["pipe_partitioned"] is True
