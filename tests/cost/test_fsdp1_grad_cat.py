"""FSDP1's gradient assembly (`CostOptions.data.fsdp1_grad_cat`): its parameters are views of a flat
parameter, so autograd's backward of that split concatenates the views' gradients into the flat
gradient. Counted on torch's own autograd, then checked in the step prediction."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import step
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.layout import Layout, even_stage_layers
from planner.predict import fsdp_root_params, predict
from planner.spec import Cluster

SEQ = 2048


class CopyTraffic(TorchDispatchMode):
    """Per concatenating op, the bytes it reads and writes."""

    def __init__(self):
        super().__init__()
        self.copied: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func).startswith("aten.cat"):
            self.copied[str(func)] = sum(t.nbytes for t in args[0]) + out.nbytes
        return out


def test_split_backward_reads_and_writes_each_gradient_element_once():
    """FSDP1's `_get_unflat_views_unaligned`: `torch.split(flat_param, numels)` then `.view(shape)`.
    The backward of a bf16 block of three parameters (two weights, a bias) writes the flat
    gradient with one cat: 2 x 2 bytes per element, `FSDP1_GRAD_CAT_READS_WRITES` x dtype bytes."""
    numels, shapes = [64 * 64, 32 * 64, 32], [(64, 64), (32, 64), (32,)]
    flat = torch.zeros(sum(numels), dtype=torch.bfloat16, requires_grad=True)
    w1, w2, bias = (t.view(s) for t, s in zip(torch.split(flat, numels), shapes))
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    loss = (x @ w1.t()).sum() + ((x @ w1.t()) @ w2.t() + bias).sum()
    with CopyTraffic() as traffic:
        loss.backward()
    assert list(traffic.copied) == ["aten.cat.default"]
    assert traffic.copied["aten.cat.default"] == step.FSDP1_GRAD_CAT_READS_WRITES * 2 * sum(numels)
    assert flat.grad.shape == flat.shape


def _model(gpus: int, **options) -> CostModel:
    return CostModel(resolve_model("mpt-7b"), Cluster.of(resolve_gpu("h100"), gpus), CostOptions.of(**options))


def _zero3(spec, dp: int, m: int, zero: int = 3) -> Layout:
    return Layout(
        tp=1,
        pp=1,
        dp=dp,
        vpp=1,
        mbs=1,
        num_microbatches=m,
        schedule="1f1b",
        recompute=("full",),
        sequence_parallel=False,
        zero_stage=zero,
        stage_layers=even_stage_layers(spec.num_layers, 1, 1, "1f1b"),
    )


def test_each_microbatch_assembles_every_units_gradient():
    """One cat per FSDP unit (each block and the root) per micro-batch over the rank's unsharded
    parameters, 4 bytes each in bf16, memory-bound."""
    model = _model(8, fsdp1_grad_cat=True)
    spec, m = model.spec, 3
    layout = _zero3(spec, 8, m)
    params = spec.num_layers * model.layer_costs("transformer", Shard(mbs=1, seq=SEQ)).param_count + fsdp_root_params(
        model, layout, 0
    )
    compute = model.analytic
    expected = params * m * 2 * 2 / compute.mem_bw + (spec.num_layers + 1) * m * compute.overhead_s
    assert predict(model, layout, 8 * m, SEQ).time_breakdown_s["fsdp_copies"] == pytest.approx(expected, rel=1e-9)


def test_only_zero3_with_the_option_pays_it():
    spec = resolve_model("mpt-7b")
    assert "fsdp_copies" not in predict(_model(8), _zero3(spec, 8, 2), 16, SEQ).time_breakdown_s
    assert (
        "fsdp_copies"
        not in predict(_model(8, fsdp1_grad_cat=True), _zero3(spec, 8, 2, zero=1), 16, SEQ).time_breakdown_s
    )
    with pytest.raises(ValueError, match="fsdp2 and fsdp1_grad_cat"):
        CostOptions.of(fsdp2=True, fsdp1_grad_cat=True)
