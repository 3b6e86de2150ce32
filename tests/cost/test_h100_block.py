"""Transformer blocks measured on one H100 SXM, kernel by kernel (tests/data/h100_measured/,
scripts/kernel_times.py): their GEMM kernels run at the rates the H100 preset's GEMM table gives
them in a burst, so the table needs no factor of its own inside a training layer.

Each file holds every CUDA kernel's milliseconds in one forward and one full backward of a block
of planner/torch_blocks.py (torch 2.11 eager, bf16). The GEMM kernels are cuBLAS's (`nvjet`);
attention ran cuDNN's SDPA kernel; the rest is the eager block's elementwise kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.shapes import Shard, layer_work
from planner.profile.schema import ShapeKey
from planner.profile.store import load
from scripts.kernel_times import kernel_group
from tests.cost.burst_rates import burst_rates

MEASURED = Path(__file__).parents[1] / "data" / "h100_measured"

BLOCKS = sorted(p for p in MEASURED.glob("kernels-*.json") if "-head-" not in p.name)
GEMM_TOLERANCE = 0.05
"""Run-to-run spread of a kernel's time plus the table's interpolation between its shapes."""


def _kernel_ms(path: Path) -> tuple[dict, dict[tuple[str, str], float]]:
    """The file's header and its milliseconds summed by (phase, component)."""
    data = json.loads(path.read_text())
    sums: dict[tuple[str, str], float] = {}
    for phase, kernels in data["phases"].items():
        for name, ms in kernels.items():
            key = (phase, kernel_group(name))
            sums[key] = sums.get(key, 0.0) + ms
    return data, sums


def test_the_measured_blocks_are_transformer_blocks_on_an_h100():
    assert len(BLOCKS) >= 5
    for path in BLOCKS:
        data, sums = _kernel_ms(path)
        assert data["kind"] == "transformer" and "H100" in data["device"]
        assert sums[("forward", "gemm")] > 0 and sums[("backward", "gemm")] > 0


@pytest.mark.parametrize("path", BLOCKS, ids=lambda p: p.stem)
def test_gemm_kernels_run_at_the_tables_burst_rates(path):
    data, sums = _kernel_ms(path)
    work = layer_work(
        resolve_model(data["model"]), "transformer", Shard(mbs=data["mbs"], seq=data["seq"], tp=data["tp"])
    )
    times = AnalyticCompute(burst_rates("h100"), "bf16").gemms_times(work.gemms)
    assert times.forward_s * 1e3 == pytest.approx(sums[("forward", "gemm")], rel=GEMM_TOLERANCE)
    backward = (times.backward_input_s + times.backward_weight_s) * 1e3
    assert backward == pytest.approx(sums[("backward", "gemm")], rel=GEMM_TOLERANCE)


def test_kernels_fit_inside_the_timed_passes_of_the_same_block():
    """The kernel sums of the largest llama3-8b block stay below `planner profile`'s timed
    forward and backward of it (the host's gaps between kernels), within a few percent."""
    data, sums = _kernel_ms(MEASURED / "kernels-llama3-8b-tp8-mbs4-seq8192.json")
    row = load(MEASURED / "h100-llama3-8b.json").row_map()[ShapeKey("transformer", 8, 4, 8192, "none")]
    for phase, timed in (("forward", row.forward_ms), ("backward", row.backward_ms)):
        kernels = sum(ms for (p, _), ms in sums.items() if p == phase)
        assert 0.9 * timed <= kernels <= timed, phase
