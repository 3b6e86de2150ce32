"""Measure one layer kind at one shape on the real device: forward, backward-input (I),
backward-weight (W) and full-backward time, activation memory, peak memory, parameters.

The only module of planner that imports torch at module level; everything else imports it
lazily. Each shape builds its layer from `planner.torch_blocks` at the tensor-parallel
shard's size (heads, KV heads, FFN and vocabulary divided by tp), feeds it random inputs
and repeats:

  forward, then I (`stage_backward_input`) and W (`stage_backward_weight`), the split
  torch.distributed.pipelining runs for zero-bubble schedules; then forward again and the
  full backward in one call (`stage_backward`), so I + W can be checked against it.

The embedding's input (token ids) has no gradient; for it, as for the runtime's first
stage, I is empty and W runs the whole backward. Times are medians over repeats after
warm-up: CUDA events at the phase boundaries on a GPU (synchronised before each pass, not
between its phases), perf_counter on a CPU.
Parameter gradients accumulate across repeats, as they do across micro-batches.

Memory: a saved_tensors_hooks pass counts the distinct storages autograd keeps for the
backward (parameters excluded); under recompute "full" the checkpoint keeps only the block
input. On CUDA, memory_allocated deltas and the peak over forward plus backward are
recorded too. Out of memory at a shape returns an "oom" row (the allocator is capped with
--memory-cap-gb on CUDA; on a CPU the cap is checked against parameters, their gradients,
the input and the tensors saved for backward) and the device is cleaned for the next shape.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.pipelining._backward import (
    stage_backward,
    stage_backward_input,
    stage_backward_weight,
)
from torch.utils.checkpoint import checkpoint

from planner.errors import PlannerError
from planner.profile.blocks import build_transformer, check_block
from planner.profile.counts import PhaseCounter
from planner.profile.schema import LayerRow, ShapeKey
from planner.spec import ModelSpec
from planner.torch_blocks import BlockConfig, Embedding, Head, lm_loss

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_LAYER_CLASSES = {"embedding": Embedding, "head": Head}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How to measure: device ("cuda" or "cpu"), dtype name, warm-up and timed repeats,
    an optional memory cap in bytes, and whose transformer block (`planner.profile.blocks`)."""

    device: str
    dtype: str = "bf16"
    warmup: int = 3
    repeats: int = 10
    memory_cap_bytes: int | None = None
    block: str = "planner"


