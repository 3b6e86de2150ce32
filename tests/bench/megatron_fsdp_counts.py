"""The collectives Megatron-FSDP (Megatron-LM's `--use-custom-fsdp`) issues in one step, counted
by running its own code on CPU.

    git -C Megatron-LM checkout 1e057005     # the ModelZoo FSDP row's code
    PYTHONPATH=. python tests/bench/megatron_fsdp_counts.py Megatron-LM [--layers 6] [--microbatches 4]

Copies Megatron-LM's megatron/core/distributed/custom_fsdp/{fully_sharded_data_parallel,
param_and_grad_buffer}.py and distributed_data_parallel_config.py from the given checkout into a
temporary package (its other imports come from the installed megatron-core), runs it under a
fake process group with CUDA streams and events as no-ops, and records every
`all_gather_into_tensor` and `reduce_scatter_tensor` (group size, elements, dtype) over one step
of `--microbatches` micro-batches as `schedules.forward_backward_no_pipelining` runs them (all but
the last under `no_sync()`, then `finish_grad_sync`). The model is Qwen3-235B's per-GPU
parameter layout at TP 2, EP 8 scaled down 1e5 times: an embedding and an output layer of 3,112
elements each (151,936 x 4,096 / TP 2), a final norm, and `--layers` FSDP units (Megatron's
TransformerLayer) of 362 dense elements (attention / TP 2, norms, router) and 3,020 expert ones
(16 experts x 3 x 4,096 x 1,536), the experts marked `allreduce = False` as Megatron marks them;
full recompute (reentrant checkpoint per unit, as `--recompute-granularity full --recompute-method
uniform --recompute-num-layers 1`); the non-unit bucket size 1,280 (training.py's
max(40M, 1M x DP 128) scaled). Dense parameters shard over a group of 4, experts over one of 2.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

DP, EDP = 4, 2
FILES = {
    "custom_fsdp/fully_sharded_data_parallel.py": "fully_sharded_data_parallel.py",
    "custom_fsdp/param_and_grad_buffer.py": "param_and_grad_buffer.py",
    "distributed_data_parallel_config.py": "distributed_data_parallel_config.py",
}
RECORD: list[tuple[str, int, int, str]] = []


class _Done:
    """A finished collective or CUDA event: waiting returns at once."""

    def wait(self, *unused) -> None:
        return None


class _Stream:
    """A CUDA stream on CPU: nothing to order."""

    def __init__(self, *unused, **unused_kw) -> None:
        pass

    def wait_stream(self, stream) -> None:
        return None

    def record_event(self, *unused) -> _Done:
        return _Done()


def _all_gather(output_tensor, input_tensor, group=None, async_op=False):
    RECORD.append(("all-gather", dist.get_world_size(group), output_tensor.numel(), str(output_tensor.dtype)))
    return _Done() if async_op else None


def _reduce_scatter(output, input, op=None, group=None, async_op=False):
    RECORD.append(("reduce-scatter", dist.get_world_size(group), input.numel(), str(input.dtype)))
    return _Done() if async_op else None


@contextlib.contextmanager
def _coalescing(group, async_ops=False):
    yield _Done()


def load(checkout: Path) -> types.ModuleType:
    """Megatron-FSDP's module from `checkout`, importable on CPU, its collectives recorded."""
    package = Path(tempfile.mkdtemp()) / "megatron_fsdp_at_checkout"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for source, name in FILES.items():
        text = (checkout / "megatron/core/distributed" / source).read_text()
        text = text.replace("megatron.core.distributed.custom_fsdp.", "megatron_fsdp_at_checkout.")
        text = text.replace(
            "megatron.core.distributed.distributed_data_parallel_config",
            "megatron_fsdp_at_checkout.distributed_data_parallel_config",
        )
        (package / name).write_text(text)
    sys.path.insert(0, str(package.parent))
    groups_config = importlib.import_module("megatron.core.process_groups_config")
    if not hasattr(groups_config, "GradCommProcessGroups"):  # later megatron-core renamed it
        groups_config.GradCommProcessGroups = type("GradCommProcessGroups", (), {})
    torch.cuda.Stream, torch.cuda.current_stream = _Stream, lambda *unused: _Stream()
    torch.cuda.stream, torch.cuda.empty_cache = lambda stream: contextlib.nullcontext(), lambda: None
    dist.all_gather_into_tensor, dist.reduce_scatter_tensor = _all_gather, _reduce_scatter
    buffer = importlib.import_module("megatron_fsdp_at_checkout.param_and_grad_buffer")
    buffer._coalescing_manager = _coalescing
    buffer.ParamAndGradBuffer._log_parameter_groups = lambda self: None  # reads parallel_state
    return importlib.import_module("megatron_fsdp_at_checkout.fully_sharded_data_parallel")


def _vector(n: int, expert: bool = False) -> nn.Parameter:
    p = nn.Parameter(torch.randn(n, dtype=torch.bfloat16))
    if expert:
        p.allreduce = False
    return p


def _through(x: torch.Tensor, *params: nn.Parameter) -> torch.Tensor:
    """`x`, with every parameter in `params` on its autograd path."""
    return x * (1 + sum(p.float().sum() for p in params) * 0)


class Unit(nn.Module):
    """One transformer layer's parameters: dense and routed experts."""

    def __init__(self) -> None:
        super().__init__()
        self.dense, self.experts = _vector(362), _vector(3020, expert=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _through(x, self.dense, self.experts)


class Leaf(nn.Module):
    """A non-unit module (embedding, final norm, output layer)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = _vector(n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _through(x, self.weight)


class Model(nn.Module):
    """Embedding, `layers` units under full recompute, final norm, output layer."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embedding, self.final_norm, self.output_layer = Leaf(3112), Leaf(1), Leaf(3112)
        self.layers = nn.ModuleList(Unit() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embedding(x)
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)
        return self.output_layer(self.final_norm(x)).float().sum()


def count(fsdp: types.ModuleType, layers: int, microbatches: int) -> collections.Counter:
    """The step's collectives as (kind, group size, elements, dtype) -> calls."""
    config = types.SimpleNamespace(calculate_per_token_loss=False, init_model_with_meta_device=False)
    ddp = fsdp.DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        use_distributed_optimizer=True,
        data_parallel_sharding_strategy="optim_grads_params",
        bucket_size=1280,
    )
    groups = fsdp.GradCommProcessGroups()
    groups.dp, groups.expt_dp = dist.new_group(list(range(DP))), dist.new_group([0, 2])
    model = fsdp.FullyShardedDataParallel(
        config, ddp, Model(layers), fsdp_unit_modules=[Unit], device=torch.device("cpu"), grad_comm_pgs=groups
    )
    x = torch.ones(4, requires_grad=True)
    RECORD.clear()
    with model.no_sync():
        for _ in range(microbatches - 1):
            model(x).backward()
    model(x).backward()
    model.finish_grad_sync()
    return collections.Counter(RECORD)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a Megatron-LM checkout with custom_fsdp")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args(argv)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=DP)
    fsdp = load(args.checkout)
    for (kind, size, elements, dtype), calls in sorted(count(fsdp, args.layers, args.microbatches).items()):
        print(f"{kind:>14} over {size} ranks, {elements:5d} elements {dtype:>14}: {calls:4d} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
