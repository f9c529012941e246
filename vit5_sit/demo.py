"""Export a run's EMA weights as a small model folder (the bundled demo: ``vit5_sit/assets/demo``).

    python -m vit5_sit.demo export runs/mnist-vit5                 # newest valid checkpoint -> assets/demo
    python -m vit5_sit.demo export runs/mnist-vit5 --out my_model  # any folder; sample.py --ckpt my_model

The folder holds ``config.yaml`` (the run's resolved config) and ``ema.safetensors`` in float16 (half the
size; the model is cast back to float32 when loaded).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vit5_sit.checkpoint import DEMO_MODEL, ModelLoadError, resolve_checkpoint
from vit5_sit.config import ConfigError, load_config, save_config


def export_model(run_or_ckpt: str | Path, out: str | Path = DEMO_MODEL, dtype: torch.dtype = torch.float16,
                 cfg_scale: float | None = None, sampler: list[str] | None = None) -> Path:
    """Write ``out/config.yaml`` and ``out/ema.safetensors`` from a run or checkpoint folder.

    The config is the run's with ``train.max_steps`` set to the exported checkpoint's step (the recipe that
    reproduces these weights). ``cfg_scale``: the guidance scale ``sample.py`` uses for this model's grids by
    default (stored as the config's ``log.sample_cfg_scale``); None keeps the run's. ``sampler``: overrides of
    the config's sampler section, e.g. ``["sampler.mode=sde", "sampler.steps=50"]`` (sample.py's default for
    this model).
    """
    folder, config_path = resolve_checkpoint(run_or_ckpt)
    overrides = [f"log.sample_cfg_scale={cfg_scale}"] if cfg_scale is not None else []
    overrides += list(sampler or [])
    if folder.parent.name == "checkpoints" and folder.name.startswith("step_"):
        # The recipe of these weights: the run's config trained to this checkpoint's step.
        overrides.append(f"train.max_steps={int(folder.name[len('step_'):])}")
    cfg = load_config(config_path, overrides)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ema = load_file(str(folder / "ema.safetensors"))
    save_file({k: v.to(dtype).contiguous() for k, v in ema.items()}, str(out / "ema.safetensors"),
              metadata={"source": str(folder)})
    save_config(cfg, out / "config.yaml")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vit5_sit.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="export a run's EMA weights as a model folder")
    e.add_argument("run", help="run folder (newest valid checkpoint) or checkpoint folder")
    e.add_argument("--out", default=str(DEMO_MODEL), help=f"model folder (default: {DEMO_MODEL})")
    e.add_argument("--cfg-scale", type=float, default=None,
                   help="guidance scale of the model's grids in sample.py (log.sample_cfg_scale; default: the run's)")
    e.add_argument("--sampler", choices=("ode", "sde"), default=None, help="sample.py's default sampler for "
                   "this model (sampler.mode; default: the run's)")
    e.add_argument("--method", default=None, help="sampler.method (default: the run's)")
    e.add_argument("--steps", type=int, default=None, help="sampler.steps (default: the run's)")
    args = p.parse_args(argv)
    method = args.method or ("euler" if args.sampler else None)  # as sample.py: a mode's own default method
    sampler = [f"sampler.{key}={value}" for key, value in
               (("mode", args.sampler), ("method", method), ("steps", args.steps)) if value is not None]
    try:
        out = export_model(args.run, args.out, cfg_scale=args.cfg_scale, sampler=sampler)
    except (ModelLoadError, ConfigError) as err:
        print(f"error: {args.run}: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.run} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
