"""Measured fused-attention rates by sequence length: the falloff of a kernel's FLOP/s at short
sequences, read from a preset data file (planner/presets/attention_*.toml).

The file records one attention layer's forward and backward times per sequence length for each
kernel it measured, at one shape (batch, query and key/value heads, head dimension, causal
mask). Its FLOP/s are derived from the times with the FlashAttention papers' count (4 b s^2 h d
for the forward, halved under a causal mask; the backward 2.5x), the count the planner charges.

The GPU preset states each kernel's rate at the file's `reference_seq` (`cudnn_fwd`, ...); a
sequence of length s runs at that rate times `falloff(s)` = rate(s) / rate(reference_seq),
interpolated linearly in log2 s on log rate between the measured lengths and held at the
nearest measured length beyond them. A calibration that moves the scalar rate so moves the
whole curve.
"""

from __future__ import annotations

import bisect
import math
import tomllib
from dataclasses import dataclass
from functools import cache

from planner.errors import ConfigError
from planner.presets import read_table

FLASH_BACKWARD_FLOP_RATIO = 2.5
"""Flash attention's backward executes 5 matmuls per 2 of the forward (it recomputes QK^T)."""


@dataclass(frozen=True, slots=True)
class KernelCurve:
    """One kernel's measured forward and backward FLOP/s at ascending sequence lengths."""

    seqs: tuple[int, ...]
    log_fwd: tuple[float, ...]
    log_bwd: tuple[float, ...]

    def rate(self, seq: float, backward: bool) -> float:
        """FLOP/s at sequence length `seq` (interpolated; held beyond the measured lengths)."""
        logs = self.log_bwd if backward else self.log_fwd
        if seq <= self.seqs[0]:
            return math.exp(logs[0])
        if seq >= self.seqs[-1]:
            return math.exp(logs[-1])
        hi = bisect.bisect_right(self.seqs, seq)
        s0, s1 = self.seqs[hi - 1], self.seqs[hi]
        weight = math.log2(seq / s0) / math.log2(s1 / s0)
        return math.exp((1 - weight) * logs[hi - 1] + weight * logs[hi])


@dataclass(frozen=True, slots=True)
class AttentionTable:
    """Measured attention kernels of one GPU, and the length its preset's rates are stated at."""

    name: str
    reference_seq: int
    kernels: dict[str, KernelCurve]
    source: str

    def rate(self, kernel: str, seq: float, backward: bool) -> float:
        """Measured FLOP/s of `kernel` at sequence length `seq`."""
        return self.kernels[kernel].rate(seq, backward)

    def falloff(self, kernel: str, seq: float, backward: bool) -> float | None:
        """`kernel`'s rate at `seq` over its rate at the reference length (None: not measured)."""
        curve = self.kernels.get(kernel)
        if curve is None:
            return None
        return curve.rate(seq, backward) / curve.rate(self.reference_seq, backward)


def forward_flops(batch: int, seq: int, query_heads: int, head_dim: int, causal: bool) -> float:
    """FLOPs of one attention core's forward (QK^T and PV), the causal half under a causal mask."""
    full = 4.0 * batch * seq * seq * query_heads * head_dim
    return full / 2 if causal else full


@cache
def load_attention_table(file_name: str) -> AttentionTable:
    """The table in planner/presets/`file_name` (read once per process)."""
    return parse_attention_table(read_table(file_name, "attention"), file_name)


def parse_attention_table(text: str, name: str) -> AttentionTable:
    """The table an attention table file's `text` holds (ConfigError on a malformed one)."""
    data = tomllib.loads(text)
    kernels: dict[str, KernelCurve] = {}
    for kernel, entry in data["kernels"].items():
        points = sorted(entry["points"])
        seqs = tuple(int(p[0]) for p in points)
        if len(set(seqs)) != len(seqs) or any(t <= 0 for p in points for t in p[1:]):
            raise ConfigError(f"attention table '{name}': repeated length or non-positive time in '{kernel}'")
        flops = [forward_flops(data["batch"], s, data["query_heads"], data["head_dim"], data["causal"]) for s in seqs]
        kernels[kernel] = KernelCurve(
            seqs=seqs,
            log_fwd=tuple(math.log(f / (p[1] * 1e-3)) for f, p in zip(flops, points)),
            log_bwd=tuple(math.log(FLASH_BACKWARD_FLOP_RATIO * f / (p[2] * 1e-3)) for f, p in zip(flops, points)),
        )
    return AttentionTable(name=name, reference_seq=int(data["reference_seq"]), kernels=kernels, source=data["source"])
