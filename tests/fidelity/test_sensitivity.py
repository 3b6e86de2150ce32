"""The global factors' ranges (planner/presets/factor_ranges.toml) and the sensitivity helper
that evaluates the published runs with one factor moved (planner/fidelity/sensitivity.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.catalog import gpu_presets, resolve_gpu
from planner.cost.options import CostOptions
from planner.fidelity.published import evaluate_run, load_runs, summarize
from planner.fidelity.sensitivity import (
    ALL_PRESETS,
    gpu_with,
    load_factor_ranges,
    result_with,
    sensitivity,
)
from planner.spec import GpuEfficiency

RUNS = Path(__file__).parents[1] / "bench" / "published_runs.toml"
FACTORS = load_factor_ranges()
CHEAP_RUNS = (
    "mosaic-mpt-7b-h100-8gpu",
    "mosaic-mpt-30b-h100-32gpu",
    "torchtitan-llama3-8b-fsdp8",
    "megatron-sc21-gpt-1.7b",
)
"""A few quick runs: two on presets the H100 SXM's sustained_compute acts on, two it leaves as is."""


def factor(name: str, preset: str):
    return next(f for f in FACTORS if f.name == name and preset in f.applies_to)


@pytest.mark.parametrize("f", FACTORS, ids=lambda f: f.label)
def test_each_factor_names_a_source_and_holds_its_default_within_its_range(f):
    assert f.source.strip()
    assert f.contains_default(), f"default {f.default} outside [{f.low}, {f.high}]"
    if not f.has_range:
        assert f.low == f.high == f.default


@pytest.mark.parametrize("f", FACTORS, ids=lambda f: f.label)
def test_each_default_is_the_value_the_model_holds(f):
    if f.is_option:
        assert f.applies_to == (ALL_PRESETS,)
        held = CostOptions().flat()[f.attribute]
        if held is None:  # the cost option defers to each GPU preset's own field
            assert {getattr(gpu, f.attribute) for gpu in gpu_presets().values()} == {f.default}
        else:
            assert held == f.default
        return
    assert f.attribute in GpuEfficiency.model_fields
    for preset in f.applies_to:
        assert getattr(resolve_gpu(preset).efficiency, f.attribute) == f.default, preset
    assert set(f.measured_on) <= set(f.applies_to)


def test_every_preset_has_one_table_per_gpu_factor():
    for name in {f.name for f in FACTORS if not f.is_option}:
        covered = [p for f in FACTORS if f.name == name for p in f.applies_to]
        assert len(covered) == len(set(covered)), name


def test_a_factor_scales_the_rates_that_carry_it():
    cap = factor("gemm_table_scale", "h100-96gb")
    gpu = resolve_gpu("h100-96gb")
    moved = gpu_with(gpu, cap, 1.0)
    assert moved.efficiency.gemm_table_scale == 1.0
    assert moved.efficiency.attention_fwd == pytest.approx(gpu.efficiency.attention_fwd / 0.92)
    assert moved.efficiency.sustained_compute == gpu.efficiency.sustained_compute
    assert resolve_gpu("h100-96gb").efficiency.gemm_table_scale == 0.92


def test_at_its_default_a_factor_reproduces_the_published_errors_exactly():
    runs = [r for r in load_runs(RUNS) if r.name in CHEAP_RUNS]
    defaults = [evaluate_run(r) for r in runs]
    scale = factor("sustained_compute", "h100")
    [row] = sensitivity(runs, [scale])
    assert row.runs_moved == 2
    assert row.at_low.mean_signed > row.at_default.mean_signed > row.at_high.mean_signed  # slower rates, longer steps
    assert row.at_default == summarize(defaults)
    imbalance = next(f for f in FACTORS if f.name == "moe_imbalance")
    for f in (scale, imbalance):
        assert [result_with(r, f, f.default).step_error for r in runs] == [d.step_error for d in defaults]
