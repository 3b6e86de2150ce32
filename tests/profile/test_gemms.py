"""The GEMM table sweep (planner/profile/gemms.py, scripts/measure_gemm_table.py) on a CPU: the
file it writes is a full grid the cost model's own parser reads, a rerun measures only what is
missing, and the fp8 call multiplies what it is given."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.cost.gemm_table import parse_gemm_table  # noqa: E402
from planner.profile.gemms import gemm_call, read_points, shapes, tflops  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measure_gemm_table.py"


def _script():
    spec = importlib.util.spec_from_file_location("measure_gemm_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sweep(out: Path, dtype: str, m: str = "16,32") -> None:
    args = ["--dtype", dtype, "-o", str(out), "--device", "cpu", "--m", m, "--n", "16,32", "--k", "16,32"]
    assert _script().main([*args, "--warmup", "1", "--repeats", "2", "--rounds", "1"]) == 0


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_the_written_file_is_a_full_grid_the_cost_model_reads(tmp_path, dtype):
    out = tmp_path / f"gemm_{dtype}.toml"
    _sweep(out, dtype)
    table = parse_gemm_table(out.read_text(), out.name)
    assert table.dtype == dtype
    assert table.grids == ((16, 32), (16, 32), (16, 32))
    assert all(table.measured(*shape) > 0 for shape in shapes((16, 32), (16, 32), (16, 32)))


def test_a_rerun_measures_only_the_missing_shapes(tmp_path):
    out = tmp_path / "gemm.toml"
    _sweep(out, "bf16")
    first = read_points(out.read_text())
    _sweep(out, "bf16", m="16,32,64")
    second = read_points(out.read_text())
    assert len(second) == 12
    assert {shape: second[shape] for shape in first} == first  # the measured ones are kept as they were


def test_the_fp8_call_multiplies_its_operands_in_the_tn_layout():
    """C = A @ B with B passed column-major: the product of the fp8-rounded operands."""
    torch.manual_seed(0)
    out = gemm_call(32, 48, 64, "fp8", "cpu")()
    torch.manual_seed(0)  # the same draws, in the order gemm_call makes them: A (m x k), then B as n x k
    a, b_t = torch.randn(32, 64), torch.randn(48, 64)
    expected = a.to(torch.float8_e4m3fn).float() @ b_t.to(torch.float8_e4m3fn).float().t()
    assert out.shape == (32, 48) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-1)


def test_rate_is_two_m_n_k_over_the_time():
    assert tflops((1024, 2048, 4096), 1e-3) == pytest.approx(2 * 1024 * 2048 * 4096 / 1e-3 / 1e12, rel=1e-3)


def test_shapes_run_smallest_first():
    order = list(shapes((16, 64), (16,), (32, 16)))
    volumes = [m * n * k for m, n, k in order]
    assert volumes == sorted(volumes) and len(order) == 4
