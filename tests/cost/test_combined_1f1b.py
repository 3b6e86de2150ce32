"""Megatron-core's combined 1F1B (`--overlap-moe-expert-parallel-comm`): the planner's per-layer
two-stream model against megatron-core's own schedule plan and scheduler, and closed forms."""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import replace
from types import SimpleNamespace

import pytest

from planner.cost.overlap import (
    COMBINED_1F1B_ORDER,
    SplitLayer,
    combined_1f1b_extra_time,
    combined_1f1b_period,
    combined_1f1b_step,
    combined_1f1b_step_excess,
    combined_1f1b_step_order,
)

schedule_plan = pytest.importorskip("megatron.core.models.common.model_chunk_schedule_plan")
schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")


def _recording_layer(tag: str, log: list[str]) -> SimpleNamespace:
    def node(name: str) -> SimpleNamespace:
        def record(step: str):
            def call(value=None):
                log.append(f"{name}_{step}_{tag}")
                return value

            return call

        return SimpleNamespace(forward=record("fwd"), backward=record("bwd"), backward_dw=record("dw"))

    return SimpleNamespace(
        mtp_post_process=node("mtp"),
        moe_combine=node("combine"),
        pre_dispatch_computation=node("pre"),
        mlp=node("mlp"),
        moe_dispatch=node("dispatch"),
        config=SimpleNamespace(ep_overlap_early_attn_memory_release=False),
        get_low_precision_context=nullcontext,
    )


def test_node_order_is_megatron_cores():
    log: list[str] = []
    schedule_plan.TransformerLayerSchedulePlan.run(
        _recording_layer("f", log), _recording_layer("b", log), f_input=0, b_grad=0, is_last_layer_in_bwd=False
    )
    names = {
        "combine_bwd_b": "combine_bwd",
        "pre_fwd_f": "pre_fwd",
        "mlp_bwd_b": "mlp_bwd",
        "dispatch_fwd_f": "dispatch_fwd",
        "mlp_dw_b": "mlp_bwd_dw",
        "dispatch_bwd_b": "dispatch_bwd",
        "mlp_fwd_f": "mlp_fwd",
        "combine_fwd_f": "combine_fwd",
        "pre_bwd_b": "pre_bwd",
        "pre_dw_b": "pre_bwd_dw",
    }
    assert tuple(names[call] for call in log if not call.startswith("mtp")) == COMBINED_1F1B_ORDER


def test_megatron_runs_combined_1f1b_without_a_pipeline_and_interleaved_only():
    flag = "overlap_moe_expert_parallel_comm"
    assert flag in inspect.getsource(schedules.forward_backward_no_pipelining)
    assert flag in inspect.getsource(schedules.forward_backward_pipelining_with_interleaving)
    assert flag not in inspect.getsource(schedules.forward_backward_pipelining_without_interleaving)


LAYER = SplitLayer(
    pre=1.0, mlp=1.2, pre_dgrad=1.7, pre_wgrad=0.5, mlp_dgrad=1.2, mlp_wgrad=1.1, dispatch=0.9, combine=0.8
)


def test_without_communication_the_layer_is_its_compute():
    silent = replace(LAYER, dispatch=0.0, combine=0.0)
    assert combined_1f1b_period(silent) == pytest.approx(silent.compute_s)


def test_without_compute_the_layer_is_its_four_all_to_alls():
    idle = SplitLayer(pre=0, mlp=0, pre_dgrad=0, pre_wgrad=0, mlp_dgrad=0, mlp_wgrad=0, dispatch=0.9, combine=0.8)
    assert combined_1f1b_period(idle) == pytest.approx(idle.comm_s)


def test_each_all_to_all_hides_behind_the_compute_it_is_paired_with():
    # combine_bwd <= pre_fwd, dispatch_fwd <= mlp_bwd, dispatch_bwd <= mlp_bwd_dw,
    # combine_fwd <= pre_bwd: every all-to-all fits its window
    assert combined_1f1b_period(LAYER) == pytest.approx(LAYER.compute_s)


