"""FID and digit accuracy against network calls (NFE) for each solver and time grid, on the bundled demo model.

The study's protocol: 1,000 samples (classes balanced, image i has seed i) against the Inception statistics of
all 5,000 real digits (data/mnist32, made by `python -m vit5_sit.data mnist data/mnist32 --resolution 32`);
digit accuracy is the share of samples that vit5_sit/digit_classifier reads as the digit asked for. NFE counts
network calls (a guided call, conditional and unconditional in one batch, is one).

Everything is cached under --out (default runs/frontier/): the reference statistics (reference.npz, or the
study's runs/study/reference.npz when it exists), each cell's samples (cells/TAG.npz, resumable parts) and its
result (cells/TAG.result.json). Run it again and it continues where it stopped; a cell is scored (Inception,
~2-8 images/s on a CPU) right after its sampling once the reference exists, else after all are sampled.
CPU is scarce, so run it in the background:

    OMP_NUM_THREADS=1 nohup python benchmarks/bench_frontier.py > runs/frontier/log.txt 2>&1 &
    python benchmarks/bench_frontier.py --report           # the table and plot from the cached cells only
    python benchmarks/bench_frontier.py --gaussian         # the same solvers on closed-form Gaussian data
    python benchmarks/bench_frontier.py --cells dpm++2m/uniform/10@6 sde/euler/249@1   # chosen cells

A cell is METHOD/GRID/STEPS@CFG (METHOD: euler, heun, dpm++2m, dpm++3m, dopri5 (GRID/STEPS: the tolerance),
sde/euler); `--cells` with no value lists the default cells.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
from vit5_sit.transport import SamplerConfig, Transport, TransportConfig, sample  # noqa: E402

# Cells in the order they are run: the candidates first (demo guidance 6), the expensive references last.
DEFAULT_CELLS = (
    "dpm++2m/uniform/10@6", "dpm++2m/logsnr/10@6", "euler/uniform/10@6", "dpm++2m/uniform/6@6", "euler/uniform/6@6",
    "dpm++2m/uniform/5@6", "euler/uniform/5@6", "dpm++2m/uniform/4@6", "euler/uniform/4@6",
    "dpm++2m/uniform/15@6", "dpm++3m/uniform/10@6", "dpm++2m/uniform/25@6", "heun/uniform/10@6",
    "euler/uniform/25@6", "dpm++2m/shift/10@6", "dpm++2m/edm/10@6", "sde/euler/50@6",
    "dpm++2m/uniform/6@1", "euler/uniform/6@1", "dpm++2m/uniform/10@1", "dpm++2m/uniform/25@1", "euler/uniform/25@1",
    "dopri5/tol/1e-5@6", "sde/euler/249@6", "dopri5/tol/1e-5@1", "sde/euler/249@1",
)
REFERENCE_METHODS = ("dopri5", "sde")  # plotted as single points, not as step series
# The reference: the best FID of SiT's SDE 250 (249 Euler-Maruyama steps + the mean last step) and of dopri5
# at a tight tolerance (a looser dopri5 is a candidate like any other).
REFERENCE_CELLS = ("sde/euler/249", "dopri5/tol/1e-5")


def parse_cell(cell: str) -> tuple[SamplerConfig, float]:
    """'METHOD/GRID/STEPS@CFG' -> (SamplerConfig, cfg scale)."""
    try:
        spec, cfg = cell.split("@")
        method, grid, steps = spec.split("/")
        if method == "dopri5":
            return SamplerConfig(method="dopri5", atol=float(steps), rtol=float(steps)), float(cfg)
        if method == "sde":
            return SamplerConfig(mode="sde", method=grid, steps=int(steps)), float(cfg)
        return SamplerConfig(method=method, grid=grid, steps=int(steps)), float(cfg)
    except ValueError as e:
        raise SystemExit(f"--cells {cell!r}: expected METHOD/GRID/STEPS@CFG, e.g. dpm++2m/uniform/10@6 ({e})") from None


def tag(cell: str) -> str:
    return cell.replace("/", "_").replace("@", "_cfg").replace("+", "p")


def existing_reference(out: Path) -> Path | None:
    """The study's reference when it exists (the same statistics), else ours if computed already."""
    for ref in (Path("runs/study/reference.npz"), out / "reference.npz"):
        if ref.is_file():
            return ref
    return None


