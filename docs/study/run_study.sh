#!/usr/bin/env bash
# The small-scale backbone study on a CPU: SiT-T/4 vs ViT5-T/4 vs ViT5-T/4 without LayerScale, same size,
# data, seed and optimiser, trained side by side (one thread each), then every 1,200-step checkpoint sampled
# and evaluated with real Inception features; writes docs/study/compare.{md,json} and fid_vs_step.png.
#   bash docs/study/run_study.sh        # ~2.5 h on 2 cores (training ~2 h, evaluation ~20 min)
# Training resumes (--resume auto) and evaluation is cached per checkpoint, so the command can be re-run
# after an interruption, or with a larger STEPS to extend the runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/study}
SEED=${SEED:-0}
STEPS=${STEPS:-3600}
NUM_SAMPLES=${NUM_SAMPLES:-500}
mkdir -p "$OUT"
python -m vit5_sit.data mnist data/mnist32 --resolution 32
for arch in sit vit5 vit5-nols; do
  OMP_NUM_THREADS=1 python train.py --config configs/mnist/$arch.yaml output_dir="$OUT" train.seed="$SEED" \
      train.max_steps="$STEPS" log.tracker=tensorboard --resume auto > "$OUT/$arch.log" 2>&1 &
done
wait
# Reference statistics of 1,000 real digits (100 per class), computed once.
python -m vit5_sit.data mnist data/mnist32-ref --resolution 32 --limit-per-class 100
[ -f "$OUT/mnist_ref.npz" ] || python eval_fid.py ref --data data/mnist32-ref --out "$OUT/mnist_ref.npz"
OMP_NUM_THREADS=1 python eval_fid.py compare "$OUT/mnist-sit" "$OUT/mnist-vit5" "$OUT/mnist-vit5-nols" \
    --ref "$OUT/mnist_ref.npz" --every 1200 --num-samples "$NUM_SAMPLES" --sampler ode --method heun --steps 15 \
    --metrics fid,pr --out docs/study
# The same checkpoints' EMA loss on 2,000 fixed (digit, t, noise) triples: a low-noise loss curve.
OMP_NUM_THREADS=1 python docs/study/fixed_loss.py "$OUT/mnist-sit" "$OUT/mnist-vit5" "$OUT/mnist-vit5-nols" \
    --every 1200 --out docs/study/fixed_loss.md
