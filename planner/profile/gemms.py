"""Measure a GEMM throughput table by shape on this device, in the format the analytic compute
model reads (planner/cost/gemm_table.py): bf16 (`torch.mm`) or fp8 (`torch._scaled_mm`: e4m3
operands, the second one column-major as Hopper's FP8 GEMMs take it (the "TN" layout),
per-tensor scales, bf16 output, as Transformer Engine and torchao call it).

Each shape runs `warmup` untimed GEMMs, then `rounds` batches of `repeats` back-to-back GEMMs,
each batch timed as a whole (CUDA events on a GPU, perf_counter on a CPU); the rate is 2mnk over
the median batch's time per GEMM: a burst measurement, the regime of OpenXLA's table (the
GPU presets' `sustained_compute` is the factor to a training run's clock). The caller writes the
file after each shape, so an interrupted sweep resumes where it stopped (`read_points`).
"""

from __future__ import annotations

import statistics
import time
import tomllib
from collections.abc import Callable, Iterator
from itertools import product
from typing import Any

GEMM_DTYPES = ("bf16", "fp8")
DEFAULT_DIMS = (256, 512, 1024, 2048, 4096, 8192, 16384)
"""Each of m, n and k by default: from one tile to past every linear of the preset models."""
Shape = tuple[int, int, int]


def gemm_call(m: int, n: int, k: int, dtype: str, device: str) -> Callable[[], Any]:
    """One (m x k) @ (k x n) GEMM in `dtype` on `device`, its operands allocated once."""
    import torch

    if dtype not in GEMM_DTYPES:
        raise ValueError(f"dtype must be one of {GEMM_DTYPES}, got {dtype!r}")
    a = torch.randn(m, k, device=device)
    b_t = torch.randn(n, k, device=device)
    if dtype == "bf16":
        a16, b16 = a.to(torch.bfloat16), b_t.to(torch.bfloat16).t()
        return lambda: torch.mm(a16, b16)
    a8, b8 = a.to(torch.float8_e4m3fn), b_t.to(torch.float8_e4m3fn).t()  # b8: k x n, column-major
    one = torch.tensor(1.0, device=device)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def seconds_per_gemm(call: Callable[[], Any], device: str, warmup: int, repeats: int, rounds: int) -> float:
    """Median over `rounds` batches of `repeats` back-to-back calls of the seconds per call."""
    import torch

    cuda = device.startswith("cuda")
    for _ in range(warmup):
        call()
    times = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
            times.append(timed_batch(call, repeats))
        else:
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            times.append((time.perf_counter() - start) / repeats)
    return statistics.median(times)


def timed_batch(call: Callable[[], Any], repeats: int) -> float:
    """Seconds per call over `repeats` back-to-back calls on the current CUDA stream, timed by
    CUDA events."""
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        call()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / repeats


def shapes(ms: tuple[int, ...], ns: tuple[int, ...], ks: tuple[int, ...]) -> Iterator[Shape]:
    """Every (m, n, k) of the grid, the largest GEMMs last."""
    return iter(sorted(product(ms, ns, ks), key=lambda s: (s[0] * s[1] * s[2], s)))


def tflops(shape: Shape, seconds: float) -> float:
    """TFLOP/s of one GEMM of `shape` taking `seconds`, to four significant digits."""
    m, n, k = shape
    return float(f"{2.0 * m * n * k / seconds / 1e12:.4g}")


def read_points(text: str) -> dict[Shape, float]:
    """The measured points of a table file written by `table_toml`."""
    data = tomllib.loads(text)
    return {(int(m), int(n), int(k)): float(rate) for m, n, k, rate in data.get("points", [])}


def table_toml(points: dict[Shape, float], dtype: str, source: str, environment: dict[str, str]) -> str:
    """A GEMM table file (planner/cost/gemm_table.py's format) of the measured `points`."""
    head = [
        f"# Measured {dtype} GEMM throughput by shape (planner/profile/gemms.py).",
        *(f"# {key}: {value}" for key, value in environment.items()),
        "",
        f'source = "{source}"',
        f'dtype = "{dtype}"',
        "",
        "# [m, n, k, TFLOP/s]: C[m, n] = A[m, k] @ B[k, n]",
        "points = [",
    ]
    rows = [f"  [{m}, {n}, {k}, {rate}]," for (m, n, k), rate in sorted(points.items())]
    return "\n".join([*head, *rows, "]", ""])
