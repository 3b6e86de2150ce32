"""Count the ops each layer kind dispatches in its forward and backward, as eager PyTorch
runs `planner/torch_blocks.py`, and write planner/presets/kernel_counts.toml.

    PYTHONPATH=. python scripts/count_kernels.py [--check]

The block runs in bf16 on the CPU under a TorchDispatchMode that sees every ATen op. An op whose
outputs alias its inputs (view, transpose, detach, ...) costs host time but launches no
kernel; any other op that returns a tensor launches one kernel on a GPU. Two CPU/GPU
differences are removed so the counts are those of a CUDA run: RMSNorm is one fused kernel
each way on CUDA (`aten._fused_rms_norm` and its backward), where the CPU decomposes it, so
the script traces the norm as one opaque op; SDPA is one flash kernel each way on both.
`--check` compares the file with a fresh trace instead of writing it (tests/cost runs it).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planner.catalog import resolve_model
from planner.cost.kernel_counts import DATA, STYLES, load_counts, style_of
from planner.torch_blocks import BlockConfig, Embedding, Head, RMSNorm, TransformerBlock

TRACE_SEQ = 16
TRACE_MBS = 2


@torch.library.custom_op("kernelcount::fused_rms_norm", mutates_args=())
def _fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


@torch.library.custom_op("kernelcount::fused_rms_norm_backward", mutates_args=())
def _fused_rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> list[torch.Tensor]:
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    normed, grad_normed = x * rstd, grad * weight
    dx = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
    return [dx, (grad * normed).flatten(0, -2).sum(0)]


def _setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = _fused_rms_norm_backward(grad, x, weight, ctx.eps)
    return dx, dw, None


_fused_rms_norm.register_autograd(_backward, setup_context=_setup)


class _FusedRMSNorm(RMSNorm):
    """RMSNorm as one op each way, as `nn.RMSNorm` runs on CUDA."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return _fused_rms_norm(x, self.weight, eps)


def op_kind(func, out) -> str | None:
    """ "view" for an op whose outputs alias its inputs, "kernel" for any other op that returns a
    tensor, None for the rest (no GPU work)."""
    schema = func._schema
    aliases = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    if aliases or func.is_view or "_unsafe_view" in schema.name:
        return "view"
    if any(isinstance(t, torch.Tensor) for t in torch.utils._pytree.tree_leaves(out)):
        return "kernel"
    return None


class _OpCounter(TorchDispatchMode):
    """Counts kernel-launching ops and aliasing (view) ops."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = op_kind(func, out)
        if kind == "view":
            self.views += 1
        elif kind == "kernel":
            self.kernels += 1
        return out


def _fuse_norms(module: torch.nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, RMSNorm):
            fused = _FusedRMSNorm(child.normalized_shape, eps=child.eps)
            fused.load_state_dict(child.state_dict())
            setattr(module, name, fused)
        else:
            _fuse_norms(child)


def count_layer(cfg: BlockConfig, kind: str) -> dict[str, int]:
    """Kernels and views of one layer kind's forward and backward (loss excluded)."""
    torch.manual_seed(0)
    layer = {"transformer": TransformerBlock, "embedding": Embedding, "head": Head}[kind](cfg)
    _fuse_norms(layer)
    layer.to(torch.bfloat16)
    if kind == "embedding":
        x = torch.randint(0, cfg.vocab_size, (TRACE_MBS, TRACE_SEQ))
    else:
        x = torch.randn(TRACE_MBS, TRACE_SEQ, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    return count_module(layer, x)


def count_module(module: torch.nn.Module, x: torch.Tensor) -> dict[str, int]:
    """Kernels and views of `module`'s forward on `x` and of its backward from a random gradient."""
    forward, backward = _OpCounter(), _OpCounter()
    with forward:
        out = module(x)
    grad = torch.randn_like(out)
    with backward:
        out.backward(grad)
    return {
        "forward_kernels": forward.kernels,
        "forward_views": forward.views,
        "backward_kernels": backward.kernels,
        "backward_views": backward.views,
    }


def trace_all() -> dict[str, dict[str, dict[str, int]]]:
    """Counts per block style and layer kind."""
    counts = {}
    for style, (model, overrides) in STYLES.items():
        spec = resolve_model(model).model_copy(update=overrides)
        assert style_of(spec) == style, (style, style_of(spec))
        cfg = BlockConfig(**spec.block_fields(1, TRACE_SEQ))
        counts[style] = {kind: count_layer(cfg, kind) for kind in ("embedding", "transformer", "head")}
    return counts


def render(counts: dict[str, dict[str, dict[str, int]]]) -> str:
    """The TOML file's text."""
    lines = [
        "# Ops per layer kind that eager PyTorch dispatches for planner/torch_blocks.py, one micro-batch,",
        "# per block style (norm-activation-positions, -qknorm with QK-norm). Generated by scripts/count_kernels.py (torch "
        f"{torch.__version__.split('+')[0]});",
        "# tests/cost/test_kernel_counts.py regenerates and compares. kernels: ops that launch a GPU kernel;",
        "# views: aliasing ops (host time only). The head's count excludes the loss.",
        "",
    ]
    for style, kinds in counts.items():
        for kind, values in kinds.items():
            lines.append(f'["{style}".{kind}]')
            lines += [f"{key} = {value}" for key, value in values.items()]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the file, do not write")
    args = parser.parse_args(argv)
    counts = trace_all()
    if args.check:
        same = load_counts() == counts
        print("kernel counts match" if same else f"{DATA} differs from a fresh trace")
        return 0 if same else 1
    DATA.write_text(render(counts))
    print(f"wrote {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
