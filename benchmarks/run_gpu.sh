#!/usr/bin/env bash
# The GPU benchmark, sized to finish in under 8 minutes on one H100/H200: training throughput and MFU of
# SiT-XL/2 and ViT5-XL/2 in bf16, eager and compiled, and sampling images/s. Needs torch, einops,
# safetensors, torchdiffeq (no diffusers / torch-fidelity). Record the printed tables in benchmarks/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python benchmarks/bench_train.py --size XL --patch 2 --batch-size 64 --precisions bf16 --modes eager,compiled \
    --iters 10 --warmup 3
python benchmarks/bench_sample.py --size XL --patch 2 --batch-size 128 --steps 50 --bf16 --modes eager,compiled