def reference_path(out: Path, data: Path) -> Path:
    """The reference statistics, computed once (into OUT/reference.npz) when there are none yet."""
    ref = existing_reference(out) or out / "reference.npz"
    if not ref.is_file():
        from vit5_sit.eval import compute_reference

        print(f"reference: Inception statistics of {data} -> {ref}", flush=True)
        compute_reference(str(data), ref, metrics=("fid",), device="cpu", batch_size=50)
    return ref


def sample_cell(cell: str, out: Path, model, transport: Transport, num: int) -> dict:
    """Sample a cell's images (resumable) and score their digits; cached in cells/TAG.result.json."""
    from vit5_sit.demo.digit_classifier import classify
    from vit5_sit.sampling.generate import sample_to_npz

    path = out / "cells" / f"{tag(cell)}.result.json"
    if path.is_file():
        return json.loads(path.read_text())
    sampler, cfg = parse_cell(cell)
    npz = out / "cells" / f"{tag(cell)}.npz"
    nfe = _nfe(model, transport, sampler, cfg)
    start = time.perf_counter()
    sample_to_npz(model, transport, sampler, npz, num_samples=num, seed=0, part_size=100, batch_size=100,
                  cfg_scale=cfg, device="cpu", progress=False)
    seconds = time.perf_counter() - start
    with np.load(npz) as f:
        images, labels = f["arr_0"], f["arr_1"]
    accuracy = float((classify(images) == labels).mean())
    result = {"cell": cell, "nfe": nfe, "cfg": cfg, "accuracy": accuracy, "num_samples": num,
              "sample_seconds": round(seconds, 1)}
    path.write_text(json.dumps(result, indent=1))
    print(f"{cell}: NFE {nfe}, digit accuracy {accuracy:.3f} ({seconds:.0f} s)", flush=True)
    return result


def _nfe(model, transport, sampler, cfg) -> int:
    """Network calls of one batch: counted on a batch of one (adaptive solvers: that batch's count)."""
    from vit5_sit.transport import ClassifierFreeGuidance, StackedRandomGenerator

    net = model if cfg == 1 else ClassifierFreeGuidance(model, cfg, null_class=model.cfg.null_label)
    rng = StackedRandomGenerator([0])
    x = rng.randn((model.cfg.in_channels, model.cfg.input_size, model.cfg.input_size))
    with torch.no_grad():
        return sample(net, x, torch.tensor([0]), transport, sampler, rng=rng).nfe


def score_cell(cell: str, out: Path, reference: Path) -> dict:
    from vit5_sit.eval import evaluate

    path = out / "cells" / f"{tag(cell)}.result.json"
    result = json.loads(path.read_text())
    if "fid" not in result:
        start = time.perf_counter()
        metrics = evaluate(out / "cells" / f"{tag(cell)}.npz", reference, ("fid",), device="cpu", batch_size=50,
                           progress=False)
        result["fid"] = metrics["fid"]
        result["fid_seconds"] = round(time.perf_counter() - start, 1)
        path.write_text(json.dumps(result, indent=1))
        print(f"{cell}: FID {result['fid']:.2f}", flush=True)
    return result


def series(row: dict) -> str:
    """A cell's series in the plot: METHOD/GRID (its step counts are the points)."""
    return "/".join(row["cell"].split("/")[:2])


def is_reference(row: dict) -> bool:
    return row["cell"].split("@")[0] in REFERENCE_CELLS


def reference_fids(rows: list[dict]) -> dict[float, float | None]:
    """Per guidance scale, the reference FID: the best of the measured REFERENCE_CELLS (None if none)."""
    best = {}
    for cfg in sorted({r["cfg"] for r in rows}):
        refs = [r["fid"] for r in rows if r["cfg"] == cfg and "fid" in r and is_reference(r)]
        best[cfg] = min(refs) if refs else None
    return best


