"""`predict`'s per-step terms: the breakdown adds up to the step, each term appears exactly
when the runtime runs it, the DP overlap follows the bucket closed form, and memory reports
allocated < reserved < device memory with the parts the allocator model names."""

from __future__ import annotations

import math

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import memory, step
from planner.cost.comm import megatron_bucket_params
from planner.cost.model import CostModel, CostOptions
from planner.layout import Layout, even_stage_layers
from planner.predict import predict
from planner.predict.data_parallel import exposed_dp_time
from planner.spec import Cluster

SEQ = 2048


def _layout(spec, tp, pp, dp, m, *, schedule="1f1b", vpp=1, mbs=1, zero=1):
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=mbs,
        num_microbatches=m,
        schedule=schedule,
        recompute=("none",) * pp,
        sequence_parallel=tp > 1,
        zero_stage=zero,
        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule),
    )


def _model(name, gpus, **options):
    spec = resolve_model(name)
    return CostModel(spec, Cluster.of(resolve_gpu("h100"), gpus), CostOptions.of(**options))


@pytest.mark.parametrize(
    ("name", "tp", "pp", "dp", "m", "schedule", "vpp"),
    [
        ("llama3-8b", 2, 2, 4, 8, "1f1b", 1),
        ("gpt3-175b", 8, 4, 2, 8, "interleaved_1f1b", 2),
        ("tiny-gpt", 1, 2, 2, 4, "zbv", 2),
        ("llama3-8b", 1, 1, 16, 1, "1f1b", 1),
    ],
)
def test_breakdown_adds_up_to_the_step(name, tp, pp, dp, m, schedule, vpp):
    model = _model(name, tp * pp * dp)
    layout = _layout(model.spec, tp, pp, dp, m, schedule=schedule, vpp=vpp)
    p = predict(model, layout, dp * m, SEQ)
    assert sum(p.time_breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-12)
    for key in ("tied_embedding_grad", "loss_scale_check", "grad_norm", "optimizer", "dp_comm_exposed"):
        assert p.time_breakdown_s[key] >= 0.0


def test_tied_embedding_grad_all_reduce_only_across_ranks():
    """gpt3-175b ties its embeddings: charged with PP > 1 when the head is on another rank,
    not with PP = 1, nor for a V-shaped schedule (head back on rank 0); llama3 does not tie.
    (ZeRO-2 buckets every rank's DP reduction, so no middle rank's single-bucket reduction
    outlasts the first and last ranks' and hides the all-reduce.)"""
    gpt = _model("gpt3-175b", 64)
    assert gpt.spec.tie_embeddings
    pipelined = predict(gpt, _layout(gpt.spec, 8, 4, 2, 8, zero=2), 16, SEQ).time_breakdown_s
    assert pipelined["tied_embedding_grad"] > 0.0
    flat = predict(gpt, _layout(gpt.spec, 8, 1, 8, 2), 16, SEQ).time_breakdown_s
    assert flat["tied_embedding_grad"] == 0.0
    tiny = _model("tiny-gpt", 8)
    if tiny.spec.tie_embeddings:
        v_shaped = predict(tiny, _layout(tiny.spec, 1, 2, 4, 4, schedule="zbv", vpp=2), 16, SEQ)
        assert v_shaped.time_breakdown_s["tied_embedding_grad"] == 0.0
    llama = _model("llama3-8b", 16)
    assert not llama.spec.tie_embeddings
    assert predict(llama, _layout(llama.spec, 2, 2, 4, 8), 32, SEQ).time_breakdown_s["tied_embedding_grad"] == 0.0


def test_tied_embedding_term_is_at_most_its_all_reduce():
    """It delays the step by the all-reduce at most (less when another rank finishes later)."""
    gpt = _model("gpt3-175b", 64)
    layout = _layout(gpt.spec, 8, 4, 2, 8, zero=2)
    p = predict(gpt, layout, 16, SEQ)
    spec = gpt.spec
    reduce = step.tied_embedding_time(gpt.network, spec.vocab_size, spec.hidden_size, 4, 8, 1, 2, 4)
    assert 0.0 < p.time_breakdown_s["tied_embedding_grad"] <= reduce * (1 + 1e-12)


