"""How many ops each layer kind dispatches per micro-batch in eager PyTorch, and the host time
they take: the per-kernel floor of a layer's time.

The counts are data (planner/presets/kernel_counts.toml), traced from planner/torch_blocks.py
by scripts/count_kernels.py. A GPU runs a layer no faster than the host can launch its
kernels: eager PyTorch launches asynchronously, so host and GPU overlap and a layer takes
max(GPU time, host time), not their sum. At large shapes the GPU time dominates and the
floor changes nothing; at small per-GPU shapes (high TP, micro-batch 1, short sequences)
the host does. CUDA graphs replay the launches without the host (`CostOptions.kernels.cuda_graphs`),
leaving only the GPU-side per-kernel cost (`GpuEfficiency.kernel_overhead_us`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from planner.spec import GpuEfficiency, ModelSpec

DATA = Path(__file__).parents[1] / "presets" / "kernel_counts.toml"
MEGATRON_MOE_DATA = Path(__file__).parents[1] / "presets" / "megatron_moe_counts.toml"

STYLES: dict[str, tuple[str, dict]] = {
    "rmsnorm-swiglu-rope": ("tiny-llama", {}),
    "rmsnorm-swiglu-rope-qknorm": ("tiny-llama", {"qk_norm": True}),
    "layernorm-gelu-learned": ("tiny-gpt", {}),
    "layernorm-gelu-alibi": ("tiny-gpt", {"position_embedding": "alibi", "embedding_norm": True}),
}
"""Block styles traced, each from a preset model (with overrides): the model's norm,
activation and position embedding, and whether it normalises queries and keys (Qwen3's
QK-norm), decide which ops its block runs."""

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
    forward_cpp: int = 0
    """Ops issued from C++ without Python (DeepEP's allocations and kernels, TE's per-expert
    GEMMs): charged at the host's C++ per-op time, `host_op_us_backward`."""
    backward_cpp: int = 0


def style_of(spec: ModelSpec) -> str:
    """The block style key of a model: norm-activation-positions, then -qknorm with QK-norm."""
    return f"{spec.norm}-{spec.activation}-{spec.position_embedding}" + ("-qknorm" if spec.qk_norm else "")


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


@cache
def load_megatron_moe_counts() -> dict[str, dict[str, int]]:
    """Megatron-core's MoE layer counts (flex dispatcher on DeepEP) and the dense MLP they replace."""
    return tomllib.loads(MEGATRON_MOE_DATA.read_text())["megatron-deepep"]


def megatron_moe_block(dense: OpCounts, local_experts: int) -> OpCounts:
    """The ops of an MoE block as Megatron-core runs it with the flex (DeepEP) dispatcher, TE's
    fused permute and GroupedLinear: the traced block `dense` with its dense MLP's ops
    replaced by the MoE layer's, whose count grows with the rank's `local_experts`."""
    data = load_megatron_moe_counts()
    moe, mlp = data["moe_layer"], data["dense_mlp"]

    def layer(key: str) -> int:
        return moe[key] + moe.get(f"{key}_per_expert", 0) * local_experts

    return OpCounts(
        forward_kernels=dense.forward_kernels - mlp["forward_kernels"] + layer("forward_kernels"),
        forward_views=dense.forward_views - mlp["forward_views"] + layer("forward_views"),
        backward_kernels=dense.backward_kernels - mlp["backward_kernels"] + layer("backward_kernels"),
        backward_views=dense.backward_views - mlp["backward_views"] + layer("backward_views"),
        forward_cpp=dense.forward_cpp + layer("forward_cpp"),
        backward_cpp=dense.backward_cpp + layer("backward_cpp"),
    )


def host_times(counts: OpCounts, eff: GpuEfficiency) -> tuple[float, float]:
    """Host seconds to dispatch a layer's forward and its backward: Python-dispatched ops at the
    pass's per-op time (views at `VIEW_HOST_SHARE`), C++-issued ones at the C++ path's
    (`host_op_us_backward`: the same op without the Python call and binding)."""
    forward = (
        eff.host_op_us_forward * (counts.forward_kernels + VIEW_HOST_SHARE * counts.forward_views)
        + eff.host_op_us_backward * counts.forward_cpp
    )
    backward = eff.host_op_us_backward * (
        counts.backward_kernels + VIEW_HOST_SHARE * counts.backward_views + counts.backward_cpp
    )
    return forward * 1e-6, backward * 1e-6
