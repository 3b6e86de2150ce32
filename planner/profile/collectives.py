"""Collective bandwidth and latency between the processes of one torchrun launch:
all-reduce, all-gather, reduce-scatter and point-to-point send/recv over message sizes.

NCCL on GPUs (one GPU per local rank), gloo on CPUs; fp32 elements. Each size is timed
`repeats` times after `warmup` untimed runs, each run between barriers: CUDA events or
perf_counter. A row holds the median of the slowest rank's times; send/recv is a
ping-pong between ranks 0 and 1, half the round trip. Sizes and bandwidths follow
nccl-tests (algbw = bytes / time; busbw scales algbw by 2(n-1)/n for all-reduce and
(n-1)/n for all-gather and reduce-scatter). torch is imported inside `run`: this module is
loaded only under `planner profile --collectives`.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from planner.profile.schema import CollectiveRow

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
MIN_BYTES = 1024


def message_sizes(max_bytes: int, min_bytes: int = MIN_BYTES) -> list[int]:
    """Message sizes from min_bytes to max_bytes in steps of 4x."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw for `op` over `world` ranks (nccl-tests PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_gather", "reduce_scatter"):
        return (world - 1) / world
    return 1.0


def run(sizes: list[int], device: str, warmup: int, repeats: int) -> list[CollectiveRow]:
    """Time every op at every size across the torchrun ranks; the rows on rank 0, [] elsewhere."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        rows = []
        for op in OPS:
            for size in sizes:
                elements = max(world, size // 4 // world * world)
                step = _op(op, elements, world, rank, dev)
                seconds = _slowest_median(step, warmup, repeats, dev)
                if op == "send_recv":
                    seconds /= 2
                nbytes = elements * 4
                algbw = nbytes / seconds / 1e9
                rows.append(CollectiveRow(
                    op=op, backend=backend, world_size=world, bytes=nbytes, time_us=seconds * 1e6,
                    algbw_gbps=algbw, busbw_gbps=algbw * bus_factor(op, world),
                ))
        return rows if rank == 0 else []
    finally:
        dist.destroy_process_group()


def _op(op: str, elements: int, world: int, rank: int, dev) -> Callable[[], None]:
    """One call of `op` on buffers of `elements` fp32 values (the nccl-tests size)."""
    import torch
    import torch.distributed as dist

    full = torch.randn(elements, device=dev)
    part = torch.empty(elements // world, device=dev)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        return lambda: gather(full, part)
    if op == "reduce_scatter":
        return lambda: scatter(part, full)
    return lambda: ping_pong(full, rank)


def ping_pong(buffer, rank: int) -> None:
    """One round trip of `buffer` between ranks 0 and 1 (rank 0 sends first); others idle."""
    import torch.distributed as dist

    if rank == 0:
        dist.send(buffer, 1)
        dist.recv(buffer, 1)
    elif rank == 1:
        dist.recv(buffer, 0)
        dist.send(buffer, 0)


def _slowest_median(step: Callable[[], None], warmup: int, repeats: int, dev) -> float:
    """Median over repeats of the slowest rank's seconds for one `step`."""
    import torch
    import torch.distributed as dist

    cuda = dev.type == "cuda"
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            step()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    local = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return float(local.item())
