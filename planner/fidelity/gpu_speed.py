"""Measure a cluster's per-GPU compute speed: the population the straggler model reads
(planner/cost/stragglers.py, docs/stragglers.md).

On each node, every local GPU runs the same bf16 GEMM back to back at once (all GPUs loaded
together, as in training, so each reaches the clock its power limit and cooling allow), and
the node writes one JSON record per GPU. Before the load, each GPU also times one burst of the
GEMM after an idle second (the regime of short benchmarks and of `planner profile`, at the boost
clock), so a record gives the GPU's sustained over its burst rate, the quantity the GPU presets
carry as `sustained_compute` (docs/h100_rates.md section e). `collect` turns the records of all nodes into one
population in the format of planner/presets/gpu_speed_spread.toml, which
`planner plan|evaluate|sweep --gpu-speed-spread FILE` reads.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from pathlib import Path

from planner.profile.gemms import timed_batch

GEMM_SIZE = 8192
"""m = n = k of the timed GEMM: large enough to be compute-bound on every GPU here."""


def _measure_one(index: int, size: int, warmup_s: float, seconds: float, queue) -> None:
    """Time back-to-back `size`^3 bf16 GEMMs on GPU `index` for `seconds` after `warmup_s`;
    put the GPU's record on `queue`."""
    import torch

    torch.cuda.set_device(index)
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    batch = 20

    def gemm() -> None:
        torch.matmul(a, b, out=out)

    burst = _burst_seconds(gemm, batch)
    start = time.monotonic()
    while time.monotonic() - start < warmup_s:
        for _ in range(batch):
            gemm()
        torch.cuda.synchronize()
    windows = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        windows.append(timed_batch(gemm, batch))
    props = torch.cuda.get_device_properties(index)
    queue.put(
        {
            "host": socket.gethostname(),
            "index": index,
            "uuid": str(getattr(props, "uuid", index)),
            "name": props.name,
            "gemm_size": size,
            "windows": len(windows),
            "seconds_per_gemm": statistics.median(windows),
            "tflops": 2 * size**3 / statistics.median(windows) / 1e12,
            "burst_seconds_per_gemm": burst,
        }
    )


def _burst_seconds(gemm, batch: int, idle_s: float = 1.0) -> float:
    """Seconds per GEMM over one burst of `batch` GEMMs started after `idle_s` of idle (after
    three untimed ones that set up cuBLAS)."""
    import torch

    for _ in range(3):
        gemm()
    torch.cuda.synchronize()
    time.sleep(idle_s)
    return timed_batch(gemm, batch)


def sustained_over_burst(records: list[dict]) -> float | None:
    """Median over GPUs of the sustained over the burst GEMM rate (burst time over sustained
    time), or None when a record has no burst timing (records of an older script)."""
    if not records or any("burst_seconds_per_gemm" not in r for r in records):
        return None
    return statistics.median(r["burst_seconds_per_gemm"] / r["seconds_per_gemm"] for r in records)


def measure_node(size: int = GEMM_SIZE, warmup_s: float = 30.0, seconds: float = 60.0) -> list[dict]:
    """One record per local GPU, all GPUs measured at the same time."""
    import torch
    import torch.multiprocessing as mp

    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("no CUDA GPU on this node")
    context = mp.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_measure_one, args=(i, size, warmup_s, seconds, queue)) for i in range(count)]
    for w in workers:
        w.start()
    records = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    return sorted(records, key=lambda r: r["index"])


def population_toml(name: str, records: list[dict]) -> str:
    """The records of every node as one population table (planner/presets/gpu_speed_spread.toml)."""
    if not records:
        raise ValueError("no GPU records to collect")
    gpus = sorted({r["name"] for r in records})
    times = sorted(r["seconds_per_gemm"] for r in records)
    hosts = len({r["host"] for r in records})
    size = records[0]["gemm_size"]
    source = (
        f"scripts/measure_gpu_speed.py on {len(records)} GPUs of {hosts} nodes: bf16 GEMM "
        f"{size}^3 back to back on every GPU of a node at once, per GPU the median time"
    )
    return (
        f"[{name}]\n"
        f"gpu = {json.dumps(', '.join(gpus))}\n"
        f'benchmark = "bf16 GEMM {size}^3, all GPUs of a node at once"\n'
        f'unit = "s per GEMM"\n'
        f"source = {json.dumps(source)}\n"
        f"times = [{', '.join(f'{t:.9g}' for t in times)}]\n" + _ratio_line(records)
    )


def _ratio_line(records: list[dict]) -> str:
    """The population's sustained-over-burst line, for comparison with the GPU preset's
    `sustained_compute` (not read by the straggler model), or "" without burst timings."""
    ratio = sustained_over_burst(records)
    if ratio is None:
        return ""
    return (
        f"# sustained over burst GEMM rate, median over GPUs: {ratio:.3f} "
        "(compare `sustained_compute` in planner/presets/gpus.toml)\n"
        f"sustained_over_burst = {ratio:.4f}\n"
    )


def collect(directory: Path, name: str) -> str:
    """The population of every node record (*.json) in `directory`."""
    records = [r for path in sorted(directory.glob("*.json")) for r in json.loads(path.read_text())]
    return population_toml(name, records)