def test_fp16_adds_the_loss_scale_check_and_nothing_else():
    bf16 = _model("llama3-8b", 16, dtype="bf16")
    fp16 = _model("llama3-8b", 16, dtype="fp16")
    layout = _layout(bf16.spec, 2, 2, 4, 8)
    a, b = predict(bf16, layout, 32, SEQ), predict(fp16, layout, 32, SEQ)
    assert a.time_breakdown_s["loss_scale_check"] == 0.0
    check = b.time_breakdown_s["loss_scale_check"]
    assert check > 0.0
    assert b.step_time_s - a.step_time_s == pytest.approx(check, rel=1e-9)


def test_dp_reduction_with_one_microbatch_follows_the_bucket_closed_form():
    """PP 1, M 1, ZeRO-1: the exposed reduce-scatter is the bucket stream's closed form (checked
    against a replay in test_step_costs.py) with ceil(params / 40M) equal buckets, each one
    collective call, and a last one holding at least the word embedding; the parameter
    all-gather mirrors it over the forward. Without
    interference; with it, the exposed time is never less."""
    model = _model("llama3-8b", 16, interference=False)
    layout = _layout(model.spec, 1, 1, 16, 1)
    p = predict(model, layout, 16, SEQ)
    from planner.predict import chunk_costs

    costs = chunk_costs(model, layout, SEQ)
    params = costs.params[0]
    assert megatron_bucket_params(16) == 40e6
    calls = math.ceil(params / 40e6)
    bucket = params / calls
    embedding = memory.embedding_param_count(model.spec, 1)
    edge = max(bucket, embedding)
    reduce = calls * model.network.reduce_scatter(params * 4 / calls, 16, 1)
    gather = calls * model.network.all_gather(params * 2 / calls, 16, 1)
    backward = costs.backward_input_s[0][0] + costs.backward_weight_s[0][0]
    forward = costs.forward_s[0][0]
    b, t = bucket / params, edge / params

    def stream(total, window):
        return max(total * t, total * (b + t) - window * t, total - window * (1 - b))

    expected = stream(reduce, backward) + stream(gather, forward)
    assert p.time_breakdown_s["dp_comm_exposed"] == pytest.approx(expected, rel=1e-12)
    # the old window-of-one-micro-batch form hid the first bucket's wait: never more exposed
    old = max(reduce * bucket / params, reduce - backward) + max(gather * bucket / params, gather - forward)
    assert expected >= old
    with_interference = predict(_model("llama3-8b", 16), layout, 16, SEQ).time_breakdown_s["dp_comm_exposed"]
    assert with_interference >= expected


def test_dp_bucket_grows_with_the_data_parallel_size():
    assert megatron_bucket_params(8) == 40e6
    assert megatron_bucket_params(64) == 64e6


def test_memory_allocated_reserved_and_device():
    model = _model("llama3-8b", 16)
    layout = _layout(model.spec, 2, 2, 4, 8)
    p = predict(model, layout, 32, SEQ)
    for m in p.memory:
        assert m.allocated == pytest.approx(m.weights + m.grads + m.optimizer + m.activations)
        assert m.reserved == pytest.approx((1 + memory.FRAGMENTATION) * m.allocated + memory.CUBLAS_WORKSPACE_BYTES)
        # TP and DP communicators run collectives, PP sends and receives; llama3 does not tie
        nccl = 2 * 32 * 2 * 10 * 2**20 + 2 * 2 * 10 * 2**20
        assert m.total - m.reserved == pytest.approx(memory.CUDA_CONTEXT_BYTES + nccl)
    predicted = p.to_predicted()
    assert predicted.memory_allocated_gb_per_stage == [round(m.allocated / 2**30, 3) for m in p.memory]
    assert predicted.memory_reserved_gb_per_stage == [round(m.reserved / 2**30, 3) for m in p.memory]
    assert all(
        a < r < t
        for a, r, t in zip(
            predicted.memory_allocated_gb_per_stage,
            predicted.memory_reserved_gb_per_stage,
            predicted.memory_gb_per_stage,
        )
    )


