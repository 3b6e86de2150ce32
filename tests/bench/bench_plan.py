"""Search speed: three reference requests, timed end to end in-process (the job `planner plan` builds
for them: the runtime defaults and the memory headroom).

    taskset -c 0 python tests/bench/bench_plan.py            # one core, as the README's figures
    python tests/bench/bench_plan.py --repeats 3 --json

Prints per request the wall time (best and median of --repeats, each in a fresh process
state: the cost model's and the schedule and search caches are cleared), the candidates
considered and what happened to them, and the best plan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from planner.job import build
from planner.request import Request
from planner.schedule import registry, v_schedules
from planner.schedule.simulate import compile_schedule, generated_order
from planner.search import costing
from planner.search.search import search

REQUESTS = [
    # model, GPUs, global batch, seq, target seconds
    ("llama3-405b", 16384, 2048, 8192, 10.0),
    ("llama3-70b", 1024, 1024, 8192, 2.0),
    ("deepseek-v3", 2048, 4096, 4096, 10.0),  # MoE: EP x ETP in the space
]


def _clear_caches() -> None:
    compile_schedule.cache_clear()
    for cached in (
        generated_order,
        v_schedules._zbv_padded,
        costing.held_counts,
        costing._inflight,
        registry.head_rank,
        costing._expert_shards,
    ):
        cached.cache_clear()


def run(repeats: int) -> list[dict]:
    """Time each request; the best and the median of `repeats` cold runs."""
    rows = []
    for name, gpus, batch, seq, target in REQUESTS:
        times, result = [], None
        for _ in range(repeats):
            _clear_caches()
            model = build(Request(model=name, gpu="h100", num_gpus=gpus, global_batch=batch, seq=seq)).cost_model
            started = time.perf_counter()
            result = search(model, batch, seq)
            times.append(time.perf_counter() - started)
        top = result.plans[0]
        s = result.stats
        rows.append(
            {
                "request": f"{name} {gpus} x h100, batch {batch} x seq {seq}",
                "seconds": round(min(times), 2),
                "median_s": round(statistics.median(times), 2),
                "target_s": target,
                "candidates": s.candidates,
                "pruned_memory": s.pruned_memory,
                "pruned_bound": s.pruned_bound,
                "solved": s.solved,
                "layouts": s.layouts,
                "layouts_over_memory": s.out_of_memory,
                "layouts_pruned_bound": s.layouts_pruned_bound,
                "simulated": s.simulated,
                "best": f"tp{top.layout.tp} pp{top.layout.pp} dp{top.layout.dp} {top.layout.schedule} "
                f"V{top.layout.vpp} mbs{top.layout.mbs}{f' ep{top.layout.ep}' if top.layout.ep > 1 else ''}",
                "best_mfu": round(top.prediction.mfu, 4),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"{row['request']}: {row['seconds']:.2f} s best, {row['median_s']:.2f} s median "
            f"(target {row['target_s']:.0f} s), "
            f"{row['candidates']:,} candidates: {row['pruned_memory']:,} over memory by state, "
            f"{row['pruned_bound']:,} cut by the bound, {row['solved']:,} solved into {row['layouts']:,} layouts: "
            f"{row['layouts_over_memory']:,} over memory, {row['layouts_pruned_bound']:,} cut by the bound, "
            f"{row['simulated']:,} simulated; best {row['best']} MFU {row['best_mfu']:.1%}"
        )


if __name__ == "__main__":
    main()
