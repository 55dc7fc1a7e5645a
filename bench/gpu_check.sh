#!/usr/bin/env bash
# The GPU check, for whoever has an NVIDIA GPU: the engine's exactness on CUDA, then verify latency
# against k and decode throughput against concurrency, on the embedded Gemma 3 270M and on a
# larger model named on the command line (a local directory or .gguf; nothing is downloaded).
#
#   pip install --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0   # a CUDA build of torch
#   pip install -e '.[dev]'
#   bench/gpu_check.sh [LARGER_MODEL] [OUT_DIR]
#
# fp32 must be exact, eager and compiled (the script fails otherwise); bf16 reports how far outputs
# agree (docs/performance.md, "Greedy equality on GPUs"). Each run times eager and compiled passes
# side by side. On CUDA the verifier keeps full
# logits (the bf16 greedy screen, specdec/runtime/greedy_head.py, serves fp32 CPU heads only), and
# the actor's decoding ahead (target_service/lookahead.py) is device-agnostic: the fp32 exactness
# checks here cover the pass as GPUs run it. The paged decoder (specdec/runtime/paged_decoder.py)
# runs every eager pass (prefills, and decode passes without --compile); the run with
# SPECDEC_PAGED_DECODER=0 gives transformers' modules beside it.
set -euo pipefail
larger="${1:-}"
out="${2:-gpu-check}"
mkdir -p "$out"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: install a CUDA build of torch')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
# Eager beside --compile cudagraphs (the fp32 run must be exact on both), then bf16 beside inductor.
python -m specdec.bench.gpu_engine --device cuda --dtype fp32 --compile cudagraphs --json "$out/embedded-fp32.json"
SPECDEC_PAGED_DECODER=0 python -m specdec.bench.gpu_engine --device cuda --dtype fp32 --compile cudagraphs \
  --json "$out/embedded-fp32-modules.json"
python -m specdec.bench.gpu_engine --device cuda --dtype bf16 --compile cudagraphs --json "$out/embedded-bf16.json"
python -m specdec.bench.gpu_engine --device cuda --dtype bf16 --compile inductor --json "$out/embedded-bf16-inductor.json"
# One random model per family the fused decoder serves, at the embedded model's shapes: fp32 exact
# on CUDA (speculative == target-only, batched == one at a time), eager and compiled.
for family in gemma2 gemma3 llama llama3 mistral qwen2 qwen3 phi3; do
  python -m specdec.bench.gpu_engine --device cuda --dtype fp32 --compile cudagraphs --family "$family" \
    --concurrency 1,16,64 --repeats 3 --json "$out/family-$family-fp32.json"
done
if [ -n "$larger" ]; then
  python -m specdec.bench.gpu_engine --device cuda --dtype bf16 --compile cudagraphs --model "$larger" \
    --json "$out/larger-bf16.json"
fi
echo "results in $out/"
