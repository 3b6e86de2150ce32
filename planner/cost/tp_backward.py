"""Tensor-parallel communication of the backward pass, collective by collective, as the
runtime issues it beside the linear layers' two backward GEMMs.

A tensor-parallel linear's backward runs a data-gradient GEMM (dgrad: the gradient of its
input) and a weight-gradient GEMM (wgrad). Two ways to communicate around them:

"none" (synchronous): the collectives are autograd functions of their own, each exposed.
Column-parallel linears reduce their input gradient over TP (all-reduce; reduce-scatter under
sequence parallelism, the backward of the forward's all-gather); row-parallel linears, under
sequence parallelism, all-gather their output gradient (the backward of the forward's
reduce-scatter). The gathered input a column-parallel linear's wgrad needs is the one the
forward saved. Megatron-LM before September 2021 (megatron/mpu/mappings.py
`_CopyToModelParallelRegion.backward: return _reduce(grad_output)`), Megatron-DeepSpeed
(BigScience's and Microsoft's forks keep `copy_to_tensor_model_parallel_region` in
ColumnParallelLinear.forward), torch DTensor tensor parallelism (torchtitan).

"async": Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication (commits cf7efd4f
"allreduce overlap with wgrad gemm" and 3f652469, merged 2021-09-02, on by default through
`--no-async-tensor-model-parallel-allreduce`; sequence parallelism's version 02bb1f5c,
2022-03; megatron/core/tensor_parallel/layers.py today) and Transformer Engine's Linear,
LayerNormLinear and LayerNormMLP (module/linear.py `_Linear.backward`: "Overlap input AG with
dgrad", "Overlap dgrad-RS/AR with wgrad"). In a column-parallel linear's backward:

    sequence parallel:  all-gather of the saved (sharded) input, async     | beside dgrad
                        reduce-scatter of the input gradient, async        | beside wgrad
    otherwise:          all-reduce of the input gradient, async            | beside wgrad

The forward does not keep the gathered input, so sequence parallelism gathers it again in the
backward: one all-gather per column-parallel linear that the synchronous accounting never
charged. Row-parallel linears are unchanged (all-gather of the output gradient before their
dgrad under sequence parallelism, exposed; nothing otherwise). Both runtimes rely on
CUDA_DEVICE_MAX_CONNECTIONS=1 to start the collective before the GEMM it hides behind.

"async_delayed_wgrad": the same linears under Megatron's `--delay-wgrad-compute` (with
`--overlap-moe-expert-parallel-comm`): Transformer Engine stores the wgrad GEMM for a later
node (`ctx.wgrad_store.put([inputmat_total, grad_output], wgrad_gemm)`, module/linear.py), so
the input is still gathered beside the dgrad but the input gradient's reduction runs alone.

Each overlapped collective costs `overlapped_extra_time` against its GEMM: the GEMM slows by
the SM share the collective holds, the collective's excess over the GEMM stays exposed.
When a schedule runs the weight gradients as a pass of their own (zero-bubble W), the wgrad
GEMM is not there to hide the input gradient's reduction: it is charged exposed (conservative;
Megatron's deferred-wgrad path waits on that handle right after the dgrad).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from planner.cost.overlap import overlapped_extra_time

TpBackward = Literal["none", "async", "async_delayed_wgrad"]
TP_BACKWARD: tuple[str, ...] = get_args(TpBackward)
Parallel = Literal["column", "row"]
Collective = Literal["all_gather", "reduce_scatter", "all_reduce"]
Beside = Literal["exposed", "dgrad", "wgrad"]


@dataclass(frozen=True, slots=True)
class BackwardCollective:
    """One collective a linear's backward issues over the TP group, and the GEMM of that
    linear it runs beside ("exposed": none)."""

    linear: str
    collective: Collective
    beside: Beside


def backward_collectives(
    linears: Sequence[tuple[str, Parallel]], sequence_parallel: bool, asynchronous: bool
) -> tuple[BackwardCollective, ...]:
    """The TP collectives of the backward of `linears` (given in forward order, each named with
    its parallel mode), in the order the backward issues them: each collective moves one
    activation of the layer's tokens (the full, gathered size)."""
    issued: list[BackwardCollective] = []
    for name, parallel in reversed(linears):
        if parallel == "row":
            if sequence_parallel:
                issued.append(BackwardCollective(name, "all_gather", "exposed"))
        elif not asynchronous:
            issued.append(BackwardCollective(name, "reduce_scatter" if sequence_parallel else "all_reduce", "exposed"))
        elif sequence_parallel:
            issued += [
                BackwardCollective(name, "all_gather", "dgrad"),
                BackwardCollective(name, "reduce_scatter", "wgrad"),
            ]
        else:
            issued.append(BackwardCollective(name, "all_reduce", "wgrad"))
    return tuple(issued)


def backward_comm_seconds(
    collectives: Sequence[BackwardCollective],
    comm_s: Mapping[str, float],
    gemm_s: Mapping[str, tuple[float, float]],
    sm_fraction: float,
    wgrad_deferred: bool = False,
) -> float:
    """Seconds the backward's TP communication adds to its compute: exposed collectives whole,
    overlapped ones by `overlapped_extra_time` against their linear's (dgrad, wgrad) GEMM
    seconds (`gemm_s`); those beside the wgrad exposed whole when the wgrad is deferred.
    `comm_s`: seconds of each kind of collective."""
    total = 0.0
    for c in collectives:
        comm = comm_s[c.collective]
        if c.beside == "exposed" or (c.beside == "wgrad" and wgrad_deferred):
            total += comm
        else:
            dgrad, wgrad = gemm_s[c.linear]
            total += overlapped_extra_time(comm, dgrad if c.beside == "dgrad" else wgrad, sm_fraction)
    return total
