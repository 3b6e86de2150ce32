"""Real torch.distributed.pipelining runs on CPU processes against planner's simulator.

For each schedule, P processes (gloo, `threads` intra-op threads each, all running at once so
that their contention is part of every figure) build the same small Llama-like model from a
fixed seed, keep their stages and then, in the same process setting:

1. profile each own stage for one micro-batch: forward F (the last stage's includes the loss),
   input-gradient I (`stage_backward_input`), weight-gradient W (`stage_backward_weight`) and
   the full backward B (`stage_backward`), exactly the calls torch's stage makes (the first
   stage has no input gradient: its I is skipped and W runs the whole backward, as torch
   does); medians over repeats after warm-up. The same pass counts the bytes autograd saves
   for the backward (distinct storages, parameters excluded) after F and after I;
2. time the point-to-point transfer of one activation between ranks 0 and 1 (half a gloo
   send/recv round trip, median);
3. run the real schedule and keep the median wall time of its timed steps (barrier before
   each; a step's time is the slowest rank's), then one more step under a saved-tensors hook
   that tracks the bytes autograd holds live on each rank.

Profiling passes and timed steps alternate in `rounds` (after a warm-up of both), so that
the slow periods of a shared machine weigh on the prediction and the measurement alike.

The prediction (`predict`) is planner's event simulator on `StageCosts` built from those
measurements: F, I, W per (rank, chunk) for split-backward schedules, B in place of I (W = 0)
for the others, and `p2p_s` from step 2. torch's per-action runtime cost (schedule
bookkeeping, posting gloo sends and receives) is not added: it is about a millisecond against
actions of 10-80 ms here, below this benchmark's noise (see docs/accuracy_pipelined.md).
Memory compared is autograd's saved activations per rank (simulator: `activation_bytes` held
from F to I, `weight_grad_bytes` from I to W, and under the split `retained_bytes` from W to
the end of the step); weights, gradients and communication buffers
are not in either figure. Not modelled (nor run): the optimizer step and gradient scaling
(`scale_grads=False`).
"""

from __future__ import annotations

import os
import pickle
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._backward import (
    stage_backward,
    stage_backward_input,
    stage_backward_weight,
)
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from planner.export.torch_script_template import cut
from planner.profile.collectives import ping_pong
from planner.schedule import (
    TORCH_SCHEDULE_CLASS,
    SimResult,
    StageCosts,
    compile_schedule,
    rank_stages,
    schedule_info,
    simulate,
)
from planner.search.partition import split_into_chunks
from planner.torch_blocks import BlockConfig, Transformer, lm_loss


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """The model, the batch and how long to measure."""

    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 8
    ffn_hidden_size: int = 768
    vocab_size: int = 4096
    seq_len: int = 128
    mbs: int = 1
    num_microbatches: int = 8
    warmup_steps: int = 2
    profile_warmup: int = 2
    rounds: int = 8
    """Rounds of (profile_repeats profiling passes per stage, then `steps` timed steps)."""
    profile_repeats: int = 1
    steps: int = 1
    p2p_repeats: int = 30
    threads: int = 1
    """Intra-op threads per process (torch.set_num_threads)."""
    seed: int = 0

    def block_config(self) -> BlockConfig:
        """The Llama-style model of this benchmark."""
        return BlockConfig(
            family="llama",
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim=self.hidden_size // self.num_heads,
            ffn_hidden_size=self.ffn_hidden_size,
            vocab_size=self.vocab_size,
            max_seq_len=self.seq_len,
        )


class Case(NamedTuple):
    """A schedule name and its chunks per rank V."""

    schedule: str
    vpp: int


