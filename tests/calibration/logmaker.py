"""Synthetic training logs in Megatron-LM's and torchtitan's formats, for a run of known
step time, written as those runtimes print them (format strings of Megatron-LM's
`training_log` / `report_memory` and torchtitan's `MetricsProcessor.log`, with torchtitan's
ANSI colours and launcher prefixes), with a slow first report and +-1% noise around the
true value whose median is the true value."""

from __future__ import annotations

NOISE = (1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0)
"""Per-report factors after the warm-up one: their median is 1."""

_COLORS = {
    "red": "\x1b[31m",
    "green": "\x1b[32m",
    "orange": "\x1b[33m",
    "turquoise": "\x1b[36m",
    "blue": "\x1b[34m",
    "cyan": "\x1b[96m",
    "magenta": "\x1b[35m",
    "reset": "\x1b[39m",
}


def megatron_log(
    step_time_s: float,
    tflops_per_gpu: float,
    global_batch: int,
    peak_mib: dict[int, float],
    interval: int = 10,
    warmup_factor: float = 3.0,
) -> str:
    """Megatron-LM's progress lines every `interval` iterations (the first slowed by
    `warmup_factor`) and one memory line per rank in `peak_mib` after the first interval."""
    lines = ["using world size: 8, data-parallel size: 8, tensor-model-parallel size: 1", "training ..."]
    factors = (warmup_factor, *NOISE)
    total = interval * len(factors)
    for i, factor in enumerate(factors, start=1):
        iteration = i * interval
        ms = step_time_s * factor * 1e3
        lines.append(
            f" [2025-01-0{1 + i % 8} 10:00:{i:02d}] iteration {iteration:8d}/{total:8d} | consumed samples: "
            f"{iteration * global_batch:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
            f"(TFLOP/s/GPU): {tflops_per_gpu / factor:.1f} | learning rate: 1.000000E-04 | global batch size: "
            f"{global_batch:5d} | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |"
        )
        if i == 1:
            for rank, mib in peak_mib.items():
                lines.append(
                    f"{rank}: [Rank {rank}] (after {interval} iterations) memory (MB) | allocated: {mib * 0.6:.1f} | "
                    f"max allocated: {mib * 0.9:.1f} | reserved: {mib:.1f} | max reserved: {mib:.1f}"
                )
    return "\n".join(lines) + "\n"


def torchtitan_log(
    tokens_per_s_per_gpu: float,
    flops_per_token: float,
    peak_flops: float,
    reserved_gib: float,
    capacity_gib: float,
    log_freq: int = 10,
    warmup_factor: float = 3.0,
) -> str:
    """torchtitan's report at step 1 (slowed by `warmup_factor`) and every `log_freq` steps."""
    c = _COLORS
    lines = ["[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - Training starts at step 1"]
    steps = [1] + [log_freq * i for i in range(1, len(NOISE) + 1)]
    for step, factor in zip(steps, (warmup_factor, *NOISE)):
        tps = tokens_per_s_per_gpu / factor
        tflops = flops_per_token * tps / 1e12
        mfu = 100 * flops_per_token * tps / peak_flops
        lines.append(
            f"[rank0]:[titan] 2025-01-01 10:00:{step % 60:02d},000 - root - INFO - "
            f"{c['red']}step: {step:2}  {c['green']}loss: {7.5:8.5f}  {c['orange']}grad_norm: {1.25:7.4f}  "
            f"{c['turquoise']}memory: {reserved_gib:5.2f}GiB({100 * reserved_gib / capacity_gib:.2f}%)  "
            f"{c['blue']}tps: {round(tps):,}  {c['cyan']}tflops: {tflops:,.2f}  "
            f"{c['magenta']}mfu: {mfu:.2f}%{c['reset']}"
        )
    return "\n".join(lines) + "\n"
