"""Why does ODE Heun 15 (the component study's sampler) score ~44 FID worse than Euler 6 on the demo model?

The hypothesis (docs/study/README.md, #28): Heun's last corrector evaluates the network at t = 1, the data end,
where the velocity target x1 - x0 has the noise's full variance and the network's estimate is least accurate; half
the last step's length times that error lands on every pixel as a faint noise floor in the background (SiT's and
our Heun do this; EDM's Heun skips the correction on its last step). Euler and DPM-Solver++ never call the network
at t = 1.

The test: the same noise, labels and model, unguided, with
  heun 15              the study's sampler (30 network calls, the last at t = 1)
  heun 15, Euler last  the same, but the last step without its corrector (EDM's rule: 29 calls, none at t = 1)
  euler 29             as many calls as the above, all first order
  euler 6              the frontier's pick
and per variant: the share of pixels below 5/255 (the background; real digits: ~85%), the mean background level,
digit accuracy, and (``--fid``, ~3 CPU-min each) FID against the study's reference statistics.

    OMP_NUM_THREADS=1 python benchmarks/bench_heun_endpoint.py --num-samples 300 [--fid runs/study/reference.npz]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
from vit5_sit.transport import SamplerConfig, StackedRandomGenerator, Transport  # noqa: E402
from vit5_sit.transport.samplers import ode_euler, ode_heun, steps_grid  # noqa: E402


def heun_euler_last(model_fn, noise, y, transport, cfg):
    """Heun on every step but the last, which is a plain Euler step (no network call at the grid's end)."""
    grid = steps_grid(transport, cfg)
    x = ode_heun(model_fn, noise, y, transport, cfg, t_steps=grid[:-1])
    t = torch.full((x.shape[0],), grid[-2], dtype=x.dtype)
    return x + (grid[-1] - grid[-2]) * transport.velocity(model_fn(x, t, y), x, t)


VARIANTS = {
    "heun 15 (study)": lambda m, x, y, tr: ode_heun(m, x, y, tr, SamplerConfig(method="heun", steps=15)),
    "heun 15, Euler last": lambda m, x, y, tr: heun_euler_last(m, x, y, tr, SamplerConfig(method="heun", steps=15)),
    "euler 29": lambda m, x, y, tr: ode_euler(m, x, y, tr, SamplerConfig(method="euler", steps=29)),
    "euler 6 (frontier)": lambda m, x, y, tr: ode_euler(m, x, y, tr, SamplerConfig(method="euler", steps=6)),
}


def background_stats(images: np.ndarray) -> tuple[float, float]:
    """(share of pixels < 5/255, mean level of the pixels < 64/255 in units of 1/255) of uint8 images."""
    low = images[images < 64]
    return float((images < 5).mean()), float(low.mean()) if low.size else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-samples", type=int, default=300, help="images per variant, classes balanced")
    p.add_argument("--data", default="data/mnist32", help="real digits, for their background statistics")
    p.add_argument("--fid", default=None, help="reference statistics (.npz) to score FID against (slow)")
    args = p.parse_args()

    from vit5_sit.demo.digit_classifier import classify
    from vit5_sit.hub.model_files import DEMO_MODEL, load_for_sampling
    from vit5_sit.sampling.generate import to_uint8

    torch.set_num_threads(1)
    model, cfg = load_for_sampling(DEMO_MODEL, device="cpu")
    transport = Transport(cfg.transport)
    n = args.num_samples
    labels = np.arange(n) % 10
    rng = StackedRandomGenerator(list(range(n)))
    noise = rng.randn((model.cfg.in_channels, model.cfg.input_size, model.cfg.input_size))
    y = torch.from_numpy(labels)

    rows = []
    if Path(args.data).is_dir():
        from PIL import Image

        files = sorted(Path(args.data).rglob("*.png"))
        files = files[::max(1, len(files) // n)][:n]  # spread over the classes
        real = np.stack([np.asarray(Image.open(f).convert("L")) for f in files])
        rows.append(("real digits", None, *background_stats(real), None, None))
    for name, run in VARIANTS.items():
        calls = 0

        def counted(x, t, yy):
            nonlocal calls
            calls += 1
            return model(x, t, yy)

        start = time.perf_counter()
        with torch.no_grad():
            images = to_uint8(run(counted, noise.clone(), y, transport))  # (N, H, W, C)
        seconds = time.perf_counter() - start
        accuracy = float((classify(images) == labels).mean())
        fid = None
        if args.fid:
            from vit5_sit.eval import evaluate

            with tempfile.TemporaryDirectory() as tmp:
                npz = Path(tmp) / "s.npz"
                np.savez(npz, images, labels)
                fid = evaluate(npz, args.fid, ("fid",), device="cpu", batch_size=50, progress=False)["fid"]
        rows.append((name, calls, *background_stats(images[..., 0]), accuracy, fid))
        print(f"{name}: {calls} calls, {seconds:.0f} s", file=sys.stderr, flush=True)

    print(f"\n{n} samples per variant, unguided, bundled demo model (seeds 0-{n - 1}, classes balanced)\n")
    print("| variant | network calls | pixels < 5/255 | background level (/255) | digit accuracy | FID |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, calls, dark, level, acc, fid in rows:
        print(f"| {name} | {'' if calls is None else calls} | {dark:.1%} | {level:.2f} | "
              f"{'' if acc is None else f'{acc:.3f}'} | {'' if fid is None else f'{fid:.1f}'} |")


if __name__ == "__main__":
    main()
