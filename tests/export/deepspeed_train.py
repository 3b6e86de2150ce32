"""Train an exported DeepSpeed pipeline for two steps (run under torchrun from the export
folder) and write, per rank, a JSON file result-rank{r}.json: its stage boundaries, layer types and losses."""

from __future__ import annotations

import json
import os
import sys

import deepspeed
import torch


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    sys.path.insert(0, os.getcwd())
    import deepspeed_pipeline as exported

    with open("ds_config.json") as file:
        config = json.load(file)
    # CPU run: fp32 (no bf16 kernels needed) and torch's AdamW (DeepSpeed's fused Adam is CUDA).
    config.pop("bf16", None)
    config["optimizer"]["params"]["torch_adam"] = True
    module = exported.build_pipeline_module()
    engine, *_ = deepspeed.initialize(
        model=module, config=config, model_parameters=[p for p in module.parameters() if p.requires_grad]
    )
    gen = torch.Generator().manual_seed(0)
    seq = int(os.environ["PLAN_SEQ"])

    def batches():
        while True:
            tokens = torch.randint(
                0, exported.MODEL["vocab_size"], (config["train_micro_batch_size_per_gpu"], seq + 1), generator=gen
            )
            yield tokens[:, :-1], tokens[:, 1:]

    data = batches()
    losses = [float(engine.train_batch(data)) for _ in range(2)]
    rank = torch.distributed.get_rank()
    # one file per rank: the ranks' stdout lines interleave under torchrun
    with open(f"result-rank{rank}.json", "w") as out:
        json.dump(
            {
                "rank": rank,
                "parts": list(module.parts),
                "layers": [type(f).__name__ for f in module.forward_funcs],
                "losses": losses,
            },
            out,
        )


if __name__ == "__main__":
    main()
