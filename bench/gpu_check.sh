#!/usr/bin/env bash
# The GPU check, for whoever has an NVIDIA GPU: the engine's exactness on CUDA, then verify latency
# against k and decode throughput against concurrency, on the embedded Gemma 3 270M and on a
# larger model named on the command line (a local directory or .gguf; nothing is downloaded).
#
#   pip install --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0   # a CUDA build of torch
#   pip install -e '.[dev]'
#   bench/gpu_check.sh [LARGER_MODEL] [OUT_DIR]
#
# fp32 must be exact (the script fails otherwise); bf16 reports how far outputs agree
# (docs/performance.md, "Greedy equality on GPUs").
set -euo pipefail
larger="${1:-}"
out="${2:-gpu-check}"
mkdir -p "$out"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: install a CUDA build of torch')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python -m specdec.bench.gpu_engine --device cuda --dtype fp32 --json "$out/embedded-fp32.json"
python -m specdec.bench.gpu_engine --device cuda --dtype bf16 --json "$out/embedded-bf16.json"
if [ -n "$larger" ]; then
  python -m specdec.bench.gpu_engine --device cuda --dtype bf16 --model "$larger" --json "$out/larger-bf16.json"
fi
echo "results in $out/"
