"""Time the host and the GPU on one MoE layer's routed experts at a published run's per-GPU
shapes, beside what the cost model charges (planner/fidelity/moe_host.py does the work;
docs/moe.md "Measuring the experts' host time").

    python scripts/measure_moe_host.py --run qwen3-235b-tp4-ep8-pp8-vpp4-256xh100 --out moe_host.json

On a GPU node with Transformer Engine installed it runs TE's GroupedLinear as Megatron-core's
TEGroupedMLP does (`--impl te`, the default there); elsewhere per-expert torch linears
(`--impl torch`). One GPU is enough: the experts' work does not depend on the other ranks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

from planner.fidelity.moe_host import measure, model_charges, report, shapes_of
from planner.fidelity.published import build, load_runs
from planner.predict import layout_shard

RUNS = Path(__file__).resolve().parents[1] / "tests" / "bench" / "published_runs.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a published run's name (its model, layout and GPU)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="published runs TOML")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when present")
    parser.add_argument(
        "--impl",
        choices=("te", "torch"),
        default=None,
        help="default: te on cuda when transformer_engine imports, else torch",
    )
    parser.add_argument("--tokens-per-expert", type=int, default=None, help="override the model's count")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON record here too")
    args = parser.parse_args()
    runs = {run.name: run for run in load_runs(args.runs)}
    if args.run not in runs:
        parser.error(f"no run named {args.run!r} in {args.runs}")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    impl = args.impl or ("te" if device == "cuda" and importlib.util.find_spec("transformer_engine") else "torch")
    run = runs[args.run]
    model, layout = build(run)
    shapes = shapes_of(model, layout_shard(layout, run.seq))
    if args.tokens_per_expert:
        shapes = replace(shapes, tokens_per_expert=args.tokens_per_expert)
    full = measure(shapes, impl, device, args.repeats)
    half = measure(replace(shapes, experts=shapes.experts // 2), impl, device, args.repeats)
    record = report(shapes, impl, device, full, half, model_charges(model, shapes))
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    for name in ("forward", "backward"):
        measured, charged = record["measured_per_expert"][name], record["model_per_expert"]
        gpu = measured["gpu_s"]
        print(
            f"{name}: per local expert host {measured['host_s'] * 1e6:.1f} us (model "
            f"{charged[f'host_{name}_s'] * 1e6:.1f}), GPU "
            f"{'n/a' if gpu is None else f'{gpu * 1e6:.1f} us'} (model {charged[f'gpu_{name}_s'] * 1e6:.1f})",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
