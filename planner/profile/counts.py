"""What a layer's passes compute, counted instead of timed: FLOPs and operators per phase.

FLOPs come from the formulas of `torch.utils.flop_counter` (its `flop_registry`: matrix
multiplies and the attention kernels it knows, CUDA's flash / memory-efficient / cuDNN
attention; CPU's flash attention has none, so on a CPU attention is not in the count),
applied to every operator dispatched: FlopCounterMode itself tracks modules with autograd
hooks that activation checkpointing's recomputation inside `autograd.grad` refuses. Operators are
the ATen operators dispatched, views excluded: on a GPU, about the kernels launched (an
upper bound: some operators launch none, fused ones one for several). Both are properties
of the code, not of the machine's speed, so tests can compare them exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

PHASES = ("forward", "backward_input", "backward_weight", "backward")


class _Counter(TorchDispatchMode):
    """Counts the non-view ATen operators dispatched inside it and their FLOPs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view:
            self.ops += 1
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None:
            self.flops += _formula_flops(formula, args, kwargs, out)
        return out


def _formula_flops(formula, args, kwargs, out) -> int:
    """`formula`'s FLOPs for one operator. Grouped-query attention (fewer key/value heads than
    query heads, `enable_gqa`) counts as its query heads attending: torch releases whose attention
    formulas assert equal head counts are given key and value shapes widened to the query's."""
    try:
        return formula(*args, **kwargs, out_val=out)
    except AssertionError:
        return formula(*_heads_widened(args), **kwargs, out_val=out)


def _heads_widened(args: tuple) -> tuple:
    """`args` with every (batch, heads, seq, dim) tensor of fewer heads than the most, that
    divide it, replaced by a shape-only tensor of the most heads."""
    four_d = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 4]
    heads = max((a.shape[1] for a in four_d), default=0)

    def widen(a):
        if isinstance(a, torch.Tensor) and a.dim() == 4 and a.shape[1] < heads and heads % a.shape[1] == 0:
            return torch.empty(a.shape[0], heads, *a.shape[2:], device="meta", dtype=a.dtype)
        return a

    return tuple(widen(a) for a in args)


class PhaseCounter:
    """FLOPs and operator counts of named phases (`PHASES`)."""

    def __init__(self) -> None:
        self.flops: dict[str, int] = {}
        self.ops: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count what runs inside the block as phase `name`."""
        assert name in PHASES, name
        counter = _Counter()
        with counter:
            yield
        self.flops[name] = self.flops.get(name, 0) + counter.flops
        self.ops[name] = self.ops.get(name, 0) + counter.ops

    def fields(self) -> dict[str, int]:
        """`<phase>_flops` and `<phase>_ops` for every phase (0 where it did not run)."""
        out = {}
        for name in PHASES:
            out[f"{name}_flops"] = self.flops.get(name, 0)
            out[f"{name}_ops"] = self.ops.get(name, 0)
        return out