def recommend(rows: list[dict], cfg: float, reference: float | None, tolerance: float = 0.05) -> list[dict]:
    """The issue's default rule: the settings with the fewest network calls whose FID is within `tolerance` of the
    reference and whose digit accuracy is no lower than the reference cell's (every digit right where it draws
    every one); several when they tie in NFE, best FID first ([] when no reference or none qualifies)."""
    mine = [r for r in rows if r["cfg"] == cfg and "fid" in r]
    refs = [r for r in mine if is_reference(r) and r["fid"] == reference]
    if reference is None or not refs:
        return []
    floor = refs[0]["accuracy"]
    ok = [r for r in mine if r["fid"] <= reference * (1 + tolerance) and r["accuracy"] >= floor]
    fewest = min((r["nfe"] for r in ok), default=None)
    return sorted((r for r in ok if r["nfe"] == fewest), key=lambda r: r["fid"])


def report(out: Path, plot: Path | None) -> None:
    rows = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.result.json"))]
    if not rows:
        print(f"no cells in {out / 'cells'} yet")
        return
    best = reference_fids(rows)
    lowest = {cfg: min((r["fid"] for r in rows if r["cfg"] == cfg and "fid" in r), default=None) for cfg in best}
    print("| cfg | solver | grid | steps / tol | NFE | FID-1K | vs reference | vs best measured | digit accuracy |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (-r["cfg"], r["nfe"], r["cell"])):
        method, grid, steps = r["cell"].split("@")[0].split("/")
        fid = f"{r['fid']:.2f}" if "fid" in r else "-"
        rel = f"{r['fid'] / best[r['cfg']] - 1:+.1%}" if "fid" in r and best[r["cfg"]] else "-"
        rel_low = f"{r['fid'] / lowest[r['cfg']] - 1:+.1%}" if "fid" in r and lowest[r["cfg"]] else "-"
        solver = "SDE Euler-Maruyama" if method == "sde" else method
        grid = "uniform" if method in ("sde",) else "adaptive" if method == "dopri5" else grid
        print(f"| {r['cfg']:g} | {solver} | {grid} | {steps} | {r['nfe']} | {fid} | {rel} | {rel_low} | "
              f"{r['accuracy']:.1%} |")
    for cfg, fid in best.items():
        measured = f"{fid:.2f}" if fid else "not measured yet"
        print(f"\nreference FID at cfg {cfg:g} (best of SDE 250 / dopri5 1e-5): {measured}")
        if picks := recommend(rows, cfg, fid):
            print(f"fewest NFE within 5% of it at no lower digit accuracy: {picks[0]['nfe']}: " + ", ".join(
                f"{r['cell']} (FID {r['fid']:.2f}, digits {r['accuracy']:.1%})" for r in picks))
    if plot is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfgs = sorted(best, reverse=True)
    fig, axes = plt.subplots(2, len(cfgs), figsize=(5 * len(cfgs), 7), squeeze=False)
    names = sorted({series(r) for r in rows})
    colors = {name: f"C{i}" for i, name in enumerate(names)}  # one colour per series in every panel
    for j, cfg in enumerate(cfgs):
        mine = [r for r in rows if r["cfg"] == cfg]
        for name in sorted({series(r) for r in mine}):
            pts = sorted((r["nfe"], r.get("fid", math.nan), r["accuracy"]) for r in mine
                         if r["cell"].startswith(name + "/"))
            style = "s" if name.split("/")[0] in REFERENCE_METHODS else "o-"
            axes[0, j].plot([p[0] for p in pts], [p[1] for p in pts], style, label=name, color=colors[name])
            axes[1, j].plot([p[0] for p in pts], [100 * p[2] for p in pts], style, label=name, color=colors[name])
        if best[cfg]:
            axes[0, j].axhline(best[cfg] * 1.05, color="gray", ls="--", label="reference + 5%")
        axes[0, j].set(xscale="log", xlabel="NFE", ylabel="FID-1K", title=f"demo model, guidance {cfg:g}")
        axes[1, j].set(xscale="log", xlabel="NFE", ylabel="digit accuracy (%)")
        axes[0, j].legend(fontsize=7)
    fig.tight_layout()
    plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot, dpi=110)
    print(f"\nplot written to {plot}")


