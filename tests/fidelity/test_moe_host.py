"""The experts' host-time measurement (planner/fidelity/moe_host.py): the shapes it takes from
the cost model, the charges it sets beside the measurement, and its CPU path."""

import tomllib
from pathlib import Path

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.moe import DEFAULT_IMBALANCE
from planner.cost.shapes import Shard
from planner.fidelity.moe_host import ExpertShapes, PassTimes, measure, model_charges, per_expert, report, shapes_of
from planner.spec import Cluster
from tests.cost.roofline import closed_form_gemm_s

PRESETS = Path(__file__).parents[2] / "planner" / "presets"


def _model(gpu: str, stragglers: bool = True) -> CostModel:
    cluster = Cluster.of(resolve_gpu(gpu), 256, gpus_per_node=8)
    return CostModel(resolve_model("qwen3-235b-a22b"), cluster, CostOptions.of(stragglers=stragglers))


def test_shapes_are_the_busiest_gpus_experts():
    """TP 4, EP 8, ETP 1, sequence 4096: each GPU routes 1,024 tokens to 8 experts each, and the
    8 GPUs of its EP group send it 8 x 1,024 x 8 / 128 x 16 = 8,192 copies for 16 experts, 512
    each on average, times the dropless imbalance prior on the busiest GPU."""
    shapes = shapes_of(_model("h100"), Shard(mbs=1, seq=4096, tp=4, sequence_parallel=True, ep=8, etp=1))
    assert shapes == ExpertShapes(
        experts=16, tokens_per_expert=round(512 * DEFAULT_IMBALANCE), hidden=4096, ffn=1536, gated=True
    )
    assert shapes.up_columns == 3072


def test_dense_models_have_no_experts():
    cluster = Cluster.of(resolve_gpu("h100"), 8)
    with pytest.raises(ValueError, match="no routed experts"):
        shapes_of(CostModel(resolve_model("llama3-8b"), cluster), Shard(mbs=1, seq=4096))


def test_charges_are_the_roofline_and_the_per_expert_op_count():
    """On an A100 (no GEMM table) each GEMM is the closed-form roofline; the host charge is the
    MoE layer's per-expert ops (presets) at the GPU's per-op host times (the slowest-GPU factor
    off: it scales the compute-bound rates, planner/cost/stragglers.py)."""
    model = _model("a100-80gb", stragglers=False)
    eff = model.analytic.eff
    shapes = ExpertShapes(experts=16, tokens_per_expert=629, hidden=4096, ffn=1536)

    def roofline(m, n, k, out_bytes=2.0):
        return closed_form_gemm_s(model.analytic, m, n, k, out_bytes)

    charges = model_charges(model, shapes)
    assert charges.gpu_forward_s == pytest.approx(roofline(629, 3072, 4096) + roofline(629, 4096, 1536))
    fp32_main_grad = 8.0  # Megatron's default: fused accumulation into fp32 main gradients
    assert charges.gpu_backward_s == pytest.approx(
        roofline(629, 4096, 3072)
        + roofline(4096, 3072, 629, fp32_main_grad)
        + roofline(629, 1536, 4096)
        + roofline(1536, 4096, 629, fp32_main_grad)
    )
    counts = tomllib.loads((PRESETS / "megatron_moe_counts.toml").read_text())["megatron-deepep"]["moe_layer"]
    assert charges.host_forward_s == pytest.approx(
        1e-6
        * (
            eff.host_op_us_forward * counts["forward_kernels_per_expert"]
            + eff.host_op_us_backward * counts["forward_cpp_per_expert"]
        )
    )
    assert charges.host_backward_s == pytest.approx(
        1e-6 * eff.host_op_us_backward * (counts["backward_kernels_per_expert"] + counts["backward_cpp_per_expert"])
    )


def test_per_expert_share_is_the_difference_over_the_added_experts():
    full = {"forward": PassTimes(1.0e-3, 0.8e-3, 1.5e-3), "backward": PassTimes(2.0e-3, None, None)}
    half = {"forward": PassTimes(0.6e-3, 0.5e-3, 0.9e-3), "backward": PassTimes(1.2e-3, None, None)}
    share = per_expert(full, half, experts=16)  # 16 against 8 local experts
    assert share["forward"].host_s == pytest.approx(0.4e-3 / 8)
    assert share["forward"].gpu_s == pytest.approx(0.3e-3 / 8)
    assert share["forward"].eager_s == pytest.approx(0.6e-3 / 8)
    assert share["backward"] == PassTimes(pytest.approx(0.8e-3 / 8), None, None)


def test_cpu_path_times_the_host_only():
    shapes = ExpertShapes(experts=4, tokens_per_expert=8, hidden=16, ffn=8)
    times = measure(shapes, "torch", "cpu", repeats=2, warmup=1)
    assert set(times) == {"forward", "backward"}
    for passed in times.values():
        assert passed.host_s > 0 and passed.gpu_s is None and passed.eager_s is None
    half = measure(ExpertShapes(experts=2, tokens_per_expert=8, hidden=16, ffn=8), "torch", "cpu", repeats=2, warmup=1)
    record = report(shapes, "torch", "cpu", times, half, model_charges(_model("h100"), shapes))
    assert record["shapes"]["experts"] == 4
    assert set(record) == {
        "impl",
        "device",
        "shapes",
        "measured",
        "measured_half_experts",
        "measured_per_expert",
        "model_per_expert",
    }


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="impl must be"):
        measure(ExpertShapes(experts=2, tokens_per_expert=4, hidden=8, ffn=4), "cutlass", "cpu", repeats=1)
