"""The study's low-noise loss measurement: each checkpoint's EMA model on the same fixed batch.

Training losses are single noisy batches (and some were not logged); this evaluates the flow-matching
loss of every checkpoint at multiples of --every on --num digits spread over the dataset, with times and noise drawn
once from --seed, so all checkpoints of all runs see exactly the same (x, t, noise) triples.

    python docs/study/fixed_loss.py runs/study/mnist-sit runs/study/mnist-vit5 --out docs/study/fixed_loss.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vit5_sit.config import load_config
from vit5_sit.data import build_dataset
from vit5_sit.hub.model_files import load_for_sampling
from vit5_sit.train.checkpoint import list_checkpoints
from vit5_sit.transport import Transport


@torch.no_grad()
def fixed_loss(ckpt: Path, x: torch.Tensor, y: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> float:
    model, cfg = load_for_sampling(ckpt)
    transport = Transport(cfg.transport)
    losses = [transport.loss(model, x[i:i + 250], y[i:i + 250], t=t[i:i + 250], noise=noise[i:i + 250])
              for i in range(0, len(x), 250)]
    return float(torch.cat(losses).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--every", type=int, default=1200)
    p.add_argument("--num", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="a .md table (a .json beside it)")
    args = p.parse_args()
    cfg = load_config(args.runs[0] / "config.yaml")
    ds = build_dataset(cfg.data.kind, cfg.data.path, resolution=cfg.data.resolution, channels=cfg.data.channels,
                       random_flip=False)
    picks = torch.linspace(0, len(ds) - 1, args.num).round().long().tolist()  # evenly over all classes
    x = torch.stack([ds[i][0] for i in picks])
    y = torch.tensor([int(ds[i][1]) for i in picks])
    g = torch.Generator().manual_seed(args.seed)
    t = Transport(cfg.transport).sample_t(args.num, generator=g)
    noise = torch.randn(x.shape, generator=g)
    rows = []
    for run in args.runs:
        for ckpt in list_checkpoints(run):
            if ckpt.step % args.every == 0:
                rows.append({"run": run.name, "step": ckpt.step, "loss": fixed_loss(ckpt.path, x, y, t, noise)})
                print(rows[-1], flush=True)
    lines = [f"EMA flow-matching loss on {args.num} fixed (digit, t, noise) triples (seed {args.seed}).", "",
             "| run | step | loss |", "|---|---:|---:|"]
    lines += [f"| {r['run']} | {r['step']} | {r['loss']:.4f} |" for r in rows]
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
