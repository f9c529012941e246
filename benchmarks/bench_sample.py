"""Sampling throughput (images/s) of vanilla SiT vs ViT-5 at equal size: ODE Euler with classifier-free
guidance (one batched conditional + unconditional forward per step), model only (no VAE decode).

    python benchmarks/bench_sample.py --size T --batch-size 16 --steps 10             # CPU, small
    python benchmarks/bench_sample.py --size XL --batch-size 256 --steps 50 --bf16    # GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, not another installed copy

from vit5_sit.models import create_model, model_config  # noqa: E402
from vit5_sit.transport import (  # noqa: E402
    ClassifierFreeGuidance,
    SamplerConfig,
    StackedRandomGenerator,
    Transport,
    sample,
)


@torch.no_grad()
def bench_one(preset: str, args, device: torch.device, compiled: bool) -> float:
    cfg = model_config(preset, input_size=args.input_size, in_channels=args.channels)
    model = create_model(cfg).to(device).eval()
    net = torch.compile(model) if compiled else model
    guided = ClassifierFreeGuidance(net, args.cfg_scale, null_class=cfg.num_classes)
    sampler = SamplerConfig(mode="ode", method="euler", steps=args.steps)
    transport = Transport()
    y = torch.randint(0, cfg.num_classes, (args.batch_size,), device=device)
    rng = StackedRandomGenerator(list(range(args.batch_size)), device)
    noise = rng.randn((cfg.in_channels, cfg.input_size, cfg.input_size))
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def run() -> None:
        with amp:
            sample(guided, noise, y, transport, sampler)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()  # warm-up (and compilation)
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        run()
    return args.batch_size * args.repeats / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="T")
    p.add_argument("--patch", type=int, default=2)
    p.add_argument("--input-size", type=int, default=32)
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="Euler steps (NFE; each NFE is a 2x-batch forward)")
    p.add_argument("--cfg-scale", type=float, default=1.5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--modes", default="eager", help="comma list of eager, compiled")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name}; batch {args.batch_size}; Euler {args.steps} steps, cfg {args.cfg_scale}; "
          f"{'bf16' if args.bf16 else 'fp32'}\n")
    print("| mode | SiT images/s | ViT-5 images/s | ViT-5 / vanilla time |")
    print("|---|---:|---:|---:|")
    for mode in args.modes.split(","):
        a, b = (bench_one(f"{f}-{args.size}/{args.patch}", args, device, mode == "compiled") for f in ("SiT", "ViT5"))
        print(f"| {mode} | {a:.2f} | {b:.2f} | {a / b:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