def gaussian(path: str, dim: int = 8, n: int = 20000) -> None:
    """Path error of each solver / grid against NFE on N(mu, diag(s^2)) data (the exact velocity field)."""
    from bench_samplers import gaussian_velocity  # noqa: PLC0415 (the benchmark beside this one)

    torch.set_num_threads(1)
    mu = torch.linspace(-1, 1, dim, dtype=torch.float64)
    s = torch.linspace(0.3, 1.5, dim, dtype=torch.float64)
    z = torch.randn(n, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    transport = Transport(TransportConfig(path=path))
    model = gaussian_velocity(transport, mu, s)
    t0, t1 = transport.interval()
    (a0, _, b0, _), (a1, _, b1, _) = (transport.coefficients(torch.tensor(t, dtype=torch.float64))
                                      for t in (t0, t1))
    exact = a1 * mu + torch.sqrt((a1**2 * s**2 + b1**2) / (a0**2 * s**2 + b0**2)) * (z - a0 * mu)
    print(f"\nGaussian data, path={path}, dim={dim}, n={n}: RMS distance to the exact flow's end point\n")
    nfes = (6, 10, 15, 20, 25, 50)
    print("| solver | grid | " + " | ".join(f"NFE {k}" for k in nfes) + " |")
    print("|---|---|" + "---:|" * len(nfes))
    for method in ("euler", "heun", "dpm++2m", "dpm++3m"):
        for grid in ("uniform", "shift", "logsnr", "edm"):
            errs = []
            for nfe in nfes:
                steps = nfe // 2 if method == "heun" else nfe
                res = sample(model, z, None, transport, SamplerConfig(method=method, steps=steps, grid=grid))
                errs.append(f"{(res.samples - exact).pow(2).sum(1).mean().sqrt().item():.1e}")
            print(f"| {method} | {grid} | " + " | ".join(errs) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the bundled demo model)")
    p.add_argument("--data", default="data/mnist32", help="the real digits (default: data/mnist32)")
    p.add_argument("--out", default="runs/frontier", help="cache folder (default: runs/frontier)")
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--cells", nargs="*", default=None, help="cells to run (default: DEFAULT_CELLS)")
    p.add_argument("--no-fid", action="store_true", help="sample and score digits only")
    p.add_argument("--report", action="store_true", help="print the table (and --plot) from the cache only")
    p.add_argument("--plot", default=None, help="write the plot here (PNG)")
    p.add_argument("--gaussian", action="store_true", help="the Gaussian benchmark (linear, gvp, vp paths)")
    args = p.parse_args()
    out = Path(args.out)
    if args.gaussian:
        for path in ("linear", "gvp", "vp"):
            gaussian(path)
        return
    if args.cells == []:
        print("\n".join(DEFAULT_CELLS))
        return
    if not args.report:
        from vit5_sit.hub.model_files import DEMO_MODEL, load_for_sampling

        torch.set_num_threads(1)
        model, cfg = load_for_sampling(Path(args.model) if args.model else DEMO_MODEL, device="cpu")
        transport = Transport(cfg.transport)
        (out / "cells").mkdir(parents=True, exist_ok=True)
        cells = args.cells or DEFAULT_CELLS
        for cell in cells:
            sample_cell(cell, out, model, transport, args.num_samples)
            if not args.no_fid and (ready := existing_reference(out)) is not None:
                score_cell(cell, out, ready)  # scored as it goes once the reference exists
        if not args.no_fid:
            reference = reference_path(out, Path(args.data))
            for cell in cells:
                score_cell(cell, out, reference)
    report(out, Path(args.plot) if args.plot else None)


if __name__ == "__main__":
    main()
