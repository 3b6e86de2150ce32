"""Simulator throughput at P=64, M=512, V=2 (a script, not a test): prints actions/s.

    python tests/bench/bench_simulate.py [--repeat N]

"cold" generates, validates and compiles the order, then simulates (a new shape);
"warm" re-costs an already compiled shape (what a search loop does for each candidate).
Each figure is the best of --repeat runs (the least disturbed by other load).
"""

from __future__ import annotations

import argparse
import time

from planner.schedule import StageCosts, compile_order, generate, simulate


def _best(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is printed")
    args = parser.parse_args()
    pp, m, vpp = 64, 512, 2
    costs = StageCosts.uniform(pp, vpp, 1e-3, 1e-3, 1e-3, p2p=1e-4)
    print(f"P={pp} M={m} V={vpp}, best of {args.repeat}")
    for name in ("interleaved_1f1b", "zb_h1", "zbv"):
        t_gen, order = _best(args.repeat, lambda name=name: generate(name, pp, m, vpp))
        t_compile, compiled = _best(args.repeat, lambda order=order: compile_order(order))
        t_sim, result = _best(args.repeat, lambda compiled=compiled: simulate(compiled, costs))
        actions = sum(len(a) for a in order.values())
        cold = t_gen + t_compile + t_sim
        print(
            f"{name:17s} {actions:7d} actions | warm simulate {t_sim * 1e3:6.1f} ms = {actions / t_sim:>11,.0f} "
            f"actions/s | cold {cold:.3f} s (generate {t_gen:.3f} + compile {t_compile:.3f} + simulate "
            f"{t_sim:.3f}) = {actions / cold:>9,.0f} actions/s | bubble {result.bubble_fraction:.4f}"
        )


if __name__ == "__main__":
    main()
