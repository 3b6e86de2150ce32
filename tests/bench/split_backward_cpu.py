"""Zero-bubble split backward on CPU: I + W against the one-call backward, timed.

    OMP_NUM_THREADS=1 python tests/bench/split_backward_cpu.py [--rounds 5] [--block planner]

Measures each (model, kind) at mbs 2, seq 512, fp32, `--rounds` independent times with
planner's profiler and prints the median and range of (I + W) / B: the overhead of
torch.distributed.pipelining's split (graph analysis before I, one autograd call per
parameter group in W). The tests check the split by FLOPs (I + W = B exactly); this is the
timing they used to assert within 25-30%, which a shared machine moves by as much.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from planner.catalog import resolve_model
from planner.profile.measure import Settings, keep_freed_cpu_memory, measure_shape
from planner.profile.schema import ShapeKey

CASES = (("tiny-llama", "transformer"), ("tiny-gpt", "transformer"), ("tiny-llama", "head"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", default="planner", help="planner | torchtitan (transformer rows)")
    args = parser.parse_args()
    keep_freed_cpu_memory()
    torch.set_num_threads(1)
    settings = Settings(device="cpu", dtype="fp32", warmup=2, repeats=11, block=args.block)
    print(
        f"{'model':<11} {'kind':<12} {'fwd ms':>8} {'I ms':>8} {'W ms':>8} {'B ms':>8} "
        f"{'(I+W)/B median':>15} {'range':>13}"
    )
    for model, kind in CASES:
        if kind == "transformer" and args.block == "torchtitan" and model != "tiny-llama":
            continue
        rows = [
            measure_shape(resolve_model(model), ShapeKey(kind, 1, 2, 512, "none"), settings) for _ in range(args.rounds)
        ]
        ratios = [(r.backward_input_ms + r.backward_weight_ms) / r.backward_ms for r in rows]
        mid = rows[len(rows) // 2]
        print(
            f"{model:<11} {kind:<12} {mid.forward_ms:>8.2f} {mid.backward_input_ms:>8.2f} "
            f"{mid.backward_weight_ms:>8.2f} {mid.backward_ms:>8.2f} {statistics.median(ratios):>15.3f} "
            f"{min(ratios):>6.3f}-{max(ratios):<6.3f}"
        )


if __name__ == "__main__":
    main()