def test_a_long_dispatch_is_exposed_as_the_dependencies_say():
    # With dispatch 3 s the chain pre_fwd -> dispatch_fwd -> dispatch_bwd (the comm stream's
    # next node) -> pre_bwd (waits for it) -> pre_bwd_dw, then the next layer's pre_fwd, is the
    # critical path: pre + 2 dispatch + pre_dgrad + pre_wgrad = 1 + 6 + 1.7 + 0.5 = 9.2 s a layer
    slow = replace(LAYER, dispatch=3.0)
    chain = slow.pre + 2 * slow.dispatch + slow.pre_dgrad + slow.pre_wgrad
    assert combined_1f1b_period(slow) == pytest.approx(chain)
    assert chain > slow.compute_s


def test_extra_time_is_the_slowdown_when_hidden_and_the_exposure_when_not():
    f = 0.12
    assert combined_1f1b_extra_time(LAYER, f) == pytest.approx(f * LAYER.comm_s)
    slow = replace(LAYER, dispatch=3.0)
    exposed = 9.2 - slow.compute_s
    assert combined_1f1b_extra_time(slow, f) == pytest.approx(exposed + f * (slow.comm_s - exposed))


def _zoo_run(name: str):
    from pathlib import Path

    from planner.fidelity.published import build, load_runs

    runs = load_runs(Path(__file__).parents[1] / "bench" / "published_runs.toml")
    return build(next(r for r in runs if r.name == name))


def test_the_option_pairs_only_what_megatron_core_runs_as_combined_1f1b():
    from planner.cost.model import CostModel
    from planner.predict import pairs_moe_comm

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    assert model.options.moe.moe_ep_overlap and layout.schedule == "interleaved_1f1b" and layout.pp == 8
    assert pairs_moe_comm(model, layout)
    off = CostModel(model.spec, model.cluster, model.options.with_fields(moe_ep_overlap=False))
    assert not pairs_moe_comm(off, layout)
    # TransformerConfig: "disable full recomputation when enabling overlap_moe_expert_parallel_comm"
    assert not pairs_moe_comm(model, replace(layout, recompute=("full",) * layout.pp))
    # plain 1F1B with a pipeline has no combined path (forward_backward_pipelining_without_interleaving)
    assert not pairs_moe_comm(model, replace(layout, schedule="1f1b", vpp=1))
    assert pairs_moe_comm(model, replace(layout, schedule="1f1b", pp=1, vpp=1))


def test_the_overlap_hides_most_of_the_all_to_all_of_the_published_layout():
    from planner.cost.model import CostModel
    from planner.predict import layout_shard

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    off = CostModel(model.spec, model.cluster, model.options.with_fields(moe_ep_overlap=False))
    shard = layout_shard(layout, 4096)
    serial = off.layer_costs("transformer", shard, "selective", False).moe_comm_s
    paired = model.layer_costs("transformer", shard, "selective", True).moe_comm_s
    # DeepEP's normal kernels hold Buffer.num_sms = 20 of the H100's 132 SMs (not NCCL's 16 channels)
    share = 20 / 132
    assert model.cluster.gpu.sm_count == 132 and model.options.moe.moe_dispatcher == "deepep"
    # the overlap leaves at most what does not fit beside the compute node Megatron pairs each
    # all-to-all with, plus the slowdown of the hidden rest (exactly that slowdown when all fit)
    assert share * serial * (1 - 1e-9) <= paired < 0.5 * serial


@pytest.mark.parametrize("pp, vpp, microbatches", [(8, 4, 128), (4, 2, 16), (4, 3, 5), (2, 2, 2)])
def test_unpaired_passes_are_megatron_cores_warmup(pp, vpp, microbatches):
    from planner.predict import unpaired_share

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    layout = replace(layout, pp=pp, vpp=vpp, num_microbatches=microbatches)
    for rank in range(pp):
        group = SimpleNamespace(size=lambda: pp, rank=lambda r=rank: r)
        communicator = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)
        total, _, warmup, _ = schedules.get_pp_rank_microbatches(
            microbatches, vpp, pp, overlap_moe_expert_parallel_comm=True, p2p_communicator=communicator
        )
        assert unpaired_share(model, layout, rank) == pytest.approx(warmup / total)