DEFAULT_CASES = (Case("gpipe", 1), Case("1f1b", 1), Case("interleaved_1f1b", 2), Case("zbv", 2))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkProfile:
    """One stage's measured cost of one micro-batch."""

    stage: int
    forward_s: float
    input_s: float
    """Input-gradient backward I (0 on the first stage, which has no input gradient)."""
    weight_s: float
    backward_s: float
    """Full backward B in one call."""
    activation_bytes: int
    """Saved for backward after F (distinct storages, parameters excluded)."""
    weight_grad_bytes: int
    """Of those, still held after I (what W needs)."""
    retained_bytes: int
    """Of those, still held after W while the stage's output is referenced (torch's schedule
    keeps each micro-batch's loss, and with it the last stage's graph, until the step ends)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseMeasurement:
    """Everything measured for one schedule run."""

    schedule: str
    pp: int
    vpp: int
    num_microbatches: int
    chunks: tuple[tuple[ChunkProfile, ...], ...]
    """[rank][chunk], chunk c = the rank's c-th smallest stage (the simulator's convention)."""
    p2p_s: float
    step_s: tuple[float, ...]
    """Wall time of each timed step (slowest rank)."""
    peak_saved_bytes: tuple[int, ...]
    """Per rank, the most bytes autograd held saved for backward during one step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Predicted against measured figures of one schedule."""

    schedule: str
    pp: int
    vpp: int
    num_microbatches: int
    predicted_s: float
    measured_s: float
    predicted_peak_bytes: tuple[float, ...]
    measured_peak_bytes: tuple[int, ...]

    @property
    def error(self) -> float:
        """predicted / measured - 1 (positive: the simulator is pessimistic)."""
        return self.predicted_s / self.measured_s - 1.0


# ---------------------------------------------------------------- pure: model of the run


def stage_layer_ranges(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """[first, end) layers of each stage: an even split, earlier stages one more if uneven."""
    if num_stages > num_layers:
        raise ValueError(f"{num_stages} stages need at least as many layers, got {num_layers}")
    bounds = [0]
    for count in split_into_chunks(num_layers, num_stages):
        bounds.append(bounds[-1] + count)
    return list(zip(bounds, bounds[1:]))


def stage_costs(m: CaseMeasurement) -> StageCosts:
    """The simulator's costs from the measurements: F, I, W, or B as I and W = 0 when the
    schedule does not split the backward (torch then runs one full backward call, which frees
    the whole graph); with the split, what W leaves held stays until the step ends."""
    split = schedule_info(m.schedule).split_backward

    def table(value: Callable[[ChunkProfile], float]) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(value(c) for c in row) for row in m.chunks)

    return StageCosts(
        forward_s=table(lambda c: c.forward_s),
        backward_input_s=table(lambda c: c.input_s if split else c.backward_s),
        backward_weight_s=table(lambda c: c.weight_s if split else 0.0),
        p2p_s=m.p2p_s,
        activation_bytes=table(lambda c: float(c.activation_bytes)),
        weight_grad_bytes=table(lambda c: float(min(c.weight_grad_bytes, c.activation_bytes))),
        retained_bytes=table(
            lambda c: float(min(c.retained_bytes, c.weight_grad_bytes, c.activation_bytes)) if split else 0.0
        ),
    )


def predict(m: CaseMeasurement) -> SimResult:
    """planner's simulation of the measured schedule on the measured costs."""
    compiled = compile_schedule(m.schedule, m.pp, m.num_microbatches, m.vpp)
    return simulate(compiled, stage_costs(m))


def compare(m: CaseMeasurement) -> Comparison:
    """Prediction next to the measured median step time and peak saved bytes."""
    result = predict(m)
    return Comparison(
        schedule=m.schedule,
        pp=m.pp,
        vpp=m.vpp,
        num_microbatches=m.num_microbatches,
        predicted_s=result.step_time_s,
        measured_s=statistics.median(m.step_s),
        predicted_peak_bytes=result.peak_activation_bytes or (),
        measured_peak_bytes=m.peak_saved_bytes,
    )


