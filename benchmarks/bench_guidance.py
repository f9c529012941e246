"""FID against digit accuracy for every guidance (issue #52): unguided, classifier-free guidance and autoguidance
over scales, with and without a guidance interval, for one flow model (default: the bundled demo).

The study's protocol: 1,000 samples (classes balanced, image i has seed SEED + i, the same seeds in every cell, so
cells are paired), Euler 6 (the model's sampler), FID / sFID / precision / recall against all 5,000 real digits
(the generation study's reference, runs/study/reference.npz, computed once from data/mnist32), digit accuracy by
vit5_sit's digit classifier, and the background speckle share (`vit5_sit.eval.speckle`). NFE counts network calls
per image: a guided step costs 2 (the model and its guide, or its conditional and unconditional halves), and only
inside the interval.

A cell is KIND@SCALE[@LOW-HIGH]: KIND is ``cfg`` (classifier-free) or ``auto:NAME`` (autoguidance with the guide
NAME of --guides NAME=PATH, e.g. an early checkpoint of a re-training of the model's config); ``cfg@1`` is the
unguided model. Everything is cached under --out (cells/TAG.npz, cells/TAG.result.json): run it again and it
continues; --report writes the table (and JSON) from the cache only.

    python benchmarks/bench_guidance.py --guides s400=runs/study/vit5-nols-s0/checkpoints/step_0000400 \\
        --cells cfg@1 cfg@3 auto:s400@2                        # sample and score these cells
    python benchmarks/bench_guidance.py --report --json docs/study/guidance/demo.json   # table from the cache
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
from vit5_sit.transport import Transport  # noqa: E402

METRICS = ("fid", "sfid", "precision", "recall")
REFERENCE = Path("runs/study/reference.npz")  # the generation study's: every metric of METRICS


def parse_cell(cell: str) -> tuple[str | None, float, tuple[float, float]]:
    """'KIND@SCALE[@LOW-HIGH]' -> (guide name or None for CFG, scale, interval)."""
    try:
        parts = cell.split("@")
        kind, scale = parts[0], float(parts[1])
        interval = (0.0, 1.0)
        if len(parts) == 3:
            low, high = parts[2].split("-")
            interval = (float(low), float(high))
        elif len(parts) != 2:
            raise ValueError("one or two '@'")
        if kind == "cfg":
            return None, scale, interval
        if kind.startswith("auto:") and kind[5:]:
            return kind[5:], scale, interval
        raise ValueError(f"kind {kind!r}: cfg or auto:NAME")
    except (ValueError, IndexError) as e:
        raise SystemExit(f"--cells {cell!r}: expected KIND@SCALE[@LOW-HIGH], e.g. cfg@3 or auto:s400@2@0.2-1 "
                         f"({e})") from None


def guidance_label(row: dict) -> str:
    """What guides a result row: 'none', 'CFG' or 'auto (GUIDE)' (for an iMF model 'CFG' is its guidance input)."""
    if row["scale"] == 1.0:
        return "none"
    return "CFG" if row["guidance"] == "cfg" else f"auto ({row['guide']})"


def tag(cell: str, seed: int) -> str:
    return cell.replace(":", "_").replace("@", "_") + (f"_seed{seed}" if seed else "")


def nfe_per_image(model_steps: int, scale: float, interval: tuple[float, float], guidance_input: bool = False) -> int:
    """Network calls per image of Euler with ``model_steps`` steps on the uniform grid, guided inside the interval
    (an iMF model takes its guidance as an input: one call per step, guided or not)."""
    if scale == 1.0 or guidance_input:
        return model_steps
    times = [i / model_steps for i in range(model_steps)]
    return model_steps + sum(interval[0] <= t <= interval[1] for t in times)


def sample_cell(cell: str, out: Path, model, cfg, guides: dict, num: int, seed: int) -> dict:
    """Sample a cell's images (resumable), score digits and speckle; cached in cells/TAG.result.json."""
    from vit5_sit.demo.digit_classifier import classify
    from vit5_sit.eval.speckle import speckle_share
    from vit5_sit.sampling.generate import sample_to_npz

    path = out / "cells" / f"{tag(cell, seed)}.result.json"
    if path.is_file():
        return json.loads(path.read_text())
    name, scale, interval = parse_cell(cell)
    if name is not None and name not in guides:
        raise SystemExit(f"--cells {cell}: no guide {name!r}; give it with --guides {name}=PATH")
    guide = guides[name][0] if name is not None else None
    npz = out / "cells" / f"{tag(cell, seed)}.npz"
    start = time.perf_counter()
    sample_to_npz(model, Transport(cfg.transport), cfg.sampler, npz, num_samples=num, seed=seed, part_size=100,
                  batch_size=100, cfg_scale=scale, guidance_interval=interval, guide=guide,
                  guide_identity=None if name is None else {"guide": name}, device="cpu", progress=False)
    seconds = time.perf_counter() - start
    with np.load(npz) as f:
        images, labels = f["arr_0"], f["arr_1"]
    result = {"cell": cell, "guidance": "cfg" if name is None else "auto", "guide": name,
              "guide_path": None if name is None else guides[name][1], "scale": scale, "interval": list(interval),
              "seed": seed, "method": cfg.sampler.method, "steps": cfg.sampler.steps,
              "nfe": nfe_per_image(cfg.sampler.steps, scale, interval, model.cfg.guidance_input),
              "digit_accuracy": float((classify(images) == labels).mean()), "speckle": speckle_share(images),
              "num_samples": num, "sample_seconds": round(seconds, 1)}
    path.write_text(json.dumps(result, indent=1))
    print(f"{cell} (seed {seed}): digits {result['digit_accuracy']:.3f}, speckle {result['speckle']:.4f} "
          f"({seconds:.0f} s)", flush=True)
    return result


