"""Builders of synthetic profile rows and profiles for the profiler tests."""

from __future__ import annotations

from planner.catalog import resolve_model
from planner.profile.schema import SCHEMA_VERSION, LayerRow, Profile


def ok_row(
    kind="transformer",
    tp=1,
    mbs=1,
    seq=1024,
    forward_ms=1.0,
    backward_input_ms=1.5,
    backward_weight_ms=1.0,
    activation_bytes=1000,
    recompute="none",
    **extra,
) -> LayerRow:
    """A complete "ok" row; the full backward is I + W unless given."""
    fields = dict(
        kind=kind,
        tp=tp,
        mbs=mbs,
        seq=seq,
        recompute=recompute,
        status="ok",
        forward_ms=forward_ms,
        backward_input_ms=backward_input_ms,
        backward_weight_ms=backward_weight_ms,
        backward_ms=backward_input_ms + backward_weight_ms,
        activation_bytes=activation_bytes,
        param_count=10,
    )
    fields.update(extra)
    return LayerRow(**fields)


def make_profile(rows=(), model="tiny-llama", device="cpu (x86_64)", device_type="cpu", **extra) -> Profile:
    """A profile of `model` holding `rows`."""
    fields = dict(
        schema_version=SCHEMA_VERSION,
        device=device,
        device_type=device_type,
        torch_version="2.13.0",
        dtype="bf16",
        warmup=1,
        repeats=3,
        model=resolve_model(model),
        rows=tuple(rows),
    )
    fields.update(extra)
    return Profile(**fields)
