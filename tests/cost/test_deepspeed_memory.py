"""Memory DeepSpeed's runtime adds beyond the layers' saved tensors: the BF16_Optimizer's fp32
copy of each .grad and its bf16 cast of the flat gradient buffer for the all-reduce, the
allocator segments they take, and the PipelineEngine's own p2p buffers
(planner/cost/memory.py; DeepSpeed v0.6.x runtime/bf16_optimizer.py, engine.py, pipe/engine.py).

Every expected value is a closed form written from the runtime's source, independent of the
functions under test."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import memory
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.layout import Layout, stage_layers_from_counts
from planner.predict import chunk_costs, predict
from planner.spec import Cluster
from planner.units import GiB, MiB

SEQ = 2048
BLOOM_VOCAB, BLOOM_HIDDEN = 250880, 14336


def test_segment_rounding_is_the_allocators_2_mib():
    assert memory.segment_bytes(10 * MiB + 1) == 12 * MiB
    assert memory.segment_bytes(64 * MiB) == 64 * MiB
    assert memory.segment_bytes(3 * GiB + 5) == 3 * GiB + 2 * MiB


def test_a_transient_larger_than_every_freed_block_gets_its_own_segment():
    # both larger than anything freed before: two new segments
    assert memory.new_segment_bytes([3 * GiB, 7 * GiB], 1 * GiB) == 10 * GiB
    # the first fits in a cached 4 GiB block; only the second grows the reservation
    assert memory.new_segment_bytes([3 * GiB, 7 * GiB], 4 * GiB) == 7 * GiB
    # the second fits in the segment the first left cached
    assert memory.new_segment_bytes([3 * GiB, 2 * GiB], 1 * GiB) == 3 * GiB
    assert memory.new_segment_bytes([0.0, 0.0], 1 * GiB) == 0.0


def test_largest_parameter_is_the_word_embedding_on_bloom_s_end_stages():
    spec = resolve_model("bloom-176b")
    fc1 = 4 * BLOOM_HIDDEN * BLOOM_HIDDEN / 4  # h -> 4h, split over TP 4
    assert memory.largest_param_count(spec, 4, embedding=False, head=False) == fc1
    assert memory.largest_param_count(spec, 4, embedding=True, head=False) == BLOOM_VOCAB * BLOOM_HIDDEN / 4
    assert memory.largest_param_count(spec, 8, embedding=False, head=True) == BLOOM_VOCAB * BLOOM_HIDDEN / 8


def test_bf16_optimizer_transients_closed_form():
    largest, params = 899e6, 3.98e9
    # update_hp_grads: lp.grad.to(float32), 4 B per element of the largest parameter;
    # allreduce_bucket: tensor.to(bfloat16) of the flat fp32 buffer, 2 B per parameter
    assert memory.bf16_optimizer_transients(largest, params, 2) == [4 * largest, 2 * params]
    # an fp32 communication dtype makes the cast a no-op: no copy
    assert memory.bf16_optimizer_transients(largest, params, 4) == [4 * largest, 0.0]


def test_freed_before_is_the_init_clone_or_the_largest_activation():
    # BF16_Optimizer.__init__ clones the bf16 DP partition (2 B x params / DP) before .float()
    assert memory.bf16_optimizer_freed_before(8e9, 8, 1e8) == 2e9
    assert memory.bf16_optimizer_freed_before(8e9, 8, 3e9) == 3e9


def test_largest_activation_is_the_unfused_score_matrix():
    spec = resolve_model("bloom-176b")
    shard = Shard(mbs=2, seq=SEQ, tp=4)
    scores = 2 * 2 * (112 / 4) * SEQ * SEQ  # bf16, b x a/t x s x s
    assert memory.largest_activation_tensor(spec, shard, flash_attention=False) == scores
    fc1_out = 2 * 2 * SEQ * 4 * BLOOM_HIDDEN / 4
    assert memory.largest_activation_tensor(spec, shard, flash_attention=True) == fc1_out


@pytest.mark.parametrize("tp", [1, 4])
def test_pipe_engine_buffers_closed_form(tp):
    shard = Shard(mbs=2, seq=SEQ, tp=tp)
    whole = 2 * 2 * SEQ * BLOOM_HIDDEN  # bf16 b x s x h, the stage boundary
    part = whole / tp
    restored = 2 * whole if tp > 1 else 0  # output and gradient gathered whole for the backward
    first = memory.deepspeed_pipe_buffer_bytes(shard, BLOOM_HIDDEN, 2, first=True, last=False)
    middle = memory.deepspeed_pipe_buffer_bytes(shard, BLOOM_HIDDEN, 2, first=False, last=False)
    last = memory.deepspeed_pipe_buffer_bytes(shard, BLOOM_HIDDEN, 2, first=False, last=True)
    assert first == pytest.approx((part, restored + part))  # output partition; grad_layer
    assert middle == pytest.approx((part, restored + 2 * part))  # ... and pipe_recv_buf
    assert last == pytest.approx((0.0, part))  # pipe_recv_buf only


def _bloom(
    bf16_optimizer: bool,
    grad_reduce_bytes: int = 2,
    p2p_mode: str = "deepspeed",
    context: float = memory.CUDA_CONTEXT_BYTES,
):
    spec = resolve_model("bloom-176b")
    cluster = Cluster.of(resolve_gpu("a100-80gb"), 384, gpus_per_node=8)
    options = CostOptions.of(
        attention="unfused",
        dropout=True,
        p2p_mode=p2p_mode,
        bf16_optimizer=bf16_optimizer,
        grad_reduce_bytes=grad_reduce_bytes,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        cuda_context_bytes=context,
    )
    cuts = stage_layers_from_counts([5] + [6] * 10 + [5], spec.num_layers, 12, 1, "1f1b")
    layout = Layout(
        tp=4,
        pp=12,
        dp=8,
        vpp=1,
        mbs=2,
        num_microbatches=128,
        schedule="1f1b",
        recompute=("full",) * 12,
        sequence_parallel=False,
        zero_stage=1,
        stage_layers=cuts,
    )
    return CostModel(spec, cluster, options), layout


def test_bf16_optimizer_segments_land_in_reserved_memory():
    on, layout = _bloom(True)
    off, _ = _bloom(False)
    params = chunk_costs(on, layout, SEQ).params
    with_opt = predict(on, layout, 2048, SEQ).memory
    without = predict(off, layout, 2048, SEQ).memory
    dp = layout.dp
    for rank in (0, 5, 11):
        end = rank in (0, 11)
        largest = (BLOOM_VOCAB if end else 4 * BLOOM_HIDDEN) * BLOOM_HIDDEN / 4
        copy, cast = 4 * largest, 2 * params[rank]
        freed = max(2 * params[rank] / dp, 2 * 2 * (112 / 4) * SEQ * SEQ)
        round_up = lambda x: -(-x // (2 * MiB)) * (2 * MiB)  # noqa: E731
        expected = (round_up(copy) if copy > freed else 0.0) + round_up(cast)
        a, b = with_opt[rank], without[rank]
        # the bf16 .grad (2 B/param) is a tensor; the segments are reserved beyond the tensors
        assert a.grads - b.grads == pytest.approx(2 * params[rank])
        fragmentation = memory.FRAGMENTATION * (a.allocated - b.allocated)
        assert a.other - b.other == pytest.approx(fragmentation + expected)
        assert a.reserved - b.reserved == pytest.approx(a.allocated - b.allocated + fragmentation + expected)
    # the embedding's fp32 copy (3.35 GiB) exceeds the init clone (~1 GiB): a segment on rank 0;
    # the middle stages' FFN weight copy (0.82 GB) fits in the cached clone (0.92 GB)
    assert 2 * params[0] / dp < 4 * BLOOM_VOCAB * BLOOM_HIDDEN / 4
    assert 2 * params[5] / dp > 4 * 4 * BLOOM_HIDDEN * BLOOM_HIDDEN / 4


def test_fp32_communication_has_no_cast_copy():
    fp32, layout = _bloom(True, grad_reduce_bytes=4)
    bf16, _ = _bloom(True, grad_reduce_bytes=2)
    params = chunk_costs(fp32, layout, SEQ).params
    a, b = predict(bf16, layout, 2048, SEQ).memory[0], predict(fp32, layout, 2048, SEQ).memory[0]
    assert a.other - b.other == pytest.approx(-(-2 * params[0] // (2 * MiB)) * 2 * MiB)


def test_cuda_context_option_is_outside_the_allocator():
    measured, layout = _bloom(True, context=1573 * MiB)
    default, _ = _bloom(True)
    a, b = predict(measured, layout, 2048, SEQ).memory, predict(default, layout, 2048, SEQ).memory
    for x, y in zip(a, b):
        assert x.total - y.total == pytest.approx(1573 * MiB - memory.CUDA_CONTEXT_BYTES)
        assert x.reserved == pytest.approx(y.reserved)
    with pytest.raises(ValueError):
        CostOptions.of(cuda_context_bytes=-1.0)


def test_pipe_engine_buffers_ride_each_in_flight_micro_batch():
    ds, layout = _bloom(False, p2p_mode="deepspeed")
    blocking, _ = _bloom(False, p2p_mode="blocking")
    a, b = predict(ds, layout, 2048, SEQ).memory, predict(blocking, layout, 2048, SEQ).memory
    whole = 2 * 2 * SEQ * BLOOM_HIDDEN
    part = whole / layout.tp
    # 1F1B: rank r holds P - r micro-batches at its peak; each keeps its output partition
    assert a[0].activations - b[0].activations == pytest.approx(12 * part + 2 * whole + part)
    assert a[5].activations - b[5].activations == pytest.approx(7 * part + 2 * whole + 2 * part)
    assert a[11].activations - b[11].activations == pytest.approx(part)
