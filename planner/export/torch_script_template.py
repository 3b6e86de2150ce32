"""Pipeline-parallel training of one planned layout with torch.distributed.pipelining.

Every rank builds the whole model once from a fixed seed on the CPU and keeps the pipeline
stages it owns, so the pipelined run and the unsplit reference start from identical weights
(for a model too large for host memory, replace `build_full_model` by a per-stage init).
Meshes are (pp, dp, tp), tensor parallel innermost. Tensor parallelism shards each block's
attention and MLP linears (torch `parallelize_module`); the embedding and head stay
replicated, and sequence parallelism is not applied (same numbers, more activation memory).
Data parallelism all-reduces gradients (ZeRO-1/2 give the same update; their optimizer /
gradient sharding is not applied here) or, for ZeRO-3, shards the stages with `fully_shard`.
Tied input/output embeddings on different stages get their gradients summed over the
pipeline ranks after each step, so both copies stay equal.
A mixture of experts runs expert parallel over the data-parallel ranks: consecutive groups
of `ep` data-parallel ranks each hold every routed expert once (E / ep per rank) and send
each token to its expert's rank and back by `all_to_all_single` (gloo and NCCL both have
it; see `_AllToAll` in the model blocks); the experts' gradients are averaged over the
ranks holding the same experts, the other parameters' over all data-parallel ranks.

    torchrun --nproc-per-node WORLD train_pipeline.py --device cuda --backend nccl
    python train_pipeline.py --reference      # one process, unsplit model, same data

Each step prints `step N loss L time_s T` (loss: mean over micro-batches and data-parallel
ranks, comparable with the unsplit model's loss on the same global batch). `--report PREFIX`
also writes PREFIX.rank<R>.json per rank: its parameters (the local shards), step times and,
on CUDA, the peak of allocated memory (what `planner.fidelity.validate_node` compares).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    _PipelineScheduleRuntime,
    get_schedule_class,
)
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

# >>> planner: model blocks
from planner.torch_blocks import BlockConfig, Transformer, lm_loss
# <<< planner: model blocks

# >>> planner: plan
MODEL: dict = {}
"""BlockConfig arguments of the unsharded model."""
PLAN: dict = {}
"""The layout: degrees, micro-batching, schedule, and per rank the (virtual stage, first
layer, end layer) of each chunk."""
# <<< planner: plan


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--backend", default=None, help="gloo or nccl (default: by device)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=PLAN["dtype"])
    planned_csv = PLAN["schedule_csv"] and os.path.join(os.path.dirname(os.path.abspath(__file__)), PLAN["schedule_csv"])
    parser.add_argument("--schedule-csv", default=planned_csv,
                        help="run this per-rank action order (torch CSV) instead of the schedule class")
    parser.add_argument("--reference", action="store_true",
                        help="train the unsplit model in one process on the same data")
    parser.add_argument("--report", default=None,
                        help="write PREFIX.rank<R>.json: parameters, step times, peak memory")
    return parser.parse_args()


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_full_model(seed: int) -> Transformer:
    """The whole model, initialised from `seed` (identical on every rank)."""
    torch.manual_seed(seed)
    return Transformer(BlockConfig(**MODEL))


def batch(step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic global batch of step `step`: (inputs, next-token targets)."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    tokens = torch.randint(0, MODEL["vocab_size"], (PLAN["global_batch"], PLAN["seq"] + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def cut(full: Transformer, first: int, end: int, is_first: bool, is_last: bool) -> Transformer:
    """A copy of `full` holding layers first..end-1 and the embedding / head if it owns them."""
    part = copy.deepcopy(full)
    for name in list(part.layers.keys()):
        if not first <= int(name) < end:
            del part.layers[name]
    if not is_first:
        part.tok_embeddings = None
    if not is_last:
        part.head = None
    return part


class Recomputed(nn.Module):
    """A block whose activations are recomputed in the backward pass (full recompute)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def tensor_parallel(part: Transformer, tp_mesh) -> None:
    """Shard attention (heads) and MLP (hidden) linears of every block over `tp_mesh`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()}
    if MODEL["activation"] == "swiglu":
        plan["feed_forward.w3"] = ColwiseParallel()
    for block in part.layers.values():
        parallelize_module(block, tp_mesh, plan)


def prepare(part: Transformer, recompute: str, mesh, device, dtype) -> Transformer:
    """Move a stage to the device and apply TP, recompute and (ZeRO-3) FSDP to it."""
    part = part.to(device=device, dtype=dtype)
    if PLAN["tp"] > 1:
        tensor_parallel(part, mesh["tp"])
    if recompute == "full":
        for name in list(part.layers.keys()):
            part.layers[name] = Recomputed(part.layers[name])
    if PLAN["zero_stage"] == 3 and PLAN["dp"] > 1:
        from torch.distributed.fsdp import fully_shard

        for block in part.layers.values():
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(part, mesh=mesh["dp"])
    return part


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def tied_embedding_group(mesh):
    """Process group of the two pipeline ranks holding the first and the last stage (one
    group per data / tensor-parallel position), or None when one rank holds both."""
    first, last = PLAN["stage_ranks"][0], PLAN["stage_ranks"][-1]
    if first == last:
        return None
    mine = None
    for d in range(PLAN["dp"]):
        for t in range(PLAN["tp"]):
            ranks = [int(mesh.mesh[first, d, t]), int(mesh.mesh[last, d, t])]
            group = dist.new_group(ranks)  # every rank creates every group, in the same order
            if dist.get_rank() in ranks:
                mine = group
    return mine


def sync_tied_embeddings(parts: list[Transformer], group) -> None:
    """Sum the gradients of the input embedding and of the tied output head (on the ranks of
    the first and last stage, or on one rank holding both) and give both copies the sum."""
    weights = [p.tok_embeddings.tok.weight for p in parts if p.tok_embeddings is not None]
    weights += [p.head.output.weight for p in parts if p.head is not None]
    if not weights:
        return
    total = sum(local(w.grad) for w in weights)
    if group is not None:
        dist.all_reduce(total, group=group)
    for w in weights:
        local(w.grad).copy_(total)


def expert_parallel_groups(mesh):
    """(expert-parallel group, expert-data-parallel group, rank in the first) of this rank:
    data-parallel rank d is expert rank d % ep of the group of d // ep; the ranks with the
    same expert rank (holding the same experts) form the expert-data-parallel group. Every
    rank creates every group, in the same order."""
    ep = PLAN["ep"]
    mine = {}
    for p in range(PLAN["pp"]):
        for t in range(PLAN["tp"]):
            ranks = [int(r) for r in mesh.mesh[p, :, t]]
            for kind, members in [("ep", ranks[g * ep:(g + 1) * ep]) for g in range(len(ranks) // ep)] + \
                                 [("edp", ranks[e::ep]) for e in range(ep)]:
                group = dist.new_group(members)
                if dist.get_rank() in members:
                    mine[kind] = group
    return mine["ep"], mine["edp"], mesh["dp"].get_local_rank() % ep


def shard_experts(part: Transformer, ep_rank: int, ep_group) -> None:
    """Keep this rank's slice of every MoE layer's routed experts."""
    for block in part.layers.values():
        if block.is_moe:
            block.moe.experts.shard(ep_rank, PLAN["ep"], ep_group)


def is_expert_param(name: str) -> bool:
    return ".moe.experts." in f".{name}"


def average_data_parallel(parts: list[Transformer], mesh, expert_dp_group) -> None:
    """Average gradients over the data-parallel ranks (what DDP does); routed experts' over
    the ranks holding the same experts (their gradients already sum every rank's tokens)."""
    group = mesh["dp"].get_group()
    for part in parts:
        for name, param in part.named_parameters():
            if param.grad is not None:
                grad = local(param.grad)
                expert = PLAN["ep"] > 1 and is_expert_param(name)
                if not expert or dist.get_world_size(expert_dp_group) > 1:
                    dist.all_reduce(grad, group=expert_dp_group if expert else group)
                grad.div_(PLAN["dp"])


def make_optimizer(params, args) -> torch.optim.Optimizer:
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr)
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)


