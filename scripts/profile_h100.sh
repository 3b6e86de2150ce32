#!/usr/bin/env bash
# Measure one H100's bf16 and fp8 GEMM throughput by shape (scripts/measure_gemm_table.py: the
# tables gpus.toml's `gemm_table` reads; fp8 has no measured table yet). Then profile
# llama3-8b, llama3-70b and gpt3-175b on one 8-GPU H100 node: every layer kind at
# TP 1, 2, 4, 8, micro-batch 1, 2, 4, sequence 2048, 4096, 8192 (gpt3-175b: 2048 only, its
# 2048 learned positions), with and without full recomputation, in bf16; then the node's
# collectives into each file. Resumable: run it again after an interruption or an error and
# it measures only the shapes the files do not hold yet. Needs torch with CUDA; run from
# the repository root. OUT (default profiles/) is where the files go.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-profiles}"
GPUS="${GPUS:-8}"
mkdir -p "$OUT"

profile() {  # model, sequence lengths
  local model="$1" seqs="$2" file="$OUT/h100-$1.json" resume=()
  [[ -f "$file" ]] && resume=(--resume)
  planner profile --model "$model" --tp 1,2,4,8 --mbs 1,2,4 --seq "$seqs" --recompute none,full \
    --dtype bf16 --device cuda --warmup 3 --repeats 10 "${resume[@]}" -o "$file"
  planner profile --collectives --nproc "$GPUS" --model "$model" \
    --device cuda --warmup 5 --repeats 20 -o "$file"
}

python scripts/measure_gemm_table.py --dtype fp8 -o "$OUT/gemm_h100_fp8.toml"
python scripts/measure_gemm_table.py --dtype bf16 -o "$OUT/gemm_h100_bf16.toml"
profile llama3-8b 2048,4096,8192
profile llama3-70b 2048,4096,8192
profile gpt3-175b 2048

planner calibrate "$OUT"/h100-llama3-8b.json "$OUT"/h100-llama3-70b.json "$OUT"/h100-gpt3-175b.json --gpu h100 --to h200