def default_device() -> str:
    """ "cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare(settings: Settings) -> None:
    """Check the device and apply the memory cap (CUDA: the caching allocator's limit); on a
    CPU, keep freed memory in the process as a caching allocator would."""
    if settings.device == "cpu":
        keep_freed_cpu_memory()
    elif settings.device == "cuda":
        if not torch.cuda.is_available():
            raise PlannerError("--device cuda: no CUDA device is visible to torch")
        if settings.memory_cap_bytes is not None:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, settings.memory_cap_bytes / total))
    else:
        raise PlannerError(f"unknown device '{settings.device}': choose cuda or cpu")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20


def keep_freed_cpu_memory() -> None:
    """Stop glibc from handing large freed blocks back to the kernel, so a CPU timing does
    not count fresh page faults: the split backward keeps its graph alive until W, and
    without this every I step maps new pages where the full backward reuses freed ones
    (measured: I + W reads 1.2-1.25 B on the head instead of about 1.1). No-op off glibc."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _GLIBC_MMAP_THRESHOLD_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, 2**40)


def environment(device: str) -> dict[str, Any]:
    """The Profile fields describing where the measurements run."""
    info: dict[str, Any] = {"device_type": device, "torch_version": torch.__version__}
    if device == "cuda":
        info["device"] = torch.cuda.get_device_name()
        info["cuda_version"] = torch.version.cuda
        info["driver_version"] = _nvidia_driver_version()
    else:
        info["device"] = f"cpu ({platform.machine()})"
    return info


def _nvidia_driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def build_layer(
    spec: ModelSpec, kind: str, tp: int, seq: int, device: str | torch.device, block: str = "planner"
) -> torch.nn.Module:
    """One layer of `kind` at the tp-sharded shape, fp32 on `device` (heads, KV heads and
    FFN divided by tp as in `ModelSpec.block_fields`; the vocabulary too, vocab-parallel).
    The transformer kind is `block`'s runtime's block; embedding and head are planner's."""
    if kind == "transformer":
        return build_transformer(block, spec, tp, seq, device)
    fields = spec.block_fields(tp, max(seq, spec.max_position_embeddings))
    if kind in ("embedding", "head"):
        fields["vocab_size"] = math.ceil(spec.vocab_size / tp)
    with torch.device(device):
        return _LAYER_CLASSES[kind](BlockConfig(**fields))


def param_count(spec: ModelSpec, kind: str, tp: int, block: str = "planner") -> int:
    """Parameters of one layer of `kind` on one of tp GPUs (built on the meta device)."""
    layer = build_layer(spec, kind, tp, 1, "meta", block)
    return sum(p.numel() for p in layer.parameters())


def measure_shape(spec: ModelSpec, key: ShapeKey, settings: Settings) -> LayerRow:
    """Measure `key`; an "oom" or "error" row (with the reason) when it cannot run."""
    check_block(settings.block, spec, settings.device)
    params = param_count(spec, key.kind, key.tp, settings.block)
    try:
        return _measure(spec, key, settings, params)
    except (RuntimeError, MemoryError) as exc:  # torch raises RuntimeError subclasses
        status, message = _classify(exc)
    _release(settings.device)  # after the except block: the traceback's tensors are gone
    return LayerRow(
        kind=key.kind,
        tp=key.tp,
        mbs=key.mbs,
        seq=key.seq,
        recompute=key.recompute,
        status=status,
        message=message,
        param_count=params,
    )


def _measure(spec: ModelSpec, key: ShapeKey, settings: Settings, params: int) -> LayerRow:
    torch.manual_seed(0)
    case = LayerCase.build(spec, key, settings)
    clock = _Clock(case.device)
    saved_bytes, alloc, peak = case.memory_pass(settings.memory_cap_bytes)
    for _ in range(settings.warmup):
        case.split_pass(clock)
        case.full_pass(clock)
    if case.device.type == "cuda":  # again, now that workspaces and caches exist
        saved_bytes, alloc, peak = case.memory_pass(None)
    counts = case.count_pass()
    samples: dict[str, list[float]] = {"forward": [], "input": [], "weight": [], "full": []}
    for _ in range(settings.repeats):
        forward, backward_input, backward_weight = case.split_pass(clock)
        forward_again, full = case.full_pass(clock)
        samples["forward"] += [forward, forward_again]
        samples["input"].append(backward_input)
        samples["weight"].append(backward_weight)
        samples["full"].append(full)
    ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    return LayerRow(
        kind=key.kind,
        tp=key.tp,
        mbs=key.mbs,
        seq=key.seq,
        recompute=key.recompute,
        status="ok",
        forward_ms=ms["forward"],
        backward_input_ms=ms["input"],
        backward_weight_ms=ms["weight"],
        backward_ms=ms["full"],
        activation_bytes=saved_bytes,
        forward_alloc_bytes=alloc,
        peak_bytes=peak,
        param_count=params,
        **counts,
    )


class _Clock:
    """Times the phases of one pass: perf_counter on a CPU; on CUDA an event at each phase
    boundary, read when the pass is done. There is no synchronisation between phases, so
    one phase's Python work overlaps the kernels still running from the one before, as it
    does in a running pipeline."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def start(self) -> None:
        """Begin a pass on an idle device."""
        if self.cuda:
            torch.cuda.synchronize()
        self.marks = [self._mark()]

    def lap(self) -> None:
        """End the current phase (and begin the next)."""
        self.marks.append(self._mark())

    def laps(self) -> list[float]:
        """Seconds of each phase of the pass."""
        if not self.cuda:
            return [b - a for a, b in zip(self.marks, self.marks[1:])]
        self.marks[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


@dataclass
class LayerCase:
    """A layer, its random inputs and the gradient arriving at its output."""

    kind: str
    recompute: str
    layer: torch.nn.Module
    inputs: torch.Tensor
    """Token ids (embedding) or hidden states that require grad."""
    targets: torch.Tensor | None
    output_grad: torch.Tensor | None
    device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        self.device = self.inputs.device

    @classmethod
    def build(cls, spec: ModelSpec, key: ShapeKey, settings: Settings) -> LayerCase:
        dtype = TORCH_DTYPES[settings.dtype]
        device = torch.device(settings.device)
        layer = build_layer(spec, key.kind, key.tp, key.seq, device, settings.block).to(dtype)
        vocab = math.ceil(spec.vocab_size / key.tp)
        shape = (key.mbs, key.seq)
        targets = output_grad = None
        if key.kind == "embedding":
            inputs = torch.randint(0, vocab, shape, device=device)
            output_grad = torch.randn(*shape, spec.hidden_size, device=device, dtype=dtype)
        else:
            inputs = torch.randn(*shape, spec.hidden_size, device=device, dtype=dtype, requires_grad=True)
            if key.kind == "head":
                targets = torch.randint(0, vocab, shape, device=device)
            else:
                output_grad = torch.randn_like(inputs, requires_grad=False)
        return cls(key.kind, key.recompute, layer, inputs, targets, output_grad)

    def forward(self) -> torch.Tensor:
        if self.kind == "head":
            return lm_loss(self.layer(self.inputs), self.targets)
        if self.recompute == "full":
            return checkpoint(self.layer, self.inputs, use_reentrant=False)
        return self.layer(self.inputs)

    def _grads(self) -> list[torch.Tensor] | None:
        return None if self.output_grad is None else [self.output_grad]

    def _params(self) -> Iterator[torch.nn.Parameter]:
        return self.layer.parameters()

    def backward(self, out: torch.Tensor) -> None:
        """The full backward from `out`, the output of `forward()`: input and weight gradients."""
        stage_backward([out], self._grads() or [None], [self.inputs])

    def split_pass(self, clock: _Clock) -> tuple[float, float, float]:
        """Forward, backward-input and backward-weight seconds."""
        clock.start()
        out = self.forward()
        clock.lap()
        if self.kind == "embedding":  # no input gradient: the whole backward is the W step
            self.backward(out)
            clock.lap()
            forward, weight = clock.laps()
            return forward, 0.0, weight
        _, groups = stage_backward_input([out], self._grads(), [self.inputs], self._params())
        clock.lap()
        stage_backward_weight(self._params(), groups)
        clock.lap()
        self.inputs.grad = None
        forward, backward_input, weight = clock.laps()
        return forward, backward_input, weight

    def full_pass(self, clock: _Clock) -> tuple[float, float]:
        """Forward and full-backward seconds."""
        clock.start()
        out = self.forward()
        clock.lap()
        self.backward(out)
        clock.lap()
        forward, full = clock.laps()
        return forward, full

    def count_pass(self) -> dict[str, int]:
        """FLOPs and operator counts of forward, I, W and the full backward (one split pass
        and one full pass, untimed), as LayerRow fields."""
        counter = PhaseCounter()
        with counter.phase("forward"):
            out = self.forward()
        if self.kind == "embedding":
            with counter.phase("backward_weight"):
                self.backward(out)
        else:
            with counter.phase("backward_input"):
                _, groups = stage_backward_input([out], self._grads(), [self.inputs], self._params())
            with counter.phase("backward_weight"):
                stage_backward_weight(self._params(), groups)
            self.inputs.grad = None
        out = self.forward()
        with counter.phase("backward"):
            self.backward(out)
        return counter.fields()

    def memory_pass(self, cap_bytes: int | None) -> tuple[int, int | None, int | None]:
        """Bytes saved for backward; on CUDA also the forward's allocation and the peak
        above the memory allocated before the forward. On a CPU, `cap_bytes` is checked."""
        cuda = self.device.type == "cuda"
        counter = _SavedTensors(self.layer, None if cuda else cap_bytes, self._base_bytes())
        if cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            out = self.forward()
        if self.recompute == "full":  # the checkpoint keeps the block input for recomputation
            counter.pack(self.inputs)
        alloc = torch.cuda.memory_allocated() - before if cuda else None
        self.backward(out)
        peak = torch.cuda.max_memory_allocated() - before if cuda else None
        return counter.total, alloc, peak

    def _base_bytes(self) -> int:
        params = sum(p.numel() * p.element_size() for p in self.layer.parameters())
        extra = self.output_grad.nbytes if self.output_grad is not None else 0
        return 2 * params + self.inputs.nbytes + extra


class _SavedTensors:
    """A saved_tensors_hooks pack hook adding up distinct storages (the layer's parameters
    and buffers, which live beyond the micro-batch, excluded); raises
    torch.OutOfMemoryError past `cap_bytes` including `base_bytes`."""

    def __init__(self, layer: torch.nn.Module, cap_bytes: int | None, base_bytes: int):
        state = [*layer.parameters(), *layer.buffers()]
        self.skip = {t.untyped_storage().data_ptr() for t in state}
        self.seen: set[int] = set()
        self.total = 0
        self.cap_bytes, self.base_bytes = cap_bytes, base_bytes

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.skip and ptr not in self.seen:
            self.seen.add(ptr)
            self.total += storage.nbytes()
            if self.cap_bytes is not None and self.base_bytes + self.total > self.cap_bytes:
                need = (self.base_bytes + self.total) / 2**30
                raise torch.OutOfMemoryError(
                    f"memory cap {self.cap_bytes / 2**30:.3f} GiB exceeded "
                    f"(parameters, gradients, input and saved tensors reach {need:.3f} GiB)"
                )
        return tensor


def _classify(exc: BaseException) -> tuple[str, str]:
    """("oom", reason) for out-of-memory anywhere in the exception chain, else ("error", reason)."""
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for err in chain:
        text = str(err)
        if (
            isinstance(err, (torch.OutOfMemoryError, MemoryError))
            or "out of memory" in text
            or "can't allocate memory" in text
        ):
            return "oom", _first_line(err)
    return "error", _first_line(chain[-1])


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
