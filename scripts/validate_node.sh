#!/usr/bin/env bash
# Profile this node, plan for it, run the plan's exported torch script, compare predicted and
# measured step time, parameters and peak memory per rank (planner/fidelity/validate_node.py).
#
#   scripts/validate_node.sh --model llama3-8b --nproc 8 --global-batch 64 --seq 4096
#   scripts/validate_node.sh --model tiny-llama --nproc 2 --device cpu --global-batch 8 --seq 128 --steps 4
#
# Writes WORKDIR (default ./validate-node): profile.json, plan.json, torch/, report.rank*.json and
# the record validate_node.json. Pass more `planner plan` options after `--`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${here}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m planner.fidelity.validate_node "$@"
