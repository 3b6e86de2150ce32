"""How many ops each layer kind dispatches per micro-batch in eager PyTorch, and the host time
they take: the per-kernel floor of a layer's time.

The counts are data (planner/presets/kernel_counts.toml), traced from planner/torch_blocks.py
by scripts/count_kernels.py. A GPU runs a layer no faster than the host can launch its
kernels: eager PyTorch launches asynchronously, so host and GPU overlap and a layer takes
max(GPU time, host time), not their sum. At large shapes the GPU time dominates and the
floor changes nothing; at small per-GPU shapes (high TP, micro-batch 1, short sequences)
the host does. CUDA graphs replay the launches without the host (`CostOptions.cuda_graphs`),
leaving only the GPU-side per-kernel cost (`GpuEfficiency.kernel_overhead_us`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from planner.spec import GpuEfficiency, ModelSpec

DATA = Path(__file__).parents[1] / "presets" / "kernel_counts.toml"

STYLES: dict[str, tuple[str, dict]] = {
    "rmsnorm-swiglu-rope": ("tiny-llama", {}),
    "layernorm-gelu-learned": ("tiny-gpt", {}),
    "layernorm-gelu-alibi": ("tiny-gpt", {"position_embedding": "alibi", "embedding_norm": True}),
}
"""Block styles traced, each from a preset model (with overrides): the model's norm,
activation and position embedding decide which ops its block runs."""

VIEW_HOST_SHARE = 0.5
"""Share of an op's host time that an aliasing op (view, transpose, detach) also pays:
Python, binding, autograd and dispatcher, but no kernel selection and no launch (about half
of the per-op breakdown cited for `host_op_us_forward` in presets/gpus.toml)."""

UNFUSED_EXTRA_KERNELS = {"forward": 2, "backward": 4}
"""Unfused attention replaces the fused kernel (one each way) with QK^T, softmax and PV in the
forward (+2) and four batched GEMMs and the softmax backward in the backward (+4); dropout
adds one more kernel each way."""


@dataclass(frozen=True, slots=True)
class OpCounts:
    """Ops of one layer kind, one micro-batch."""

    forward_kernels: int
    forward_views: int
    backward_kernels: int
    backward_views: int


def style_of(spec: ModelSpec) -> str:
    """The block style key of a model: norm-activation-positions."""
    return f"{spec.norm}-{spec.activation}-{spec.position_embedding}"


@cache
def load_counts() -> dict[str, dict[str, dict[str, int]]]:
    """The traced counts, per style and layer kind."""
    return tomllib.loads(DATA.read_text())


def op_counts(spec: ModelSpec, kind: str, unfused_attention: bool = False, dropout: bool = False) -> OpCounts:
    """Ops `kind` dispatches for `spec`, from the traced style it matches (its family's when
    its exact style was not traced)."""
    counts = load_counts()
    style = style_of(spec)
    if style not in counts:
        style = "rmsnorm-swiglu-rope" if spec.family == "llama" else "layernorm-gelu-learned"
    row = OpCounts(**counts[style][kind])
    if kind != "transformer" or not unfused_attention:
        return row
    extra = int(dropout)
    return OpCounts(
        forward_kernels=row.forward_kernels + UNFUSED_EXTRA_KERNELS["forward"] + extra,
        forward_views=row.forward_views,
        backward_kernels=row.backward_kernels + UNFUSED_EXTRA_KERNELS["backward"] + extra,
        backward_views=row.backward_views,
    )


def host_times(counts: OpCounts, eff: GpuEfficiency) -> tuple[float, float]:
    """Host seconds to dispatch a layer's forward and its backward."""
    forward = eff.host_op_us_forward * (counts.forward_kernels + VIEW_HOST_SHARE * counts.forward_views)
    backward = eff.host_op_us_backward * (counts.backward_kernels + VIEW_HOST_SHARE * counts.backward_views)
    return forward * 1e-6, backward * 1e-6
