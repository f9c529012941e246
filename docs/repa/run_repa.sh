#!/usr/bin/env bash
# REPA measured on MNIST: the study's `vit5` arm (configs/mnist/vit5.yaml) against its `vit5-repa` arm
# (configs/mnist/vit5-repa.yaml: the same plus REPA on block 2 of 6), training seeds 0 and 1, same data, seed,
# optimiser and budget; evaluated exactly as every other study arm (FID-1000 + precision/recall against all
# 5,000 digits at 1,200 / 2,400 / 3,600 steps), reported in docs/study/study.md.
#   bash docs/repa/run_repa.sh                 # ~75-85 CPU-minutes per run, four runs; resumable
#   UNTIL=2400 bash docs/repa/run_repa.sh      # a first pass to 2,400 steps
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEC=${SPEC:-configs/study/mnist.yaml}
JOBS=${JOBS:-2}
UNTIL=${UNTIL:-3600}
ENCODER=encoders/mnist-vit5.safetensors   # the path configs/mnist/vit5-repa.yaml names
python -m vit5_sit.data mnist data/mnist32 --resolution 32
# The frozen encoder REPA aligns to: a small ViT-5 classifier on the same 5,000 digits (made once, minutes).
[ -f "$ENCODER" ] || OMP_NUM_THREADS=2 python -m vit5_sit.repa.classifier --data data/mnist32 --out "$ENCODER"
python -m vit5_sit.study train "$SPEC" --arms vit5,vit5-repa --seeds 0,1 --until "$UNTIL" --jobs "$JOBS"
OMP_NUM_THREADS=2 python -m vit5_sit.study eval "$SPEC"
