#!/usr/bin/env bash
# The GPU benchmark, sized to finish in under 8 minutes on one H100/H200: training throughput and MFU of
# SiT-XL/2 and ViT5-XL/2 in bf16, eager and compiled (bench_train.py names the SDPA backend), the ViT-5 / vanilla
# time ratio of a training step and of inference (bench_models.py, interleaved), sampling images/s, and the
# MeanFlow training step (JVP objective, guidance trained in) against the flow step, eager and compiled
# (bench_meanflow.py, interleaved), and the conversion of an official-layout SiT-XL/2 file into an iMF model
# (train.init_from: seconds, and the converted output's largest difference from the flow model's) with the iMF step.
# Needs torch, einops, safetensors, torchdiffeq (nothing here imports diffusers or torch-fidelity).
# Record the printed tables in benchmarks/README.md; the last lines repeat every ViT-5 / vanilla ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
LOG=${LOG:-$(mktemp /tmp/run_gpu.XXXXXX.log)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
{
python benchmarks/bench_train.py --size XL --patch 2 --batch-size 64 --precisions bf16 --modes eager,compiled \
    --iters 10 --warmup 3
python benchmarks/bench_models.py --presets SiT-XL/2 ViT5-XL/2 --batch-size 64 --bf16 --iters 10 --no-memory
python benchmarks/bench_sample.py --size XL --patch 2 --batch-size 128 --steps 50 --bf16 --modes eager,compiled
python benchmarks/bench_meanflow.py --presets SiT-XL/2 ViT5G-XL/2 --input-size 32 --channels 4 --classes 1000 \
    --batch-size 32 --bf16 --iters 6
python benchmarks/bench_meanflow.py --presets SiT-XL/2 ViT5G-XL/2 --input-size 32 --channels 4 --classes 1000 \
    --batch-size 32 --bf16 --iters 6 --compile || echo "bench_meanflow --compile failed (see above)"
python benchmarks/bench_meanflow.py --presets SiT-XL/2 --input-size 32 --channels 4 --classes 1000 \
    --batch-size 32 --bf16 --iters 6 --imf --convert   # train.init_from on an official-layout SiT-XL/2 .pt; iMF step
} 2>&1 | tee "$LOG"
echo "== ViT-5 / vanilla time ratios (train step: bench_train, bench_models; sampling: bench_sample) =="
grep -E '^\| (ViT5-XL/2|eager|compiled) ' "$LOG" || true
