#!/usr/bin/env bash
# The multi-seed MNIST backbone study (docs/study/README.md): every arm and seed of configs/study/mnist.yaml
# trained to 2,400 steps first, evaluated (so the 1,200/2,400-step table exists early), then to 3,600 and
# evaluated again. ~75 CPU-minutes per (arm, seed) run on the 2-core development CPU, 27 runs: days, resumable.
#   bash docs/study/run_study.sh            # JOBS=2 by default (two runs at once, one thread each)
# Every step resumes (training --resume auto; samples and metrics cached under each run): re-run to continue.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEC=${SPEC:-configs/study/mnist.yaml}
JOBS=${JOBS:-2}
python -m vit5_sit.data mnist data/mnist32 --resolution 32
# The REPA arm's frozen encoder (configs/mnist/vit5-repa.yaml names it): a small ViT-5 classifier, made once.
[ -f encoders/mnist-vit5.safetensors ] || OMP_NUM_THREADS=2 python -m vit5_sit.repa.classifier --data data/mnist32 \
    --out encoders/mnist-vit5.safetensors
python -m vit5_sit.study train "$SPEC" --until 2400 --jobs "$JOBS"
OMP_NUM_THREADS=2 python -m vit5_sit.study eval "$SPEC"
python -m vit5_sit.study run "$SPEC" --jobs "$JOBS"