def format_table(rows: Sequence[Comparison]) -> str:
    """A plain-text table: schedule, P, V, M, step times, error, peak MiB per rank."""
    mib = 2**20
    lines = [
        f"{'schedule':<17} {'P':>2} {'V':>2} {'M':>3} {'pred s':>8} {'meas s':>8} {'err %':>6}  "
        "peak saved MiB per rank (pred/meas)"
    ]
    for r in rows:
        peaks = " ".join(f"{p / mib:.1f}/{q / mib:.1f}" for p, q in zip(r.predicted_peak_bytes, r.measured_peak_bytes))
        lines.append(
            f"{r.schedule:<17} {r.pp:>2} {r.vpp:>2} {r.num_microbatches:>3} "
            f"{r.predicted_s:>8.4f} {r.measured_s:>8.4f} {100 * r.error:>+6.1f}  {peaks}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- torch: one process


class _Held:
    """A saved tensor as autograd keeps it; releases its storage's count when dropped."""

    __slots__ = ("tensor", "tracker", "ptr", "nbytes")

    def __init__(self, tensor: torch.Tensor, tracker: _LiveSaved, ptr: int, nbytes: int):
        self.tensor, self.tracker, self.ptr, self.nbytes = tensor, tracker, ptr, nbytes

    def __del__(self) -> None:
        self.tracker.release(self.ptr, self.nbytes)


class _LiveSaved:
    """saved_tensors_hooks that track the bytes of distinct storages autograd holds for the
    backward (parameters and buffers excluded), and their peak."""

    def __init__(self, modules: Sequence[torch.nn.Module]):
        state = [t for m in modules for t in (*m.parameters(), *m.buffers())]
        self.skip = {t.untyped_storage().data_ptr() for t in state}
        self.refs: dict[int, int] = {}
        self.live = self.peak = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | _Held:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.skip:
            return tensor
        count = self.refs.get(ptr, 0)
        if count == 0:
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self.refs[ptr] = count + 1
        return _Held(tensor, self, ptr, storage.nbytes())

    @staticmethod
    def unpack(held: torch.Tensor | _Held) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def release(self, ptr: int, nbytes: int) -> None:
        self.refs[ptr] -= 1
        if self.refs[ptr] == 0:
            del self.refs[ptr]
            self.live -= nbytes

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context manager that installs the tracking."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _batch(config: BenchConfig, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (rows, config.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class _ChunkBench:
    """One stage module with a micro-batch of inputs, timed with the calls torch's stage makes."""

    def __init__(self, config: BenchConfig, part: Transformer, is_first: bool, is_last: bool):
        tokens, self.targets = _batch(config, config.mbs, config.seed + 1)
        shape = (config.mbs, config.seq_len, config.hidden_size)
        self.x = tokens if is_first else torch.randn(*shape, requires_grad=True)
        self.out_grads = None if is_last else (torch.randn(*shape),)
        self.part, self.is_first, self.is_last = part, is_first, is_last
        self.params = list(part.parameters())
        self.samples: dict[str, list[float]] = {"F": [], "I": [], "W": [], "B": []}

    def forward(self) -> torch.Tensor | tuple[torch.Tensor]:
        """What torch's stage keeps: the loss on the last stage, else the output tuple."""
        out = self.part(self.x)
        return lm_loss(out, self.targets) if self.is_last else (out,)

    def backward_input(self, out) -> list | None:
        """I; skipped on the first stage, whose input needs no gradient (as torch does)."""
        if self.is_first:
            return None
        outputs = [out] if self.is_last else out
        return stage_backward_input(outputs, self.out_grads, [self.x], iter(self.params))[1]

    def backward_weight(self, out, groups: list | None) -> None:
        """W; the whole backward on the first stage (as torch does)."""
        if self.is_first:
            stage_backward(out, self.out_grads, [self.x])
        else:
            stage_backward_weight(iter(self.params), groups)

    def backward(self, out) -> None:
        """The full backward B in one call."""
        stage_backward(out, self.out_grads, [self.x])
        self.x.grad = None

    def time_once(self, keep: bool) -> None:
        """One split pass (F, I, W) and one full pass (F, B); kept as samples when `keep`."""
        clock = time.perf_counter
        t0 = clock()
        out = self.forward()
        t1 = clock()
        groups = self.backward_input(out)
        t2 = clock()
        self.backward_weight(out, groups)
        t3 = clock()
        self.x.grad = None
        out = self.forward()
        t4 = clock()
        self.backward(out)
        t5 = clock()
        if keep:
            self.samples["F"] += [t1 - t0, t4 - t3]
            self.samples["I"].append(t2 - t1)
            self.samples["W"].append(t3 - t2)
            self.samples["B"].append(t5 - t4)

    def saved_bytes(self) -> tuple[int, int, int]:
        """Bytes autograd holds after F, after I, and after W while the output (the loss on
        the last stage, which torch's schedule keeps until the step ends) is still referenced."""
        tracker = _LiveSaved([self.part])
        with tracker.hooks():
            out = self.forward()
        after_forward = tracker.live
        groups = self.backward_input(out)
        after_input = tracker.live
        self.backward_weight(out, groups)
        self.x.grad = None
        return after_forward, after_input, tracker.live

    def profile(self) -> ChunkProfile:
        """Medians of the samples taken so far, and the saved bytes."""
        f, i, w, b = (statistics.median(self.samples[k]) for k in "FIWB")
        saved, held, kept = self.saved_bytes()
        return ChunkProfile(
            stage=-1,
            forward_s=f,
            input_s=i,
            weight_s=w,
            backward_s=b,
            activation_bytes=saved,
            weight_grad_bytes=held,
            retained_bytes=kept,
        )


def _p2p_seconds(config: BenchConfig, rank: int) -> float:
    """Half the median round trip of one activation between ranks 0 and 1 (gloo)."""
    buf = torch.randn(config.mbs, config.seq_len, config.hidden_size)
    samples = []
    dist.barrier()
    for _ in range(5 + config.p2p_repeats):
        start = time.perf_counter()
        ping_pong(buf, rank)
        samples.append((time.perf_counter() - start) / 2)
    value = torch.tensor([statistics.median(samples[5:])], dtype=torch.float64)
    dist.broadcast(value, 0)
    return float(value.item())


def _schedule_step(
    config: BenchConfig, case: Case, parts: list[Transformer], stages: tuple[int, ...], world: int
) -> Callable[[], None]:
    """A function running one step of torch's schedule on this rank's stages."""
    num_stages = world * case.vpp
    pipe = [PipelineStage(part, s, num_stages, torch.device("cpu")) for part, s in zip(parts, stages)]
    cls = get_schedule_class(TORCH_SCHEDULE_CLASS[case.schedule])
    arg = pipe[0] if issubclass(cls, PipelineScheduleSingle) else pipe
    schedule = cls(arg, n_microbatches=config.num_microbatches, loss_fn=lm_loss, scale_grads=False)
    inputs, targets = _batch(config, config.mbs * config.num_microbatches, config.seed + 2)
    has_first, has_last = 0 in stages, num_stages - 1 in stages

    def step() -> None:
        args = (inputs,) if has_first else ()
        schedule.step(*args, target=targets if has_last else None, losses=[] if has_last else None)

    return step


def _timed_steps(step: Callable[[], None], count: int) -> list[float]:
    """Wall time of `count` steps, each started after a barrier; the slowest rank's."""
    times = []
    for _ in range(count):
        dist.barrier()
        start = time.perf_counter()
        step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed.item()))
    return times


