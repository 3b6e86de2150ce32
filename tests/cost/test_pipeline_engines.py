"""The pipeline engines' runtime behaviours in `predict`: blocking send/recv holds
(`CostOptions.pipeline.p2p_mode`) and DeepSpeed's BF16_Optimizer (`CostOptions.data.bf16_optimizer`).

The simulator side of the holds is checked against rendezvous replays of the runtimes' calls
in tests/schedule/test_blocking_p2p.py; here: what each mode charges per exchange, from the
network's own transfer and all-gather times, and where it lands in the step and memory."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.predict import chunk_costs, predict
from planner.spec import Cluster
from tests.cost.layouts import even_1f1b

SEQ = 2048


def _setup(
    mode: str = "overlapped",
    *,
    tp: int = 4,
    pp: int = 4,
    dp: int = 2,
    sp: bool = False,
    zero: int = 1,
    bf16_optimizer: bool = False,
    m: int = 8,
):
    spec = resolve_model("gpt3-175b")
    cluster = Cluster.of(resolve_gpu("a100-80gb"), tp * pp * dp, gpus_per_node=8)
    model = CostModel(spec, cluster, CostOptions.of(p2p_mode=mode, bf16_optimizer=bf16_optimizer))
    layout = even_1f1b(spec, tp=tp, pp=pp, dp=dp, micro_batches=m, recompute="full", sp=sp, zero=zero)
    return model, layout


def _activation_bytes(model, layout):
    return model.dtype_bytes * SEQ * layout.mbs * model.spec.hidden_size


def test_overlapped_sends_keep_the_lag_and_hold_nothing():
    model, layout = _setup("overlapped")
    costs = chunk_costs(model, layout, SEQ)
    part = _activation_bytes(model, layout) / layout.tp
    assert costs.p2p_s == pytest.approx(model.network.p2p(part, layout.pp, layout.tp * layout.dp))
    assert (costs.send_hold_forward_s, costs.send_hold_backward_s) == (0.0, 0.0)
    assert "pp_p2p_blocked" not in predict(model, layout, layout.dp * 8, SEQ).time_breakdown_s


def test_megatron_blocking_holds_the_scatter_gather_exchange():
    """One batched send+receive of 1/TP of the activation, then the all-gather over TP
    (scatter-gather); the transfer is inside the hold, so no separate lag."""
    model, layout = _setup("blocking")
    costs = chunk_costs(model, layout, SEQ)
    full = _activation_bytes(model, layout)
    net, stride = model.network, layout.tp * layout.dp
    expected = net.p2p(full / layout.tp, layout.pp, stride) + net.all_gather(full, layout.tp, 1)
    assert costs.send_hold_forward_s == pytest.approx(expected)
    assert costs.send_hold_backward_s == pytest.approx(expected)
    assert costs.p2p_s == 0.0


def test_megatron_blocking_with_sequence_parallelism_sends_the_shard_without_gathering():
    model, layout = _setup("blocking", sp=True)
    costs = chunk_costs(model, layout, SEQ)
    shard = _activation_bytes(model, layout) / layout.tp
    assert costs.send_hold_forward_s == pytest.approx(model.network.p2p(shard, layout.pp, layout.tp * layout.dp))


def test_deepspeed_before_v0_5_4_adds_the_whole_gradient_to_each_hold():
    """DeepSpeed before v0.5.4 sends the activation as its TP partition but the gradient whole,
    each a separate blocking call: its hold exceeds Megatron's by one full-activation transfer."""
    blocking = chunk_costs(*_setup("blocking"), SEQ)
    model, layout = _setup("deepspeed-whole-grads")
    deepspeed = chunk_costs(model, layout, SEQ)
    whole = model.network.p2p(_activation_bytes(model, layout), layout.pp, layout.tp * layout.dp)
    for attr in ("send_hold_forward_s", "send_hold_backward_s"):
        assert getattr(deepspeed, attr) - getattr(blocking, attr) == pytest.approx(whole)


def test_deepspeed_today_adds_a_partition_and_the_gradient_gather():
    """Today's engine sends the gradient as its TP partition too: over Megatron's exchange, one
    more partition transfer each way, and the gradient's all-gather before the backward."""
    blocking = chunk_costs(*_setup("blocking"), SEQ)
    model, layout = _setup("deepspeed")
    deepspeed = chunk_costs(model, layout, SEQ)
    full = _activation_bytes(model, layout)
    part = model.network.p2p(full / layout.tp, layout.pp, layout.tp * layout.dp)
    gather = model.network.all_gather(full, layout.tp, 1)
    assert deepspeed.send_hold_forward_s - blocking.send_hold_forward_s == pytest.approx(part + gather)
    assert deepspeed.send_hold_backward_s - blocking.send_hold_backward_s == pytest.approx(part)


