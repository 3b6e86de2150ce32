"""Sensitivity of the zero-bubble paper's interleaved 1F1B ratios to how its sends ran.

The fork the paper released (sail-sg/zero-bubble-pipeline-parallelism, tag zero-bubble-v0.1.0)
runs interleaved 1F1B with overlap_p2p_comm=True (`--no-overlap-p2p-communication` is
store_false; `batch_p2p_comm = not overlap_p2p_comm`), which planner/fidelity/zero_bubble.py
encodes as p2p_mode "overlapped". This script re-prices the 12 1F1B-I ratios as if they had
sent with Megatron-LM's blocking calls instead, once with a hold after each sending action and
once with the simulator's paired calls, by swapping `planner.predict.p2p_mode` for the run:
a what-if, not a prediction.

    PYTHONPATH=$PWD python tests/bench/zb_interleaved_p2p_sensitivity.py
"""

from __future__ import annotations

from pathlib import Path

import planner.pipeline as pipeline
import planner.predict as predict
from planner.fidelity import zero_bubble

ROWS = Path(__file__).parent / "published_zb.toml"


def interleaved_errors() -> list[float]:
    """Predicted / published 1F1B-I ratio - 1 for each setup, under the current patches."""
    zero_bubble.predicted_samples_per_gpu_per_s.cache_clear()
    rows = zero_bubble.load_rows(ROWS)
    return [
        r.predicted_ratio / r.published_ratio - 1
        for r in zero_bubble.evaluate(rows, auto=False)
        if r.row.schedule == "1F1B-I"
    ]


def main() -> None:
    mode, compile_schedule = predict.p2p_mode, pipeline.compile_schedule

    def blocking(model, layout):
        return "blocking" if model.options.pipeline.p2p_mode == "megatron-lm" else mode(model, layout)

    def unpaired(name, pp, m, vpp, segments, exchanges):
        return compile_schedule(name, pp, m, vpp, segments, None)

    cases = [
        ("as encoded (overlapped)", mode, compile_schedule),
        ("blocking, a hold after each sender", blocking, unpaired),
        ("blocking, paired Megatron calls", blocking, compile_schedule),
    ]
    try:
        for label, p2p, compiler in cases:
            predict.p2p_mode, pipeline.compile_schedule = p2p, compiler
            errors = interleaved_errors()
            print(
                f"{label:36s} 1F1B-I ratios: {len(errors)}, mean signed {100 * sum(errors) / len(errors):+.1f}%, "
                f"range {100 * min(errors):+.1f} .. {100 * max(errors):+.1f}%"
            )
    finally:
        predict.p2p_mode, pipeline.compile_schedule = mode, compile_schedule


if __name__ == "__main__":
    main()