def build_schedule(stages: list[PipelineStage], args):
    """The planned schedule: torch's class, or the exported per-rank action order (CSV)."""
    micro = PLAN["num_microbatches"]
    if args.schedule_csv:
        schedule = _PipelineScheduleRuntime(stages, n_microbatches=micro, loss_fn=lm_loss)
        schedule._load_csv(args.schedule_csv)
        return schedule
    cls = get_schedule_class(PLAN["torch_schedule"])
    if issubclass(cls, PipelineScheduleSingle):
        return cls(stages[0], n_microbatches=micro, loss_fn=lm_loss)
    return cls(stages, n_microbatches=micro, loss_fn=lm_loss)


def run_distributed(args) -> None:
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda" \
        else torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend or ("nccl" if device.type == "cuda" else "gloo"))
    pp, dp, tp = PLAN["pp"], PLAN["dp"], PLAN["tp"]
    if dist.get_world_size() != pp * dp * tp:
        raise SystemExit(f"this plan needs {pp * dp * tp} processes (pp*dp*tp), got {dist.get_world_size()}")
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    dtype = DTYPES[args.dtype]
    full = build_full_model(args.seed)
    chunks = PLAN["chunks"][pp_rank]  # [(virtual stage, first layer, end layer), ...]
    num_stages = pp * PLAN["vpp"]
    recompute = PLAN["recompute"][pp_rank]
    parts = [cut(full, first, end, stage == 0, stage == num_stages - 1) for stage, first, end in chunks]
    del full
    expert_dp_group = None
    if PLAN["ep"] > 1:
        ep_group, expert_dp_group, ep_rank = expert_parallel_groups(mesh)
        for part in parts:
            shard_experts(part, ep_rank, ep_group)
    parts = [prepare(part, recompute, mesh, device, dtype) for part in parts]
    optimizer = make_optimizer([p for part in parts for p in part.parameters()], args)
    has_first = any(stage == 0 for stage, _, _ in chunks)
    has_last = any(stage == num_stages - 1 for stage, _, _ in chunks)
    schedule = None
    tied_group = tied_embedding_group(mesh) if MODEL["tie_embeddings"] and pp > 1 else None
    if pp > 1:
        stages = [PipelineStage(part, stage, num_stages, device, group=mesh["pp"].get_group())
                  for part, (stage, _, _) in zip(parts, chunks)]
        schedule = build_schedule(stages, args)
    local_batch = PLAN["mbs"] * PLAN["num_microbatches"]
    step_times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(1, args.steps + 1):
        inputs, targets = batch(step, args.seed)
        rows = slice(dp_rank * local_batch, (dp_rank + 1) * local_batch)
        inputs, targets = inputs[rows].to(device), targets[rows].to(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        if schedule is None:  # one stage: gradient accumulation over the micro-batches
            for x, y in zip(inputs.chunk(PLAN["num_microbatches"]), targets.chunk(PLAN["num_microbatches"])):
                mb_loss = lm_loss(parts[0](x), y) / PLAN["num_microbatches"]
                mb_loss.backward()
                loss += mb_loss.detach().float()
        else:
            losses: list[torch.Tensor] = []
            step_args = (inputs,) if has_first else ()
            schedule.step(*step_args, target=targets if has_last else None, losses=losses if has_last else None)
            if has_last:
                loss = torch.stack([l.detach().float() for l in losses]).mean()
            dist.all_reduce(loss, group=mesh["pp"].get_group())  # only the last stage holds it
            if MODEL["tie_embeddings"]:
                sync_tied_embeddings(parts, tied_group)
        if dp > 1 and PLAN["zero_stage"] < 3:
            average_data_parallel(parts, mesh, expert_dp_group)
        optimizer.step()
        if dp > 1:
            dist.all_reduce(loss, group=mesh["dp"].get_group())
            loss /= dp
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        step_times.append(elapsed)
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.8f} time_s {elapsed:.4f}", flush=True)
    if args.report:
        write_report(args.report, parts, step_times, device, pp_rank)
    dist.destroy_process_group()


def write_report(prefix: str, parts: list[nn.Module], step_times: list[float], device: torch.device,
                 pp_rank: int) -> None:
    """This rank's parameters (local shards of TP-sharded ones), step times and CUDA peak
    allocated memory, as PREFIX.rank<R>.json."""
    params = sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                 for part in parts for p in part.parameters())
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    report = {"rank": dist.get_rank(), "pp_rank": pp_rank, "params": params, "step_time_s": step_times,
              "peak_allocated_bytes": peak, "device": str(device)}
    with open(f"{prefix}.rank{dist.get_rank()}.json", "w") as handle:
        json.dump(report, handle)


def run_reference(args) -> None:
    """The unsplit model in one process on the same global batches."""
    device = torch.device(args.device)
    model = build_full_model(args.seed).to(device=device, dtype=DTYPES[args.dtype])
    optimizer = make_optimizer(model.parameters(), args)
    for step in range(1, args.steps + 1):
        inputs, targets = batch(step, args.seed)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.8f} time_s {time.perf_counter() - start:.4f}", flush=True)


if __name__ == "__main__":
    arguments = parse_args()
    run_reference(arguments) if arguments.reference else run_distributed(arguments)