def test_without_a_pipeline_only_the_first_forward_and_last_backward_run_alone():
    from planner.predict import unpaired_share

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    flat = replace(layout, pp=1, vpp=1, schedule="1f1b", num_microbatches=16)
    assert unpaired_share(model, flat, 0) == pytest.approx(1 / 16)


class _RecordingChunk:
    """A model chunk's schedule plan as TransformerModelChunkSchedulePlan.run uses it, its layers
    recording the nodes they run (tagged with the chunk's letter and the layer's index)."""

    def __init__(self, tag: str, layers: int, log: list[str]):
        self.layers = [_recording_layer(f"{tag}{i}", log) for i in range(layers)]
        for layer in self.layers:
            layer.release_state = lambda: None
        self.vp_stage, self.post_process = 0, None
        self.pre_process = SimpleNamespace(forward=lambda *a: 0, backward=lambda *a: None)

    def record_current_stream(self):
        pass

    wait_current_stream = release_state = record_current_stream

    def num_layers(self):
        return len(self.layers)

    def get_layer(self, i):
        return self.layers[i]

    def pop_layer(self):
        return self.layers.pop()


_MEGATRON_NODE = {
    "combine_bwd": ("combine", "bwd"),
    "pre_fwd": ("pre", "fwd"),
    "mlp_bwd": ("mlp", "bwd"),
    "dispatch_fwd": ("dispatch", "fwd"),
    "mlp_bwd_dw": ("mlp", "dw"),
    "dispatch_bwd": ("dispatch", "bwd"),
    "mlp_fwd": ("mlp", "fwd"),
    "combine_fwd": ("combine", "fwd"),
    "pre_bwd": ("pre", "bwd"),
    "pre_bwd_dw": ("pre", "dw"),
}


@pytest.mark.parametrize("forward_layers, backward_layers", [(3, 3), (2, 3), (3, 2), (1, 1), (1, 4), (4, 1)])
def test_chunk_step_order_is_megatron_cores(forward_layers, backward_layers):
    log: list[str] = []
    schedule_plan.TransformerModelChunkSchedulePlan.run(
        _RecordingChunk("f", forward_layers, log), _RecordingChunk("b", backward_layers, log), b_grad=0
    )
    ours = []
    for node, index in combined_1f1b_step_order(forward_layers, backward_layers):
        module, step = _MEGATRON_NODE[node]
        ours.append(f"{module}_{step}_{'b' if '_bwd' in node else 'f'}{index}")
    assert [call for call in log if not call.startswith("mtp")] == ours


def test_a_step_without_communication_is_its_compute():
    silent = replace(LAYER, dispatch=0.0, combine=0.0)
    forward, backward = silent.pre + silent.mlp, silent.compute_s - silent.pre - silent.mlp
    for f, b in [(3, 3), (2, 3), (3, 1)]:
        assert combined_1f1b_step(silent, f, b) == pytest.approx(f * forward + b * backward)
        assert combined_1f1b_step_excess(silent, f, b) == 0.0


def test_a_joined_step_exposes_the_first_combine_beyond_the_attention_beside_it():
    # LAYER hides every all-to-all, the first combine_bwd (0.8) behind pre_fwd (1.0) too
    assert combined_1f1b_step_excess(LAYER, 3, 3) == pytest.approx(0.0, abs=1e-12)
    # a combine of 1.5 s outlasts the first pre_fwd by 0.5 s; the compute stream waits for it
    # (mlp_bwd needs its output) and the rest of the step hides as before
    long = replace(LAYER, combine=1.5)
    assert combined_1f1b_period(long) == pytest.approx(long.compute_s)
    for n in (1, 2, 3):
        assert combined_1f1b_step(long, n, n) == pytest.approx(n * long.compute_s + 0.5)
        assert combined_1f1b_step_excess(long, n, n) == pytest.approx(0.5)


