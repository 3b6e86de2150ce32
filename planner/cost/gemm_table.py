"""Measured GEMM throughput by shape: a table of (m, n, k) -> FLOP/s read from a preset
data file (planner/presets/gemm_*.toml), interpolated for the shapes between its points.

The file holds single GEMMs (`points`: m, n, k, TFLOP/s) and optionally batched ones
(`batched`: b, m, n, k, TFLOP/s), read as one GEMM of b*m rows (the same tiles; the batched
kernel only lacks the reuse of B across all rows). Together they must cover a full grid:
every combination of the m values, the n values and the k values present. Between grid
values the rate is interpolated linearly in (log2 m, log2 n, log2 k) on log(rate) (a GEMM's
throughput grows roughly geometrically with each dimension until its tiles fill the GPU).
Beyond the grid:

- above the largest value a dimension keeps the rate at that edge (the GEMM has saturated:
  tests/cost/test_gemm_table.py checks the data file's edge against an independent maximum);
- below the smallest value a dimension keeps the time of the smallest: a tile is at least
  as wide as the grid's smallest value, so fewer rows or columns do not make the kernel
  shorter (the rate falls in proportion to the dimension).
"""

from __future__ import annotations

import bisect
import math
import tomllib
from dataclasses import dataclass, field
from functools import cache

from planner.errors import ConfigError
from planner.presets import read_table


@dataclass(frozen=True, slots=True)
class GemmTable:
    """Measured FLOP/s of one GEMM per (m, n, k) on a full grid, for one dtype."""

    name: str
    dtype: str
    grids: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    """The m, n and k values of the grid, ascending."""
    log_rates: dict[tuple[int, int, int], float]
    """log(FLOP/s) at each grid point."""
    source: str
    _memo: dict[tuple[int, int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def measured(self, m: int, n: int, k: int) -> float:
        """FLOP/s the table records at a grid point."""
        return math.exp(self.log_rates[(m, n, k)])

    def rate(self, m: int, n: int, k: int) -> float:
        """FLOP/s of an (m x k) @ (k x n) GEMM, interpolated from the table (module docstring)."""
        key = (m, n, k)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._interpolate(m, n, k)
        return cached

    def _interpolate(self, m: int, n: int, k: int) -> float:
        shrink = 1.0  # below the grid: the smallest value's time, so a proportionally lower rate
        brackets = []
        for x, grid in zip((m, n, k), self.grids):
            if x < grid[0]:
                shrink *= x / grid[0]
            brackets.append(_bracket(grid, max(x, grid[0])))
        (m0, m1, wm), (n0, n1, wn), (k0, k1, wk) = brackets
        log_rate = 0.0
        for gm, fm in ((m0, 1 - wm), (m1, wm)):
            for gn, fn in ((n0, 1 - wn), (n1, wn)):
                for gk, fk in ((k0, 1 - wk), (k1, wk)):
                    weight = fm * fn * fk
                    if weight:
                        log_rate += weight * self.log_rates[(gm, gn, gk)]
        return math.exp(log_rate) * shrink


def _bracket(grid: tuple[int, ...], x: float) -> tuple[int, int, float]:
    """The grid values around x and x's position between them in log2 (held at the top)."""
    if x >= grid[-1]:
        return grid[-1], grid[-1], 0.0
    hi = bisect.bisect_right(grid, x)
    g0, g1 = grid[hi - 1], grid[hi]
    return g0, g1, math.log2(x / g0) / math.log2(g1 / g0)


@cache
def load_gemm_table(file_name: str) -> GemmTable:
    """The table in planner/presets/`file_name` (read once per process)."""
    return parse_gemm_table(read_table(file_name, "GEMM"), file_name)


def parse_gemm_table(text: str, name: str) -> GemmTable:
    """The table a GEMM table file's `text` holds (ConfigError unless it is a full grid)."""
    data = tomllib.loads(text)
    rows = [(1, *point) for point in data["points"]] + [tuple(row) for row in data.get("batched", [])]
    rates: dict[tuple[int, int, int], float] = {}
    for b, m, n, k, tflops in rows:
        key = (int(b) * int(m), int(n), int(k))
        if tflops <= 0 or key in rates:
            raise ConfigError(f"GEMM table '{name}': non-positive or repeated rate at {key}")
        rates[key] = math.log(tflops * 1e12)
    grids = tuple(tuple(sorted({key[axis] for key in rates})) for axis in range(3))
    if len(rates) != len(grids[0]) * len(grids[1]) * len(grids[2]):
        raise ConfigError(f"GEMM table '{name}' is not a full grid over m {grids[0]}, n {grids[1]}, k {grids[2]}")
    return GemmTable(name=name, dtype=data["dtype"], grids=grids, log_rates=rates, source=data["source"])