@pytest.mark.parametrize("mode", ["blocking", "deepspeed", "deepspeed-whole-grads"])
def test_blocked_time_is_its_own_step_term(mode):
    """The holds lengthen the step, appear as pp_p2p_blocked (the critical rank's holds:
    2M of them on an inner rank), and the breakdown still adds up to the step."""
    m = 8
    free = predict(*_setup("overlapped", m=m), 2 * m, SEQ)
    model, layout = _setup(mode, m=m)
    held = predict(model, layout, 2 * m, SEQ)
    costs = chunk_costs(model, layout, SEQ)
    blocked = held.time_breakdown_s["pp_p2p_blocked"]
    assert held.step_time_s > free.step_time_s
    assert sum(held.time_breakdown_s.values()) == pytest.approx(held.step_time_s, rel=1e-12)
    one_side = m * min(costs.send_hold_forward_s, costs.send_hold_backward_s)
    assert one_side - 1e-12 <= blocked <= m * (costs.send_hold_forward_s + costs.send_hold_backward_s) + 1e-12


def test_pipeline_modes_change_nothing_without_a_pipeline():
    plain = predict(*_setup("overlapped", pp=1, dp=4), 32, SEQ)
    deepspeed = predict(*_setup("deepspeed", pp=1, dp=4), 32, SEQ)
    assert deepspeed.step_time_s == plain.step_time_s


def test_bf16_optimizer_keeps_two_more_bytes_per_parameter():
    """BF16_Optimizer keeps every parameter's bf16 .grad beside its fp32 gradient buffer."""
    model, layout = _setup(zero=1)
    base = predict(model, layout, 16, SEQ)
    model_bf16, _ = _setup(zero=1, bf16_optimizer=True)
    ds = predict(model_bf16, layout, 16, SEQ)
    params = chunk_costs(model, layout, SEQ).params
    for r, (a, b) in enumerate(zip(base.memory, ds.memory)):
        assert b.grads - a.grads == pytest.approx(2 * params[r])
        assert (b.weights, b.optimizer, b.activations) == (a.weights, a.optimizer, a.activations)


def test_bf16_optimizer_all_reduces_what_the_distributed_optimizer_reduce_scatters():
    """Its DP reduction is an all-reduce of the fp32 grads (about twice a reduce-scatter's
    traffic); the parameter all-gather after the step is the same."""
    model, layout = _setup(zero=1, dp=8, pp=2)
    base = predict(model, layout, 64, SEQ).time_breakdown_s["dp_comm_exposed"]
    model_bf16, _ = _setup(zero=1, dp=8, pp=2, bf16_optimizer=True)
    ds = predict(model_bf16, layout, 64, SEQ).time_breakdown_s["dp_comm_exposed"]
    assert ds > base * 1.2


def test_embedding_layernorm_keeps_its_input_for_backward():
    """BLOOM's embedding LayerNorm (Megatron-DeepSpeed --embed-layernorm) is outside every
    checkpointed block (DeepSpeed's PipelineModule checkpoints only the transformer layers),
    so each micro-batch keeps its bf16 input and per-token fp32 mean and rstd."""
    from planner.cost.memory import activation_bytes
    from planner.cost.shapes import Shard

    bloom = resolve_model("bloom-176b")
    assert bloom.embedding_norm
    plain = bloom.model_copy(update={"embedding_norm": False})
    shard = Shard(mbs=2, seq=SEQ, tp=4, cp=1, sequence_parallel=False)
    extra = activation_bytes(bloom, "embedding", shard, "full") - activation_bytes(plain, "embedding", shard, "full")
    tokens = 2 * SEQ
    assert extra == pytest.approx(2 * tokens * bloom.hidden_size + 8 * tokens)


def test_launch_blocking_adds_host_time_to_gpu_time():
    """CUDA_LAUNCH_BLOCKING=1: each launch waits for its kernel, so a layer costs its GPU time
    plus the host's per-op time (the usual asynchronous launch costs the larger of the two)."""
    from planner.cost.compute import AnalyticCompute
    from planner.cost.kernel_counts import host_times, op_counts
    from planner.cost.model import AnalyticSource
    from planner.cost.shapes import Shard

    spec, gpu = resolve_model("bloom-176b"), resolve_gpu("a100-80gb")
    shard = Shard(mbs=2, seq=SEQ, tp=4, cp=1, sequence_parallel=False)
    options = CostOptions.of(attention="unfused", dropout=True)
    gpu_only = AnalyticSource(
        spec, AnalyticCompute(gpu, "bf16"), CostOptions.of(attention="unfused", dropout=True, cuda_graphs=True)
    )
    asynchronous = AnalyticSource(spec, AnalyticCompute(gpu, "bf16"), options)
    blocking = AnalyticSource(
        spec, AnalyticCompute(gpu, "bf16"), CostOptions.of(attention="unfused", dropout=True, launch_blocking=True)
    )
    host_fwd, host_bwd = host_times(op_counts(spec, "transformer", True, True), AnalyticCompute(gpu, "bf16").eff)
    base, lazy, eager = (s.layer_times("transformer", shard) for s in (gpu_only, asynchronous, blocking))
    assert eager.forward_s == pytest.approx(base.forward_s + host_fwd)
    assert eager.backward_s == pytest.approx(base.backward_s + host_bwd)
    assert eager.backward_input_s / eager.backward_weight_s == pytest.approx(
        base.backward_input_s / base.backward_weight_s
    )
    assert lazy.forward_s == pytest.approx(max(base.forward_s, host_fwd))