def _measure_case(config: BenchConfig, case: Case, rank: int, world: int) -> CaseMeasurement:
    """Profile and run one case; rounds alternate profiling and timed steps so that slow
    periods of a shared machine weigh on both alike."""
    num_stages = world * case.vpp
    stages = rank_stages(rank, world, case.vpp, schedule_info(case.schedule).placement)
    torch.manual_seed(config.seed)
    full = Transformer(config.block_config())
    ranges = stage_layer_ranges(config.num_layers, num_stages)
    parts = [cut(full, *ranges[s], s == 0, s == num_stages - 1) for s in stages]
    del full
    benches = [_ChunkBench(config, part, s == 0, s == num_stages - 1) for part, s in zip(parts, stages)]
    step = _schedule_step(config, case, parts, stages, world)
    dist.barrier()
    for _ in range(config.profile_warmup):
        for bench in benches:
            bench.time_once(keep=False)
    _timed_steps(step, config.warmup_steps)
    step_s = []
    for _ in range(config.rounds):
        dist.barrier()
        for _ in range(config.profile_repeats):
            for bench in benches:
                bench.time_once(keep=True)
        step_s += _timed_steps(step, config.steps)
    p2p_s = _p2p_seconds(config, rank)
    tracker = _LiveSaved(parts)
    dist.barrier()
    with tracker.hooks():
        step()
    profiles = tuple(replace(b.profile(), stage=s) for b, s in zip(benches, stages))
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (profiles, tracker.peak))
    return CaseMeasurement(
        schedule=case.schedule,
        pp=world,
        vpp=case.vpp,
        num_microbatches=config.num_microbatches,
        chunks=tuple(g[0] for g in gathered),
        p2p_s=p2p_s,
        step_s=tuple(step_s),
        peak_saved_bytes=tuple(g[1] for g in gathered),
    )


def _worker(rank: int, world: int, port: int, config: BenchConfig, cases: Sequence[Case], out_path: str) -> None:
    torch.set_num_threads(config.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = [_measure_case(config, case, rank, world) for case in cases]
        if rank == 0:
            with open(out_path, "wb") as f:
                pickle.dump(results, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(
    procs: int, config: BenchConfig = BenchConfig(), cases: Sequence[Case] = DEFAULT_CASES
) -> list[CaseMeasurement]:
    """Spawn `procs` gloo processes and measure every case (see the module docstring)."""
    if procs < 2:
        raise ValueError(f"a pipeline needs at least 2 processes, got {procs}")
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "results.pkl")
        mp.spawn(_worker, args=(procs, _free_port(), config, tuple(cases), out_path), nprocs=procs)
        with open(out_path, "rb") as f:
            return pickle.load(f)
