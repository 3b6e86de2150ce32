"""Collective bandwidth and latency inside one node: all-reduce, all-gather, reduce-scatter,
all-to-all and point-to-point send/recv over message sizes, for each group size.

NCCL on GPUs (one GPU per rank), gloo on CPUs; fp32 elements. The ranks are either the
processes of a torchrun launch (`WORLD_SIZE` set) or `nprocs` processes this module spawns
itself (`spawn`), so `planner profile --collectives` is one command on a node. For each
group size g (ranks 0..g-1; by default 2, 4, ... up to the node) and each size, every op is
timed `repeats` times after `warmup` untimed runs, each run between barriers of all ranks:
CUDA events or perf_counter. A row holds the median of the slowest rank's times; send/recv
is a ping-pong between ranks 0 and 1 (group size 2), half the round trip. Sizes and
bandwidths follow nccl-tests: `bytes` is the all-reduce buffer, the all-gather output, the
reduce-scatter input, each rank's all-to-all input, the point-to-point message;
algbw = bytes / time, busbw = algbw x 2(g-1)/g for all-reduce, (g-1)/g for all-gather,
reduce-scatter and all-to-all, 1 for send/recv (nccl-tests doc/PERFORMANCE.md). torch is
imported inside the functions: this module is loaded only under `planner profile --collectives`.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from planner.profile.node_comm import bus_factor
from planner.profile.schema import CollectiveRow

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
MIN_BYTES = 1024
MAX_BYTES = 2**30


def message_sizes(max_bytes: int, min_bytes: int = MIN_BYTES) -> list[int]:
    """Message sizes from min_bytes to max_bytes in steps of 4x."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def group_sizes(world: int) -> list[int]:
    """The group sizes measured on `world` ranks: powers of two from 2, and `world` itself."""
    sizes, size = [], 2
    while size < world:
        sizes.append(size)
        size *= 2
    return sizes + [world] if world >= 2 else []


def spawn(nprocs: int, sizes: list[int], device: str, warmup: int, repeats: int) -> list[CollectiveRow]:
    """Start `nprocs` processes on this machine, run `run` in each, return rank 0's rows."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="planner-collectives-") as tmp:
        result = Path(tmp) / "rows.json"
        port = _free_port()
        mp.spawn(_worker, args=(nprocs, port, sizes, device, warmup, repeats, str(result)), nprocs=nprocs)
        return [CollectiveRow.model_validate(row) for row in json.loads(result.read_text())]


def _worker(
    rank: int, world: int, port: int, sizes: list[int], device: str, warmup: int, repeats: int, result: str
) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    rows = run(sizes, device, warmup, repeats)
    if rank == 0:
        Path(result).write_text(json.dumps([row.model_dump() for row in rows]))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(sizes: list[int], device: str, warmup: int, repeats: int) -> list[CollectiveRow]:
    """Time every op at every size and group size across the ranks of this process group
    (from the torchrun environment); the rows on rank 0, [] elsewhere."""
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
        for group_size in group_sizes(world):
            group = dist.new_group(list(range(group_size)))  # every rank takes part in creating it
            member = rank < group_size
            for op in OPS:
                if op == "send_recv" and group_size != 2:
                    continue
                for size in sizes:
                    elements = max(group_size, size // 4 // group_size * group_size)
                    step = _op(op, elements, group_size, rank, dev, group) if member else (lambda: None)
                    seconds = _slowest_median(step, warmup, repeats, dev)
                    if op == "send_recv":
                        seconds /= 2
                    nbytes = elements * 4
                    algbw = nbytes / seconds / 1e9
                    rows.append(
                        CollectiveRow(
                            op=op,
                            backend=backend,
                            world_size=group_size,
                            bytes=nbytes,
                            time_us=seconds * 1e6,
                            algbw_gbps=algbw,
                            busbw_gbps=algbw * bus_factor(op, group_size),
                        )
                    )
                    del step
        return rows if rank == 0 else []
    finally:
        dist.destroy_process_group()


def _op(op: str, elements: int, world: int, rank: int, dev, group) -> Callable[[], None]:
    """One call of `op` on buffers of `elements` fp32 values (the nccl-tests size) in `group`."""
    import torch
    import torch.distributed as dist

    full = torch.randn(elements, device=dev)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if op == "send_recv":
        return lambda: ping_pong(full, rank)
    part = torch.empty(elements // world, device=dev)
    # torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor to *_single
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_gather":
        return lambda: gather(full, part, group=group)
    return lambda: scatter(part, full, group=group)


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
    """Median over repeats of the slowest rank's seconds for one `step` (all ranks take part)."""
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
