"""Chimera's and Seq1F1B's published comparisons, reproduced as ratios by the simulator.

Sources:
- Li & Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional
  Pipelines", SC'21, Table 1: bubble ratio (D-2)/(2N+D-2) against 1F1B's (D-1)/(N+D-1), the
  "up to 50 % fewer bubbles"; activations per worker within [(D/2+1), D] micro-batches' worth
  against 1F1B's D on the first worker.
- Sun et al., "Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for Large Language
  Model Training", arXiv 2406.03488: bubble (P-1)/(kM+P-1) against 1F1B's (P-1)/(M+P-1), and
  the first stage's activations (P+k-1)/k micro-batches' worth against 1F1B's P.

Run: PYTHONPATH=. python tests/bench/bench_schedule_papers.py
"""

from __future__ import annotations

from planner.schedule import StageCosts, compile_schedule, simulate
from planner.schedule.closed_form import chimera_paper_bubble


def _bubble(name: str, pp: int, m: int, vpp: int = 1, segments: int = 1, f=1.0, b=1.0) -> tuple[float, tuple]:
    result = simulate(compile_schedule(name, pp, m, vpp, segments), StageCosts.uniform(pp, vpp, f, b, 0.0))
    return result.bubble_fraction, result.peak_inflight


def main() -> None:
    print("Chimera vs 1F1B (forward = backward, the paper's Table 1 accounting)")
    print(f"{'D':>3} {'N':>4} {'chimera':>8} {'paper':>8} {'1f1b':>8} {'ratio':>6} {'act chim':>9} {'act 1f1b':>9}")
    for pp, m in ((4, 8), (8, 16), (8, 32), (16, 32), (16, 64), (32, 128)):
        chim, chim_act = _bubble("chimera", pp, m, 2)
        one, one_act = _bubble("1f1b", pp, m)
        print(
            f"{pp:>3} {m:>4} {chim:>8.4f} {chimera_paper_bubble(pp, m):>8.4f} {one:>8.4f} {chim / one:>6.3f} "
            f"{max(chim_act):>9} {max(one_act):>9}"
        )
    print("\nSeq1F1B vs 1F1B (equal segments; activations in micro-batches' worth on the first stage)")
    print(
        f"{'P':>3} {'M':>4} {'k':>2} {'seq1f1b':>8} {'paper':>8} {'1f1b':>8} {'ratio':>6} {'act seq':>8} {'act 1f1b':>9}"
    )
    for pp, m, k in ((4, 8, 2), (4, 8, 4), (8, 16, 2), (8, 16, 4), (8, 16, 8), (16, 32, 4)):
        seq, seq_act = _bubble("seq1f1b", pp, m, 1, k, f=1.0 / k, b=1.0 / k)
        one, one_act = _bubble("1f1b", pp, m)
        paper = (pp - 1) / (k * m + pp - 1)
        print(
            f"{pp:>3} {m:>4} {k:>2} {seq:>8.4f} {paper:>8.4f} {one:>8.4f} {seq / one:>6.3f} "
            f"{seq_act[0] / k:>8.3f} {one_act[0]:>9}"
        )


if __name__ == "__main__":
    main()