def test_a_layer_alone_exposes_its_all_to_all():
    # a forward layer with no backward beside it: pre, dispatch, mlp, combine in series
    assert combined_1f1b_step(LAYER, 1, 0) == pytest.approx(LAYER.pre + LAYER.dispatch + LAYER.mlp + LAYER.combine)
    # one more forward layer than backward ones: that layer runs last, its dispatch beside
    # nothing and its combine beside only the deferred weight gradient of the last backward
    # layer's attention (pre_bwd_dw, "delayed ... for overlapping with the p2p comm")
    assert combined_1f1b_step_excess(LAYER, 3, 2) == pytest.approx(LAYER.dispatch + LAYER.combine - LAYER.pre_wgrad)


@pytest.mark.parametrize("pp, vpp, microbatches", [(8, 4, 128), (4, 2, 16), (4, 3, 5), (2, 2, 2), (3, 2, 7)])
def test_chunk_pairs_are_megatron_cores_schedule(pp, vpp, microbatches):
    from planner.predict import combined_1f1b_chunk_pairs

    table = schedules.get_schedule_table(microbatches, vpp, pp)
    for rank in range(pp):
        group = SimpleNamespace(size=lambda: pp, rank=lambda r=rank: r)
        communicator = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)
        total, _, warmup, remaining = schedules.get_pp_rank_microbatches(
            microbatches, vpp, pp, overlap_moe_expert_parallel_comm=True, p2p_communicator=communicator
        )
        expected: dict = {}
        for k in range(remaining):  # the steady loop: forward k + warmup beside backward k
            pair = (table[(k + warmup) % total][1], vpp - 1 - table[k % total][1])
            expected[pair] = expected.get(pair, 0) + 1
        assert dict(combined_1f1b_chunk_pairs(pp, vpp, microbatches, rank)) == expected


def test_the_published_layout_pays_each_steps_join_and_its_unpaired_layers():
    from planner.predict import combined_1f1b_chunk_pairs, combined_1f1b_excess, layout_shard

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    layer = model.combined_1f1b_layer(layout_shard(layout, 4096))
    excess = combined_1f1b_excess(model, layout, 4096)
    for rank, per_rank in enumerate(layout.stage_layers):
        sizes = [end - start for start, end in per_rank]  # Qwen3: every block MoE
        steps = sum(n for _, n in combined_1f1b_chunk_pairs(8, 4, 128, rank))
        joins = steps * combined_1f1b_step_excess(layer, 3, 3)
        unequal = sum(n for (f, b), n in combined_1f1b_chunk_pairs(8, 4, 128, rank) if sizes[f] != sizes[b])
        assert excess[rank] * 128 >= joins * (1 - 1e-9) if min(sizes) == 3 else excess[rank] > 0
        if unequal:  # a 2-layer chunk beside a 3-layer one leaves a layer alone
            assert excess[rank] * 128 > joins


def test_deepeps_sm_count_sets_the_share_beside_compute_where_its_kernels_run():
    from planner.cost.model import CostModel
    from planner.predict import layout_shard

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    shard = layout_shard(layout, 4096)
    assert model._a2a_sm_share(shard) == pytest.approx(20 / 132)
    nccl = CostModel(model.spec, model.cluster, model.options.with_fields(moe_dispatcher="alltoall"))
    assert nccl._a2a_sm_share(shard) == model.cluster.gpu.efficiency.comm_sm_fraction
    unknown = model.cluster.model_copy(update={"gpu": model.cluster.gpu.model_copy(update={"sm_count": None})})
    assert CostModel(model.spec, unknown, model.options)._a2a_sm_share(shard) == nccl._a2a_sm_share(shard)
    quiet = CostModel(model.spec, model.cluster, model.options.with_fields(interference=False))
    assert quiet._a2a_sm_share(shard) == 0.0


def test_the_breakdown_still_sums_to_the_step_with_the_step_excess():
    from planner.predict import predict

    model, layout = _zoo_run("qwen3-235b-ep32-pp8-vpp4-a2a-overlap-256xh100")
    prediction = predict(model, layout, 2048, 4096)
    assert sum(prediction.time_breakdown_s.values()) == pytest.approx(prediction.step_time_s, rel=1e-9)
