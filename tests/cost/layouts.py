"""Layouts the cost tests build again and again."""

from __future__ import annotations

from planner.layout import Layout, even_stage_layers
from planner.spec import ModelSpec


def even_1f1b(
    spec: ModelSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    mbs: int = 1,
    micro_batches: int,
    recompute: str = "none",
    sp: bool = False,
    zero: int = 1,
) -> Layout:
    """A 1F1B layout without virtual stages: even stages, one recompute mode on every rank."""
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=1,
        mbs=mbs,
        num_microbatches=micro_batches,
        schedule="1f1b",
        recompute=(recompute,) * pp,
        sequence_parallel=sp,
        zero_stage=zero,
        stage_layers=even_stage_layers(spec.num_layers, pp, 1, "1f1b"),
    )
