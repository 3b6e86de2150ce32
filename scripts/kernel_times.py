"""Time one profiled layer's GPU kernels by name: where a forward and a full backward of the
layer `planner profile` measures spend their time, under torch.profiler.

    PYTHONPATH=. python scripts/kernel_times.py --model llama3-8b --tp 8 --mbs 4 --seq 8192 -o kernels.json

Prints each kernel's milliseconds per pass (forward, backward), grouped as the cost model
prices them (GEMM, attention, the rest), and writes them as JSON. Needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from planner.catalog import resolve_model
from planner.profile.measure import LayerCase, Settings
from planner.profile.schema import ShapeKey

GROUPS = (("attention", ("flash", "fmha", "attention")), ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")))


def kernel_group(name: str) -> str:
    """The cost model's component a kernel belongs to, from its name."""
    low = name.lower()
    for group, marks in GROUPS:
        if any(mark in low for mark in marks):
            return group
    return "other"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _phase_kernels(run) -> dict[str, float]:
    """Milliseconds of every CUDA kernel one call of `run` launches, by kernel name."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run()
        _sync()
    times: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.device_time / 1e3
    return dict(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--kind", default="transformer")
    for name in ("tp", "mbs", "seq"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run, no kernels
    key = ShapeKey(args.kind, args.tp, args.mbs, args.seq, "none")
    case = LayerCase.build(resolve_model(args.model), key, Settings(device=device))
    state: dict[str, torch.Tensor] = {}

    def forward() -> None:
        state["out"] = case.forward()

    def backward() -> None:
        case.backward(state.pop("out"))

    for _ in range(args.warmup):
        forward()
        backward()
    phases = {}
    for phase in ("forward", "backward"):
        kernels: dict[str, float] = defaultdict(float)
        for _ in range(args.repeats):
            if phase == "backward":
                forward()
                _sync()
            for name, ms in _phase_kernels(forward if phase == "forward" else backward).items():
                kernels[name] += ms / args.repeats
            if phase == "forward":
                state.pop("out")
        phases[phase] = dict(sorted(kernels.items(), key=lambda item: -item[1]))
    result = {
        "model": args.model,
        "kind": args.kind,
        "tp": args.tp,
        "mbs": args.mbs,
        "seq": args.seq,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "phases": phases,
    }
    args.output.write_text(json.dumps(result, indent=1))
    for phase, kernels in phases.items():
        by_group: dict[str, float] = defaultdict(float)
        for name, ms in kernels.items():
            by_group[kernel_group(name)] += ms
        total = sum(by_group.values())
        groups = ", ".join(f"{g} {ms:.3f}" for g, ms in sorted(by_group.items()))
        print(f"{phase}: {total:.3f} ms of kernels ({groups})")
        for name, ms in list(kernels.items())[:12]:
            print(f"  {ms:8.3f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