def score_cell(cell: str, out: Path, reference: Path, seed: int) -> dict:
    from vit5_sit.eval import evaluate

    path = out / "cells" / f"{tag(cell, seed)}.result.json"
    result = json.loads(path.read_text())
    if "fid" not in result:
        start = time.perf_counter()
        metrics = evaluate(out / "cells" / f"{tag(cell, seed)}.npz", reference, METRICS, device="cpu",
                           batch_size=50, progress=False)
        result.update({m: float(metrics[m]) for m in METRICS})
        result["eval_seconds"] = round(time.perf_counter() - start, 1)
        path.write_text(json.dumps(result, indent=1))
        print(f"{cell} (seed {seed}): FID {result['fid']:.2f}", flush=True)
    return result


def rows(out: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.result.json"))]
    return [r for r in found if "fid" in r]


def table(results: list[dict]) -> str:
    """Markdown: one row per cell, sorted by guidance then scale; FID change against the same seeds unguided."""
    base = {r["seed"]: r["fid"] for r in results if r["scale"] == 1.0 and r["guidance"] == "cfg"}
    lines = ["| guidance | scale | interval | NFE | FID-1K | vs unguided | sFID | precision | recall | digits "
             "| speckle | sample seeds |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    order = sorted(results, key=lambda r: (r["scale"] != 1.0, r["guidance"], r["guide"] or "", r["interval"],
                                           r["scale"], r["seed"]))
    for r in order:
        what = guidance_label(r)
        change = (f"{100 * (r['fid'] / base[r['seed']] - 1):+.1f}%" if r["seed"] in base and r["scale"] != 1.0
                  else "")
        interval = "" if r["interval"] == [0.0, 1.0] else f"[{r['interval'][0]:g}, {r['interval'][1]:g}]"
        lines.append(f"| {what} | {r['scale']:g} | {interval} | {r['nfe']} | {r['fid']:.1f} | {change} | "
                     f"{r['sfid']:.1f} | {r['precision']:.3f} | {r['recall']:.3f} | {r['digit_accuracy']:.3f} | "
                     f"{100 * r['speckle']:.2f}% | {r['seed']}-{r['seed'] + r['num_samples'] - 1} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model, run or checkpoint folder (default: the bundled demo)")
    p.add_argument("--guides", nargs="*", default=[], metavar="NAME=PATH", help="guides the cells name")
    p.add_argument("--cells", nargs="*", default=["cfg@1"], help="cells to sample and score (default: cfg@1)")
    p.add_argument("--out", default="runs/guidance", help="cache folder (default: runs/guidance)")
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="seed of the first sample (default: 0)")
    p.add_argument("--steps", type=int, default=None,
                   help="sampling steps (default: the model's sampler: Euler 6 for the demo, 1 for MeanFlow)")
    p.add_argument("--method", default=None, help="sampler method (default: the model's; a study run's config "
                   "says heun 25: give --method euler --steps 6 for the generation study's sampler)")
    p.add_argument("--reference", default=str(REFERENCE), help=f"reference statistics (default: {REFERENCE})")
    p.add_argument("--report", action="store_true", help="print the table from the cache only")
    p.add_argument("--json", default=None, help="also write the rows here (JSON: the durable record)")
    p.add_argument("--md", default=None, help="also write the table here (Markdown, generated: not edited by hand)")
    args = p.parse_args()
    out = Path(args.out)
    if not args.report:
        from vit5_sit.hub.model_files import DEMO_MODEL, load_for_sampling

        torch.set_num_threads(1)
        model, cfg = load_for_sampling(Path(args.model) if args.model else DEMO_MODEL)
        if args.steps is not None and args.steps < 1:
            raise SystemExit(f"--steps {args.steps}: give a number of sampling steps >= 1")
        changes = {k: v for k, v in (("steps", args.steps), ("method", args.method)) if v is not None}
        cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, **changes))
        if cfg.sampler.method != "euler":  # the NFE column counts one call per step (two guided, outside iMF)
            raise SystemExit(f"{args.model or 'demo'}: sampler method {cfg.sampler.method}: the frontier is measured "
                             "with Euler (its network calls counted per step); give --method euler --steps N")
        from vit5_sit.hub.guide import is_guide_folder, load_guide_folder

        guides = {}
        for spec in args.guides:  # a run, checkpoint or model folder, or a model folder's guide/ (what it ships)
            name, _, path = spec.partition("=")
            guides[name] = (load_guide_folder(path) if is_guide_folder(Path(path)) else load_for_sampling(path)[0],
                            path)
        (out / "cells").mkdir(parents=True, exist_ok=True)
        for cell in args.cells:
            sample_cell(cell, out, model, cfg, guides, args.num_samples, args.seed)
            if Path(args.reference).is_file():  # scored as it goes once the reference exists
                score_cell(cell, out, Path(args.reference), args.seed)
        if not Path(args.reference).is_file():
            print(f"{args.reference}: no reference yet; run again to score the cells", flush=True)
    results = rows(out)
    print(table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        keep = ("cell", "guidance", "guide", "guide_path", "scale", "interval", "seed", "method", "steps", "nfe",
                "num_samples", "digit_accuracy", "speckle", *METRICS)
        record = {"model": args.model or "vit5_sit/assets/demo", "reference": args.reference,
                  "rows": [{k: r[k] for k in keep if k in r} for r in results]}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(f"<!-- generated by benchmarks/bench_guidance.py --report: do not edit -->\n"
                                 f"{table(results)}\n")


if __name__ == "__main__":
    main()
