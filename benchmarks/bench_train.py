"""Training throughput: vanilla SiT vs ViT-5 at equal size, eager vs compiled, fp32 vs bf16, side by side.

One full optimizer step (transport loss, backward, AdamW) per iteration, as train.py runs it. Prints a
markdown table with images/s, step time, model FLOP utilisation (with --peak-tflops, or the device's known
bf16 peak) and the ViT-5 / vanilla time ratio for each setting.

    python benchmarks/bench_train.py --size T --patch 2 --input-size 32 --batch-size 16      # CPU, small
    python benchmarks/bench_train.py --size XL --batch-size 32 --precisions bf16 --device cuda  # GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, not another installed copy

from vit5_sit.models import count_flops, create_model, model_config  # noqa: E402
from vit5_sit.transport import Transport, TransportConfig  # noqa: E402

# Dense bf16 tensor-core peaks (TFLOP/s) for MFU when --peak-tflops is not given.
KNOWN_PEAKS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.0, "RTX 4090": 165.2}


def device_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in KNOWN_PEAKS.items() if k in name), None)


def sdpa_note(device: torch.device, heads: int, head_dim: int) -> str:
    """Which fused attention kernels accept the model's q, k, v in bf16 (what SDPA dispatches to, in order)."""
    if device.type != "cuda":
        return "SDPA on the CPU: the flash-attention CPU kernel"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, heads, 256, head_dim, device=device, dtype=torch.bfloat16)
    usable = []
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, q, q)
            usable.append(backend.name)
        except RuntimeError:
            pass
    return f"SDPA kernels usable in bf16 at head_dim {head_dim}: {', '.join(usable) or 'none (math fallback)'}"


def bench_one(preset: str, args, compiled: bool, precision: str, device: torch.device) -> dict:
    cfg = model_config(preset, input_size=args.input_size, in_channels=args.channels)
    torch.manual_seed(0)
    model = create_model(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    transport = Transport(TransportConfig())
    fwd = torch.compile(model) if compiled else model
    x = torch.randn(args.batch_size, cfg.in_channels, cfg.input_size, cfg.input_size, device=device)
    y = torch.randint(0, cfg.num_classes, (args.batch_size,), device=device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step() -> None:
        with amp:
            loss = transport.loss(fwd, x, y).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    warm_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.iters):
        step()
    sync()
    dt = (time.perf_counter() - t0) / args.iters
    cpu_dt = (time.process_time() - c0) / args.iters
    flops = 3 * 2 * count_flops(cfg) * args.batch_size  # fwd + bwd = 3x fwd; count_flops is multiply-adds
    peak = args.peak_tflops or device_peak(device)
    return {
        "preset": preset, "compiled": compiled, "precision": precision, "step_ms": dt * 1e3,
        "cpu_ms": cpu_dt * 1e3,
        "images_per_s": args.batch_size / dt, "tflops": flops / dt / 1e12,
        "mfu": (flops / dt / 1e12 / peak) if peak else None, "warmup_s": warm_s,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="T", help="model size: T, S, B, L or XL")
    p.add_argument("--patch", type=int, default=2)
    p.add_argument("--input-size", type=int, default=32, help="latent/pixel side (32 = 256px latents)")
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation happens here)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32, bf16")
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, compiled")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU; default: known GPUs")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    presets = [f"SiT-{args.size}/{args.patch}", f"ViT5-{args.size}/{args.patch}"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name}; torch {torch.__version__}; batch {args.batch_size}; input {args.input_size}x"
          f"{args.input_size}x{args.channels}; {args.iters} timed steps after {args.warmup} warm-up")
    cfg = model_config(presets[0])
    print(sdpa_note(device, cfg.num_heads, cfg.head_dim) + "\n")
    print("| preset | mode | precision | step ms | images/s | TFLOP/s | MFU | peak MiB | ViT-5 / vanilla time "
          "| CPU ms | warm-up s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        for precision in args.precisions.split(","):
            rows = [bench_one(pr, args, mode == "compiled", precision, device) for pr in presets]
            for r in rows:
                ratio = f"{r['step_ms'] / rows[0]['step_ms']:.3f}x" if r is rows[1] else ""
                mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
                mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "n/a"
                print(f"| {r['preset']} | {mode} | {precision} | {r['step_ms']:.1f} | {r['images_per_s']:.1f} | "
                      f"{r['tflops']:.3f} | {mfu} | {mem} | {ratio} | {r['cpu_ms']:.1f} | {r['warmup_s']:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
