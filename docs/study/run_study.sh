#!/usr/bin/env bash
# The small-scale backbone study: SiT-T/4 vs ViT5-T/4, same size, data, seed and budget, on a CPU.
# Trains both (in parallel, one core each), then samples and evaluates every checkpoint with real
# Inception features, and writes docs/study/compare.{md,json} and docs/study/fid_vs_step.png.
#   bash docs/study/run_study.sh            # ~45 min training + ~15 min evaluation on 2 cores
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/study}
SEED=${SEED:-0}
NUM_SAMPLES=${NUM_SAMPLES:-500}
mkdir -p "$OUT"
python -m vit5_sit.data mnist data/mnist32 --resolution 32
for arch in sit vit5; do
  OMP_NUM_THREADS=1 python train.py --config configs/mnist/$arch.yaml output_dir="$OUT" train.seed="$SEED" \
      log.tracker=tensorboard > "$OUT/$arch.log" 2>&1 &
done
wait
# Reference statistics of 1,000 real digits (100 per class), computed once.
python -m vit5_sit.data mnist data/mnist32-ref --resolution 32 --limit-per-class 100
[ -f "$OUT/mnist_ref.npz" ] || python eval_fid.py ref --data data/mnist32-ref --out "$OUT/mnist_ref.npz"
OMP_NUM_THREADS=1 python eval_fid.py compare "$OUT/mnist-sit" "$OUT/mnist-vit5" --ref "$OUT/mnist_ref.npz" \
    --num-samples "$NUM_SAMPLES" --sampler ode --method heun --steps 15 --metrics fid,pr --out docs/study
