"""Reading a training run's own log: Megatron-LM's and torchtitan's progress lines.

Megatron-LM (`megatron/training/training.py`, `training_log` and `report_memory`) prints, from
the last pipeline rank every `--log-interval` iterations,

    [2024-04-06 03:02:12] iteration       71/     100 | consumed samples:  9088 |
      elapsed time per iteration (ms): 5361.6 | throughput per GPU (TFLOP/s/GPU): 243.6 | ...

(recent releases print `elapsed time per iteration (ms): 5361.6/5402.3`, the interval's and
the running mean; older ones have no timestamp and no throughput), the time averaged over the
interval; and once, from each rank of the first data-parallel group,

    [Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: ... |
      reserved: ... | max reserved: ...

(older releases: `after 5 iterations memory (MB) | ...`), in MiB (bytes / 2**20).

torchtitan (`torchtitan/components/metrics.py`, `MetricsProcessor.log`) prints every
`log_freq` steps, in colour,

    step: 200  loss:  6.1384  grad_norm: 0.51  memory: 49.66GiB(52.28%)  tps: 5,856
      tflops: 339.16  mfu: 34.29%

where `tps` is the tokens the rank processed since the last report over the time since it,
divided by the non-data-parallel degree (TP x PP x CP): tokens per second per GPU, so a step
takes global_batch x seq / (tps x GPUs). `memory` is the device's peak reserved memory, GiB.
Older releases print `wps` for `tps` and no `tflops`.

Lines may carry ANSI colour codes, timestamps and launcher prefixes (`[rank0]:`, `0:`,
`[default0]:`), and several ranks may print the same report: the parser looks for the fields
anywhere in a line, and keeps each step once (the lowest rank that printed it).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from planner.errors import PlannerError

LOG_FORMATS = ("megatron", "torchtitan")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)?(\d+)\]:|(\d+):\s)")

_MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUMBER)
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUMBER)
_MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
_MEGATRON_MEMORY = re.compile(
    r"(?:\[Rank (\d+)\]\s*)?\(?after (\d+) iterations\)? memory \(MB\)\s*\|\s*allocated:\s*"
    + _NUMBER
    + r"\s*\|\s*max allocated:\s*"
    + _NUMBER
    + r"\s*\|\s*reserved:\s*"
    + _NUMBER
    + r"\s*\|\s*max reserved:\s*"
    + _NUMBER
)
_TITAN_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:")
_TITAN_MEMORY = re.compile(r"\bmemory:\s*" + _NUMBER + r"\s*GiB\(\s*" + _NUMBER + r"%\)")
_TITAN_TPS = re.compile(r"\b(?:tps|wps):\s*" + _NUMBER)
_TITAN_TFLOPS = re.compile(r"\btflops:\s*" + _NUMBER)
_TITAN_MFU = re.compile(r"\bmfu:\s*" + _NUMBER + r"%")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """One progress report: the step it was printed at and what it says."""

    step: int
    step_time_s: float | None = None
    """Megatron-LM: the mean iteration time over the report's interval."""
    tokens_per_s_per_gpu: float | None = None
    """torchtitan: tokens per second per GPU over the report's interval."""
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    """Fraction (0.34 for 34%)."""
    reserved_gib: float | None = None
    """torchtitan: the device's peak reserved memory so far."""
    memory_fraction: float | None = None
    global_batch: int | None = None
    """Megatron-LM: the global batch size the iteration trained."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    """Megatron-LM's memory line of one rank, MiB (what it calls MB)."""

    rank: int | None
    iteration: int
    allocated_mib: float
    max_allocated_mib: float
    reserved_mib: float
    max_reserved_mib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingLog:
    """What a training log says about speed and memory."""

    format: str
    """"megatron" or "torchtitan"."""
    steps: tuple[StepReport, ...]
    memory: tuple[MemoryReport, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """A log's steady state: medians over the reports after the warm-up ones."""

    format: str
    steps_used: tuple[int, ...]
    """The steps whose reports the medians are over."""
    step_time_s: float | None
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    mfu: float | None
    max_allocated_gib: float | None
    """Largest peak allocated memory over the ranks that reported it."""
    max_reserved_gib: float | None
    """Largest peak reserved memory (what nvidia-smi shows, less the CUDA context)."""
    global_batch: int | None = None
    """Megatron-LM: the global batch of the last report used (None when not printed)."""

    def step_time_for(self, tokens_per_step: float, num_gpus: int) -> float:
        """Seconds per step: Megatron-LM's own figure, or torchtitan's from its tokens/s/GPU."""
        if self.step_time_s is not None:
            return self.step_time_s
        assert self.tokens_per_s_per_gpu is not None
        return tokens_per_step / (self.tokens_per_s_per_gpu * num_gpus)


def detect_format(text: str) -> str:
    """ "megatron" or "torchtitan": the format whose progress lines the text has."""
    clean = _ANSI.sub("", text)
    if _MEGATRON_TIME.search(clean):
        return "megatron"
    if _TITAN_STEP.search(clean) and _TITAN_TPS.search(clean):
        return "torchtitan"
    raise PlannerError(
        "no training progress lines found: expected Megatron-LM's 'elapsed time per iteration (ms)' "
        "or torchtitan's 'step: N  loss: ...  tps: ...' lines"
    )


def parse_log(text: str) -> TrainingLog:
    """The progress and memory reports of a Megatron-LM or torchtitan log (auto-detected)."""
    kind = detect_format(text)
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    if kind == "megatron":
        return TrainingLog(format=kind, steps=_dedupe(_megatron_steps(lines)), memory=tuple(_megatron_memory(lines)))
    return TrainingLog(format=kind, steps=_dedupe(_titan_steps(lines)))


def steady_state(log: TrainingLog, skip_steps: int | None = None) -> Measured:
    """Medians over the steady-state reports: those after step `skip_steps`, by default
    every report but the first (which carries start-up, compilation and allocator warm-up)."""
    timed = [s for s in log.steps if s.step_time_s is not None or s.tokens_per_s_per_gpu is not None]
    if not timed:
        raise PlannerError(f"the {log.format} log has no report with a step time or tokens/s")
    skip = timed[0].step if skip_steps is None else skip_steps
    used = [s for s in timed if s.step > skip]
    if not used:
        last = timed[-1].step
        raise PlannerError(
            f"every timed report is at or before step {skip} (the last is step {last}), which are "
            "skipped as warm-up: pass a smaller --skip-steps or a longer log"
        )
    reserved = [s.reserved_gib for s in log.steps if s.reserved_gib is not None]
    return Measured(
        format=log.format,
        steps_used=tuple(s.step for s in used),
        step_time_s=_median([s.step_time_s for s in used]),
        tokens_per_s_per_gpu=_median([s.tokens_per_s_per_gpu for s in used]),
        tflops_per_gpu=_median([s.tflops_per_gpu for s in used]),
        mfu=_median([s.mfu for s in used]),
        max_allocated_gib=max((m.max_allocated_mib / 1024 for m in log.memory), default=None),
        max_reserved_gib=max([m.max_reserved_mib / 1024 for m in log.memory] + reserved, default=None),
        global_batch=used[-1].global_batch,
    )


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _rank_of(line: str) -> int:
    match = _RANK_PREFIX.match(line)
    if not match:
        return -1
    return int(match.group(1) or match.group(2))


def _megatron_steps(lines: list[str]) -> list[tuple[int, StepReport]]:
    out = []
    for line in lines:
        iteration, time = _MEGATRON_ITERATION.search(line), _MEGATRON_TIME.search(line)
        if not (iteration and time):
            continue
        tflops, batch = _MEGATRON_TFLOPS.search(line), _MEGATRON_BATCH.search(line)
        out.append(
            (
                _rank_of(line),
                StepReport(
                    step=int(iteration.group(1)),
                    step_time_s=_number(time.group(1)) / 1e3,
                    tflops_per_gpu=_number(tflops.group(1)) if tflops else None,
                    global_batch=int(batch.group(1)) if batch else None,
                ),
            )
        )
    return out


def _megatron_memory(lines: list[str]) -> list[MemoryReport]:
    out = []
    for line in lines:
        match = _MEGATRON_MEMORY.search(line)
        if match:
            rank, iteration, *mib = match.groups()
            out.append(
                MemoryReport(
                    rank=int(rank) if rank is not None else None,
                    iteration=int(iteration),
                    allocated_mib=_number(mib[0]),
                    max_allocated_mib=_number(mib[1]),
                    reserved_mib=_number(mib[2]),
                    max_reserved_mib=_number(mib[3]),
                )
            )
    return out


def _titan_steps(lines: list[str]) -> list[tuple[int, StepReport]]:
    out = []
    for line in lines:
        step, tps = _TITAN_STEP.search(line), _TITAN_TPS.search(line)
        if not (step and tps):
            continue
        memory, tflops, mfu = _TITAN_MEMORY.search(line), _TITAN_TFLOPS.search(line), _TITAN_MFU.search(line)
        out.append(
            (
                _rank_of(line),
                StepReport(
                    step=int(step.group(1)),
                    tokens_per_s_per_gpu=_number(tps.group(1)),
                    tflops_per_gpu=_number(tflops.group(1)) if tflops else None,
                    mfu=_number(mfu.group(1)) / 100 if mfu else None,
                    reserved_gib=_number(memory.group(1)) if memory else None,
                    memory_fraction=_number(memory.group(2)) / 100 if memory else None,
                ),
            )
        )
    return out


def _dedupe(reports: list[tuple[int, StepReport]]) -> tuple[StepReport, ...]:
    """One report per step, the lowest rank's (ranks of a step print the same interval)."""
    chosen: dict[int, tuple[int, StepReport]] = {}
    for rank, report in reports:
        if report.step not in chosen or rank < chosen[report.step][0]:
            chosen[report.step] = (rank, report)
    return tuple(report for _, report in sorted(chosen.values(), key=lambda item: item[1].step))