def test_tied_embedding_group_buffers_only_on_its_two_ranks():
    gpt = _model("gpt3-175b", 64)
    p = predict(gpt, _layout(gpt.spec, 8, 4, 2, 8), 16, SEQ)
    outside = [m.outside_allocator for m in p.memory]
    assert outside[0] == outside[3] == outside[1] + memory.NCCL_COLLECTIVE_COMM_BYTES
    assert outside[1] == outside[2]


def test_communicators_counted_per_group():
    assert memory.communicator_bytes(1, 1, 1, 1) == 0.0
    assert memory.communicator_bytes(8, 1, 1, 1) == memory.NCCL_COLLECTIVE_COMM_BYTES
    assert memory.communicator_bytes(8, 2, 4, 2, True) == (
        4 * memory.NCCL_COLLECTIVE_COMM_BYTES + memory.NCCL_P2P_COMM_BYTES
    )
    assert memory.NCCL_COLLECTIVE_COMM_BYTES == 640 * 2**20


def test_pipeline_send_charges_latency_and_bandwidth_on_each_hop():
    """One micro-batch's activation (bf16, s/TP tokens under SP) to the next stage: across
    nodes (TP 8 fills a node) alpha + bytes / beta of the inter-node link; the simulator adds
    it in full on every cross-rank dependency: uniform 1F1B takes (M + P - 1)(f + b) plus a
    whole number of hops, at least the 2(P - 1) of the warm-up and cool-down chains."""
    from planner.pipeline import pipeline_timing
    from planner.predict import chunk_costs

    model = _model("llama3-8b", 64)
    layout = _layout(model.spec, 8, 4, 2, 8)
    costs = chunk_costs(model, layout, SEQ)
    cluster = model.cluster
    nbytes = 2 * SEQ * model.spec.hidden_size / 8
    assert model.network.placement(4, 16).num_nodes == 4  # each stage on its own nodes
    assert costs.p2p_s == pytest.approx(model.network.p2p(nbytes, 4, 16))
    # never faster than the bytes over the scale-out NIC at line rate
    assert costs.p2p_s > nbytes / (cluster.inter_node_bw_gbps * 1e9)
    uniform = type(costs)(
        forward_s=[[1.0]] * 4,
        backward_input_s=[[1.5]] * 4,
        backward_weight_s=[[0.5]] * 4,
        activation_bytes=[[1.0]] * 4,
        extra_bytes=[0.0] * 4,
        params=[0.0] * 4,
        tp_comm_s=[0.0] * 4,
        p2p_s=costs.p2p_s,
    )
    timing = pipeline_timing(uniform, "1f1b", 4, 1, 8)
    hops = (timing.step_time_s - (8 + 4 - 1) * 3.0) / costs.p2p_s
    assert hops == pytest.approx(round(hops), abs=1e-6)
    assert round(hops) >= 2 * (4 - 1)


def test_later_pipeline_ranks_reduce_in_one_bucket_under_megatron_ddp():
    """Megatron's DDP turns bucketing off on pipeline ranks after the first: their whole
    reduce-scatter and all-gather are exposed; ZeRO-2 (DeepSpeed) buckets every rank."""
    from planner.predict import chunk_costs, exposed_dp_time

    model = _model("llama3-8b", 32)
    for zero, bucketed in ((1, False), (2, True)):
        layout = _layout(model.spec, 2, 2, 8, 8, zero=zero)
        costs = chunk_costs(model, layout, SEQ)
        params = costs.params[1]
        reduce = model.network.reduce_scatter(params * 4, 8, 2)
        gather = model.network.all_gather(params * 2, 8, 2)
        exposed = exposed_dp_time(model, layout, costs, 1)
        if bucketed:
            assert exposed < reduce + gather
        else:
            assert exposed == pytest.approx(reduce + gather, rel=1e-12)


