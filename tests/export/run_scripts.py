"""Run several exported training scripts, one after the other, in the processes of one
torchrun launch, so torch is imported once: `run_scripts.py ARGS -- SCRIPT [SCRIPT ...]`
runs each SCRIPT as __main__ with ARGS and prints `=== SCRIPT` (rank 0) before its output;
`SCRIPT|--flag|value` appends those arguments for that script only.

Each script initialises and destroys its own process group. Its rendezvous keys go under a
prefix of their own in torchrun's store, so one script's addresses never reach the next.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch.distributed as dist


def main() -> None:
    split = sys.argv.index("--")
    args, scripts = sys.argv[1:split], sys.argv[split + 1 :]
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    init_process_group = dist.init_process_group
    for number, item in enumerate(scripts, start=1):
        script, *extra = item.split("|")

        def init(backend=None, _prefix=f"script{number}", **kwargs):
            kwargs.setdefault("store", dist.PrefixStore(_prefix, agent_store))
            kwargs.setdefault("rank", int(os.environ["RANK"]))
            kwargs.setdefault("world_size", int(os.environ["WORLD_SIZE"]))
            return init_process_group(backend, **kwargs)

        dist.init_process_group = init
        if os.environ["RANK"] == "0":
            print(f"=== {item}", flush=True)
        sys.argv = [script, *args, *extra]
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
