"""The per-kernel floor: op counts traced from the runtime's block, the host time they take,
and the published small-shape H100 measurement it explains."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.kernel_counts import load_counts, op_counts
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard, layer_work
from planner.profile.schema import ShapeKey
from planner.profile.store import load
from planner.spec import Cluster
from scripts import count_kernels  # one module for every test: it registers its torch custom ops on import

MEASURED = Path(__file__).parents[1] / "data" / "h100_measured"
LLAMA = resolve_model("llama3-8b")
H100 = resolve_gpu("h100")


def _block(options: CostOptions, shard: Shard):
    return CostModel(LLAMA, Cluster.of(H100, 8), options).layer_costs("transformer", shard)


def test_counts_file_matches_a_fresh_cpu_trace():
    assert load_counts() == count_kernels.trace_all()


def test_llama_block_counts_contain_its_gemms_and_attention():
    """Seven projections (q, k, v, o, gate, up, down) and one attention kernel forward; their
    data- and weight-gradient GEMMs (14) and the attention backward in the backward."""
    counts = op_counts(LLAMA, "transformer")
    assert counts.forward_kernels >= 7 + 1 + 2  # + the two fused norms
    assert counts.backward_kernels >= 14 + 1 + 2
    unfused = op_counts(LLAMA, "transformer", unfused_attention=True, dropout=True)
    assert (unfused.forward_kernels - counts.forward_kernels, unfused.backward_kernels - counts.backward_kernels) == (
        3,
        5,
    )


SMALL = Shard(mbs=1, seq=2048, tp=8)
LARGE = Shard(mbs=4, seq=8192, tp=8)


def _measured_small_ms() -> tuple[float, float]:
    """The Llama-3-8B block at TP 8, mbs 1, seq 2048 on one H100 SXM (torch eager, bf16): forward
    and full backward ms as `planner profile` wrote them (tests/data/h100_measured/)."""
    row = load(MEASURED / "h100-llama3-8b.json").row_map()[
        ShapeKey("transformer", SMALL.tp, SMALL.mbs, SMALL.seq, "none")
    ]
    return row.forward_ms, row.backward_ms


MEASURED_SMALL_MS = _measured_small_ms()


def test_forward_per_op_host_time_is_the_small_shape_measurement():
    """The H100 presets' `host_op_us_forward` is derived from this measurement: the block's
    forward (GPU work far below its measured time) is the host's, and a host-bound pass ends one kernel
    after the host's last launch, the final residual add (read two, write one activation of
    mbs x seq x hidden bf16 at the HBM rate, plus one kernel's overhead). What remains over the
    block's kernels and half its views is the per-op time (presets/gpus.toml host_source)."""
    counts = op_counts(LLAMA, "transformer")
    compute = CostModel(LLAMA, Cluster.of(H100, 8), CostOptions.of(stragglers=False)).analytic
    activation_bytes = SMALL.mbs * SMALL.seq * LLAMA.hidden_size * 2
    last_add_s = compute.elementwise_time(3 * activation_bytes, 1)
    host_s = MEASURED_SMALL_MS[0] * 1e-3 - last_add_s
    per_op_us = host_s / (counts.forward_kernels + 0.5 * counts.forward_views) * 1e6
    assert H100.efficiency.host_op_us_forward == pytest.approx(per_op_us, abs=0.05)
    gpu_only = _block(CostOptions.of(cuda_graphs=True, stragglers=False), SMALL)
    assert gpu_only.forward_s < 0.5 * MEASURED_SMALL_MS[0] * 1e-3  # the pass is the host's


def test_host_floor_meets_the_small_shape_measurement():
    """Forward: the measurement the per-op time comes from (within the last kernel). Backward:
    at most the measurement, which also holds the profiler's stage_backward call and the autograd
    engine's start (a training backward pays those once per pipeline chunk), and closer to it than
    the GPU alone (docs/kernel_floor.md)."""
    floor = _block(CostOptions(), SMALL)
    gpu_only = _block(CostOptions.of(cuda_graphs=True), SMALL)
    assert floor.forward_s * 1e3 == pytest.approx(MEASURED_SMALL_MS[0], rel=0.03)
    assert floor.backward_s * 1e3 <= MEASURED_SMALL_MS[1]
    assert abs(floor.backward_s * 1e3 / MEASURED_SMALL_MS[1] - 1) < abs(
        gpu_only.backward_s * 1e3 / MEASURED_SMALL_MS[1] - 1
    )


def test_host_floor_leaves_the_large_shape_alone():
    """At mbs 4, seq 8192 the same layer is the GPU's: its kernels fill 96 % of the measured
    forward and 98 % of the backward (tests/data/h100_measured/, tests/cost/test_h100_block.py),
    so the floor must not move it."""
    floor, gpu_only = _block(CostOptions(), LARGE), _block(CostOptions.of(cuda_graphs=True), LARGE)
    assert floor.forward_s == pytest.approx(gpu_only.forward_s, rel=0.01)
    assert floor.backward_s == pytest.approx(gpu_only.backward_s, rel=0.01)


def test_cuda_graphs_keep_the_gpu_side_per_kernel_cost():
    """Under CUDA graphs a layer is the roofline, GPU-side kernel overhead included: at a tiny
    shape it is at least one overhead per GEMM of the forward."""
    shard = Shard(mbs=1, seq=128, tp=8)
    graphs = _block(CostOptions.of(cuda_graphs=True), shard)
    work = layer_work(LLAMA, "transformer", shard)
    assert graphs.forward_s >= len(work.gemms) * H100.efficiency.kernel_overhead_us * 1e-6
    assert graphs.forward_s < _block(CostOptions(), shard).forward_s


def test_host_time_is_counts_times_per_op_cost():
    """At a tiny shape the host bounds the forward: kernels x host_op_us_forward plus views at
    half that."""
    counts = op_counts(LLAMA, "transformer")
    eff = H100.efficiency
    expected = eff.host_op_us_forward * (counts.forward_kernels + 0.5 * counts.forward_views) * 1e-6
    assert _block(CostOptions(), Shard(mbs=1, seq=64, tp=8)).forward_s == pytest.approx(expected)
