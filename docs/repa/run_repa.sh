#!/usr/bin/env bash
# REPA measured on MNIST: ViT5-T/4 (configs/mnist/vit5.yaml) with and without REPA (configs/mnist/vit5-repa.yaml),
# same data, seed, optimiser and budget, trained side by side (one thread each), for each training seed; then
# every 1,200-step checkpoint sampled and evaluated with real Inception features (FID and precision/recall of
# 500 unguided samples against 1,000 real digits); writes docs/repa/compare_seedS.{md,json}.
#   bash docs/repa/run_repa.sh                 # seeds 0 and 1: ~2.5 h per seed on 2 idle cores
#   SEEDS=0 STEPS=1200 bash docs/repa/run_repa.sh
# Training resumes (--resume auto) and evaluation is cached per checkpoint, so it can be re-run after an
# interruption, or with a larger STEPS to extend the runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/repa}
SEEDS=${SEEDS:-"0 1"}
STEPS=${STEPS:-3600}
NUM_SAMPLES=${NUM_SAMPLES:-500}
ENCODER=${ENCODER:-encoders/mnist-vit5.safetensors}
mkdir -p "$OUT"
python -m vit5_sit.data mnist data/mnist32 --resolution 32
# The frozen encoder REPA aligns to: a small ViT-5 classifier on the same 5,000 digits (made once).
[ -f "$ENCODER" ] || OMP_NUM_THREADS=2 python -m vit5_sit.repa.classifier --data data/mnist32 --out "$ENCODER"
python -m vit5_sit.data mnist data/mnist32-ref --resolution 32 --limit-per-class 100
[ -f "$OUT/mnist_ref.npz" ] || python eval_fid.py ref --data data/mnist32-ref --out "$OUT/mnist_ref.npz"
for seed in $SEEDS; do
  OMP_NUM_THREADS=1 python train.py --config configs/mnist/vit5.yaml output_dir="$OUT" name="vit5-s$seed" \
      train.seed="$seed" train.max_steps="$STEPS" --resume auto > "$OUT/vit5-s$seed.log" 2>&1 &
  OMP_NUM_THREADS=1 python train.py --config configs/mnist/vit5-repa.yaml output_dir="$OUT" name="vit5-repa-s$seed" \
      train.seed="$seed" train.max_steps="$STEPS" repa.encoder="$ENCODER" --resume auto > "$OUT/vit5-repa-s$seed.log" 2>&1 &
  wait
  OMP_NUM_THREADS=2 python eval_fid.py compare "$OUT/vit5-s$seed" "$OUT/vit5-repa-s$seed" --ref "$OUT/mnist_ref.npz" \
      --every 1200 --num-samples "$NUM_SAMPLES" --sampler ode --method heun --steps 15 --metrics fid,pr \
      --out "docs/repa/seed$seed"
done
