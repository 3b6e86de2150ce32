"""The fp16 optimizer's cast of 16-bit gradients into fp32 main gradients and the DDP's copies
around the all-reduce (CostOptions `main_grad_cast`, `ddp_grad_copy_passes`): each adds its
memory-bound bytes over the rank's parameters to the step, appears in the breakdown only when
set, and leaves everything else unchanged."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import memory
from planner.cost.model import CostModel, CostOptions
from planner.predict import predict
from planner.spec import Cluster
from tests.cost.layouts import even_1f1b

SEQ = 2048


def _predict(tp, dp, zero, **options):
    spec = resolve_model("megatron-gpt-1.7b")
    model = CostModel(spec, Cluster.of(resolve_gpu("a100-80gb"), tp * dp), CostOptions.of(dtype="fp16", **options))
    layout = even_1f1b(spec, tp=tp, dp=dp, mbs=4, micro_batches=2, recompute="full", zero=zero)
    return model, predict(model, layout, dp * 8, SEQ)


def _rank_params(tp):
    """Parameters on one TP rank of the whole (PP 1) model: blocks, embedding, final norm (the
    head ties the embedding on the same rank)."""
    spec = resolve_model("megatron-gpt-1.7b")
    return (
        spec.num_layers * memory.transformer_param_count(spec, tp)
        + memory.embedding_param_count(spec, tp)
        + memory.head_param_count(spec, tp, shares_rank_with_embedding=True)
    )


@pytest.mark.parametrize(("tp", "dp", "zero", "owned_share"), [(1, 8, 0, 1.0), (2, 4, 0, 1.0), (1, 8, 1, 1 / 8)])
def test_main_grad_cast_reads_two_and_writes_four_bytes_per_owned_param(tp, dp, zero, owned_share):
    model, base = _predict(tp, dp, zero)
    _, cast = _predict(tp, dp, zero, main_grad_cast=True)
    assert "main_grad_cast" not in base.time_breakdown_s
    expected = _rank_params(tp) * owned_share * (2 + 4) / model.analytic.mem_bw
    assert cast.time_breakdown_s["main_grad_cast"] == pytest.approx(expected, rel=0.01)
    assert cast.step_time_s - base.step_time_s == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize(("passes", "grad_bytes"), [(2, 2), (3, 2), (2, 4)])
def test_ddp_copies_read_and_write_each_gradient_per_pass(passes, grad_bytes):
    model, base = _predict(1, 8, 0, grad_reduce_bytes=grad_bytes)
    _, copies = _predict(1, 8, 0, grad_reduce_bytes=grad_bytes, ddp_grad_copy_passes=passes)
    assert "ddp_grad_copies" not in base.time_breakdown_s
    expected = _rank_params(1) * passes * 2 * grad_bytes / model.analytic.mem_bw
    assert copies.time_breakdown_s["ddp_grad_copies"] == pytest.approx(expected, rel=0.01)
    assert copies.step_time_s - base.step_time_s == pytest.approx(expected, rel=0.01)
    assert sum(copies.time_breakdown_s.values()) == pytest.approx(copies.step_time_s, rel=1e-12)


def test_negative_copy_passes_are_refused():
    with pytest.raises(ValueError, match="ddp_grad_copy_passes"):
        CostOptions.of(ddp_grad_copy_passes=-1)
