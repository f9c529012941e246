"""Sampler accuracy against cost on Gaussian data, where the exact velocity field is known.

Data x1 ~ N(mu, diag(s^2)) in `--dim` dims; the model is the exact velocity field, so every error is the
sampler's. Two errors per run:
  path err   RMS distance of each ODE sample to its exact probability-flow end point (ODE only),
  moment W2  the 2-Wasserstein distance between the Gaussian fitted to the samples and the data
             (sqrt(sum_d (m_d - mu_d)^2 + (sd_d - s_d)^2)); the exact flow's own value is the
             Monte-Carlo floor, printed first.

    python benchmarks/bench_samplers.py
    python benchmarks/bench_samplers.py --path gvp --n 20000 --plot outputs/samplers.png
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
from vit5_sit.transport import SamplerConfig, Transport, TransportConfig, sample  # noqa: E402


def gaussian_velocity(transport, mu, s):
    """The exact velocity field of N(mu, diag(s^2)) data on the transport's path."""

    def model(x, t, y=None):
        a, da, b, db = (c[:, None] for c in transport.coefficients(t))
        r = (x - a * mu) / (a**2 * s**2 + b**2)
        return da * mu + (a * da * s**2 + b * db) * r

    return model


def moment_w2(x, mu, s):
    return math.sqrt(((x.mean(0) - mu) ** 2 + (x.std(0) - s) ** 2).sum().item())


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--path", default="linear", choices=["linear", "gvp", "vp"])
    parser.add_argument("--dim", type=int, default=8, help="data dimensions")
    parser.add_argument("--n", type=int, default=20000, help="samples per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, help="write a PNG of error against NFE (needs matplotlib)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead

    gen = torch.Generator().manual_seed(args.seed)
    mu = torch.linspace(-1, 1, args.dim, dtype=torch.float64)
    s = torch.linspace(0.3, 1.5, args.dim, dtype=torch.float64)
    z = torch.randn(args.n, args.dim, generator=gen, dtype=torch.float64)
    transport = Transport(TransportConfig(path=args.path))
    model = gaussian_velocity(transport, mu, s)
    t0, t1 = transport.interval()
    (a0, _, b0, _), (a1, _, b1, _) = (transport.coefficients(torch.tensor(t, dtype=torch.float64))
                                      for t in (t0, t1))
    exact = a1 * mu + torch.sqrt((a1**2 * s**2 + b1**2) / (a0**2 * s**2 + b0**2)) * (z - a0 * mu)

    runs = [("Euler", SamplerConfig(method="euler", steps=n)) for n in (4, 8, 16, 32, 64, 128, 256)]
    runs += [("Heun", SamplerConfig(method="heun", steps=n)) for n in (2, 4, 8, 16, 32, 64, 128)]
    runs += [("dopri5", SamplerConfig(method="dopri5", atol=e, rtol=e)) for e in (1e-2, 1e-3, 1e-4, 1e-6)]
    runs += [("Euler-Maruyama", SamplerConfig(mode="sde", steps=n)) for n in (8, 16, 32, 64, 128, 256, 512)]
    runs += [("SDE Heun", SamplerConfig(mode="sde", method="heun", steps=n)) for n in (4, 8, 16, 32, 64, 128)]

    rows = []
    for name, cfg in runs:
        torch.manual_seed(args.seed + 1)  # the SDE's per-step noise
        start = time.perf_counter()
        res = sample(model, z, None, transport, cfg)
        seconds = time.perf_counter() - start
        path_err = None if cfg.mode == "sde" else (res.samples - exact).pow(2).sum(1).mean().sqrt().item()
        setting = f"tol {cfg.rtol:.0e}" if cfg.method == "dopri5" else f"{cfg.steps} steps"
        rows.append((name, setting, res.nfe, path_err, moment_w2(res.samples, mu, s), seconds))

    print(f"Gaussian data, path={args.path}, dim={args.dim}, n={args.n}: "
          f"Monte-Carlo floor of moment W2 (exact flow) = {moment_w2(exact, mu, s):.4f}\n")
    print("| sampler | setting | NFE | path err (RMS) | moment W2 |")
    print("|---|---|---:|---:|---:|")
    for name, setting, nfe, path_err, w2, _ in rows:
        err = "-" if path_err is None else f"{path_err:.2e}"
        print(f"| {name} | {setting} | {nfe} | {err} | {w2:.4f} |")

    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed; no plot written")
            return
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for name in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == name]
            if mine[0][3] is not None:
                axes[0].loglog([r[2] for r in mine], [r[3] for r in mine], "o-", label=name)
            axes[1].loglog([r[2] for r in mine], [r[4] for r in mine], "o-", label=name)
        axes[1].axhline(moment_w2(exact, mu, s), color="gray", ls="--", label="Monte-Carlo floor")
        for ax, title in zip(axes, ("ODE: RMS error to the exact flow", "moment W2 to the data")):
            ax.set(xlabel="NFE", title=title)
            ax.legend()
        fig.suptitle(f"Samplers on Gaussian data ({args.path} path, {args.dim} dims)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"\nplot written to {args.plot}")


if __name__ == "__main__":
    main()