def test_zero1_broadcast_exchange_charges_one_broadcast_per_rank():
    """InternLM's hybrid ZeRO-1 (`zero1_exchange="all_reduce_broadcast"`): gradients all-reduced in
    buckets of the runtime's size, then every data-parallel rank broadcasts the shard it updated,
    one call after another and, without overlap, all of it exposed."""
    from planner.predict import chunk_costs

    dp, bucket = 64, 512 * 1024 * 1024
    options = dict(
        zero1_exchange="all_reduce_broadcast",
        grad_bucket_params=bucket,
        grad_reduce_bytes=2,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
    )
    model = _model("llama3-8b", dp, **options)
    layout = _layout(model.spec, 1, 1, dp, 1)
    costs = chunk_costs(model, layout, SEQ)
    params = costs.params[0]
    reduce = model.network.all_reduce(params * 2, dp, 1)  # without overlap: one call, the whole buffer
    broadcasts = dp * model.network.broadcast(params * 2 / dp, dp, 1)
    p = predict(model, layout, dp, SEQ)
    assert p.time_breakdown_s["dp_comm_exposed"] == pytest.approx(reduce + broadcasts, rel=1e-12)
    scatter = predict(_model("llama3-8b", dp, **{**options, "zero1_exchange": "reduce_scatter"}), layout, dp, SEQ)
    assert p.time_breakdown_s["dp_comm_exposed"] > scatter.time_breakdown_s["dp_comm_exposed"]


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 2)])
def test_zero1_whole_buffer_exchange_is_exposed_whole(tp, pp):
    """nanotron's ZeRO-1 with fp32 accumulation (`zero1_exchange="all_reduce_all_gather"`): after
    the backward one all-reduce of the rank's whole fp32 gradient buffer, after the step one
    all-gather of the updated bf16 shards, neither behind any compute, whatever the overlap
    flags say (they are DDP's, which nanotron does not wrap the model in under ZeRO-1)."""
    from planner.predict import chunk_costs

    dp = 16
    options = dict(zero1_exchange="all_reduce_all_gather", grad_reduce_bytes=4, overlap_grad_reduce=True)
    model = _model("llama3-8b", tp * pp * dp, **options)
    layout = _layout(model.spec, tp, pp, dp, 8)
    costs = chunk_costs(model, layout, SEQ)
    for rank in range(pp):
        params = costs.params[rank]
        expected = model.network.all_reduce(params * 4, dp, tp) + model.network.all_gather(params * 2, dp, tp)
        assert exposed_dp_time(model, layout, costs, rank) == pytest.approx(expected, rel=1e-12)
    megatron = _model("llama3-8b", tp * pp * dp, **{**options, "zero1_exchange": "reduce_scatter"})
    assert exposed_dp_time(model, layout, costs, 0) > exposed_dp_time(megatron, layout, costs, 0)


def test_runtime_bucket_size_sets_the_call_count():
    from planner.cost.comm import grad_bucket_count

    assert grad_bucket_count(7e9, 1024, bucket_params=512 * 1024 * 1024) == 14
    assert grad_bucket_count(7e9, 1024) == math.ceil(7e9 / megatron_bucket_params(1024))


def test_interleaved_plan_keeps_the_broadcast_exchange():
    """Megatron's chunk-by-chunk reduction under interleaved 1F1B is its own exchange: a plan priced
    with the per-rank broadcast exchange is charged its broadcasts there too, not Megatron's
    all-gather."""
    from planner.predict import chunk_costs

    dp = 8
    options = dict(zero1_exchange="all_reduce_broadcast", overlap_param_gather=False)
    model = _model("llama3-8b", 2 * dp, **options)
    layout = _layout(model.spec, 1, 2, dp, 8, schedule="interleaved_1f1b", vpp=2)
    costs = chunk_costs(model, layout, SEQ)
    broadcasts = dp * model.network.broadcast(costs.params[0] * 2 / dp, dp, 1)
    exposed = predict(model, layout, dp * 8, SEQ).time_breakdown_s["dp_comm_exposed"]
    assert exposed >= broadcasts
    megatron = _model("llama3-8b", 2 * dp, **{**options, "zero1_exchange": "reduce_scatter"})
    assert exposed != predict(megatron, layout, dp * 8, SEQ).time_breakdown_s["dp_comm_exposed"]
