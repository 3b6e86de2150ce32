"""Predicted vs published nccl-tests bus bandwidth, per table and size.

    python tests/bench/collectives.py [--json]

Reads tests/data/nccl_tests.toml (published tables, each with its source) and prints, for
every point, the published busbw, the model's (planner/cost/comm), their relative error and the
algorithm the model picks; then the largest error in the bandwidth regime (published busbw
>= 90 % of the table's peak) and below it.
"""

from __future__ import annotations

import argparse
import json
import sys

from planner.catalog import resolve_gpu
from planner.cost.comm import Network, nccl
from planner.spec import Cluster
from tests.cost.test_nccl_tests import TABLES, _predicted_busbw


def _algorithm(table: dict, nbytes: float) -> str:
    if table.get("algorithm"):
        return table["algorithm"]
    n, k = table["ranks"], table["ranks_per_node"]
    f = Network.of(Cluster.of(resolve_gpu(table["gpu"]), n, **table.get("cluster", {}))).fabric
    times = {
        "ring": min(nccl.ring_all_reduce_us(f, nbytes, n, k, p) for p in range(3)),
        "tree": min(nccl.tree_all_reduce_us(f, nbytes, n, k, p) for p in range(3)),
        "nvls": nccl.nvls_all_reduce_us(f, nbytes, n, k),
    }
    return min(times, key=times.get)


def rows() -> list[dict]:
    """One row per published point."""
    out = []
    for table in TABLES:
        peak = max(busbw for _, busbw in table["points"])
        for nbytes, busbw in table["points"]:
            predicted = _predicted_busbw(table, nbytes)
            out.append(
                {
                    "table": table["name"],
                    "bytes": nbytes,
                    "published_busbw": busbw,
                    "predicted_busbw": round(predicted, 2),
                    "error": round(predicted / busbw - 1, 4),
                    "bandwidth_regime": busbw >= 0.9 * peak,
                    "algorithm": _algorithm(table, nbytes),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = rows()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    table = None
    for r in data:
        if r["table"] != table:
            table = r["table"]
            print(f"\n{table}\n{'bytes':>12} {'published':>10} {'predicted':>10} {'error':>8}  algorithm")
        print(
            f"{r['bytes']:>12} {r['published_busbw']:>10.2f} {r['predicted_busbw']:>10.2f} "
            f"{r['error']:>+8.1%}  {r['algorithm']}{'  (bandwidth regime)' if r['bandwidth_regime'] else ''}"
        )
    for regime, name in ((True, "bandwidth regime"), (False, "below it")):
        errors = [r["error"] for r in data if r["bandwidth_regime"] == regime]
        print(f"\n{name}: {len(errors)} points, error from {min(errors):+.1%} to {max(errors):+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
