"""What eager PyTorch moves in a Llama block (docs/accuracy_published.md section 16): the bytes
every non-matmul, non-attention aten op reads and writes, caught by a TorchDispatchMode, when
torchtitan's 2024-12 Llama 3 block runs eagerly in bf16 under its per-op SAC (forward, the
recomputation, backward), per token and per element of the three activation widths, against
the memory-bound bytes the cost model charges a block. Their ratio is the `elementwise_traffic`
the eager torchtitan rows carry."""

from __future__ import annotations

import math

import pytest

from planner.fidelity.published import cost_options, load_runs

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from tests.cost.llama_block import RUNS, block, bytes_per_element, checkpointed, inputs, traffic_ratio  # noqa: E402  (needs torch)

aten = torch.ops.aten
NO_KERNEL = {aten._unsafe_view, aten.new_empty_strided, aten.empty_strided, aten.empty, aten.empty_like}
"""Non-view ops that launch no kernel: a view by another name, and allocations."""
MATMUL = {aten.mm, aten.addmm, aten.bmm}
EAGER_ROWS = ("torchtitan-llama3-8b-fsdp8", "torchtitan-llama3-8b-fsdp128")
"""torchtitan rows run eagerly (no torch.compile), both with per-op SAC."""


def _moves_memory(func) -> bool:
    """Whether an aten op launches a memory-bound kernel: not a view (an output aliasing an input
    without writing it), not an allocation, not a matmul, not the attention op (charged apart)."""
    return not (
        func.is_view
        or func.overloadpacket in NO_KERNEL | MATMUL
        or func.overloadpacket.__name__.startswith("_scaled_dot_product")
    )


def _distinct(t) -> int:
    """Elements a tensor addresses: an expanded (stride-0) dimension reads the same memory again,
    so `repeat_kv`'s copy reads k and v once and `mean`'s gradient one value per token."""
    return math.prod(n for n, stride in zip(t.shape, t.stride()) if stride != 0)


class _KernelBytes(TorchDispatchMode):
    """Each memory-moving op's tensor inputs and outputs, as (elements, bytes per element, 1), by
    pass: the forward, then, once `backward` is set, the recomputation (grad mode on: the
    checkpoint re-runs the forward under enable_grad) and the backward (grad mode off). Below
    SAC's own mode, so the ops it serves from its cache are not seen."""

    def __init__(self):
        super().__init__()
        self.passes = {"forward": [], "recompute": [], "backward": []}
        self.backward = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _moves_memory(func):
            phase = "forward" if not self.backward else "recompute" if torch.is_grad_enabled() else "backward"
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.passes[phase] += [(_distinct(t), t.element_size(), 1) for t in tensors]
        return out


@pytest.fixture(scope="module")
def counted() -> dict[str, dict[str, float]]:
    """Bytes per element of each width, by pass, for one bf16 block under torchtitan's per-op SAC,
    run eagerly; only sizes are kept, so autograd's gradient handling is as it would be."""
    x, freqs_cis = inputs()
    layer = checkpointed(block().to(torch.bfloat16), "op")
    grad = torch.ones_like(x)
    mode = _KernelBytes()
    with mode:
        out = layer(x, freqs_cis)
        mode.backward = True
        out.backward(grad)
    return {phase: bytes_per_element(accesses) for phase, accesses in mode.passes.items()}


def test_the_eager_block_moves_what_section_16_counts(counted):
    """Per element: each RMSNorm 36 per h (upcast 6, pow 8, mean 4, scale 8, downcast 6, weight 4),
    residuals 6, RoPE 20 per q/k element (upcast 6, complex64 mul 8, downcast 6), repeat_kv's
    copies 2 per k/v and 2 per h each, SwiGLU 10 per MLP element. The recomputation stops after
    w2's input (early stop: the last residual is not re-run); the backward's norms are 92 per h
    each, the gradient sums of the residuals and of q/k/v 6 per h each."""
    assert counted == {
        "forward": {"h": 108, "kv": 24, "ffn": 10},
        "recompute": {"h": 102, "kv": 24, "ffn": 10},
        "backward": {"h": 238, "kv": 24, "ffn": 18},
    }


def test_eager_rows_carry_the_counted_traffic(counted):
    """Each eager torchtitan row's elementwise_traffic is the ratio counted on eager PyTorch's ops
    for its model, to the one decimal it is set to."""
    runs = {run.name: run for run in load_runs(RUNS)}
    for name in EAGER_ROWS:
        run = runs[name]
        assert cost_options(run).kernels.elementwise_traffic == round(traffic_ratio(run.model, *counted.values()), 1), (
            name
        )
