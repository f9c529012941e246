"""Attention statistics of a trained denoiser: what QK-norm and registers are argued to fix, read from a checkpoint.

    python -m vit5_sit.eval.attention runs/study/vit5-nols-s0 runs/study/sit-s0 --t 0.1,0.5,0.9 --json attention.json

Per block, on a fixed batch of real training images (or latents) moved to time t along the model's own path
(noise from --seed), the patch tokens' attention is recomputed from the block's q and k (`Attention.project`,
the same call the forward makes; QK-norm and RoPE included):

  max_logit       the largest pre-softmax logit q.k / sqrt(head_dim) over samples, heads, queries and keys. Without
                  QK-norm it grows with width and training length (the loss spikes of large low-precision runs);
                  with QK-norm it is bounded by sqrt(head_dim) times the largest product of the q_norm and k_norm
                  weights.
  entropy         the patch queries' mean attention entropy in nats; log(T + R) is uniform attention over the T
                  patches and R registers, 0 is all attention on one token.
  register_mass   the mean share of the patch queries' attention that lands on the registers (uniform: R / (T + R));
                  None without registers.
  top_patch_mass  the attention the most-attended patch token receives (averaged over the patch queries, then over
                  samples and heads), in units of uniform attention 1 / (T + R): a sink token is >> 1.
  norm_ratio      max / median L2 norm of the patch tokens after the block, averaged over samples: the high-norm
                  artefact tokens that registers were introduced to absorb (Darcet et al. 2024) show as >> 1.

A summary line per model follows: the peak logit, the lowest entropy, the mean register share, the peak top-patch
mass and the peak norm ratio over all blocks and times. train.py does not log these; this reads them from any run,
checkpoint or model folder (the EMA weights by default).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from vit5_sit.common.checks import nonnegative_int, output_file, parse_device, positive_int
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly

DEFAULT_TIMES = (0.1, 0.5, 0.9)  # near noise, half-way, near data (t = 1 is data, SiT's convention)


@dataclass(frozen=True)
class BlockAttention:
    """The statistics of one block's attention (see the module docstring)."""

    block: int                     # 1-based
    max_logit: float
    entropy: float                 # nats
    register_mass: float | None    # None: the model has no registers
    top_patch_mass: float          # units of uniform attention 1 / (T + R)
    norm_ratio: float


def _block_statistics(q: torch.Tensor, k: torch.Tensor, out: torch.Tensor, patches: int, block: int,
                      registers: int) -> BlockAttention:
    """q, k (B, H, T + R, hd) as they enter the softmax; out (B, T + R, D) the block's output."""
    tokens = q.shape[2]
    logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, T + R, T + R)
    probs = logits.softmax(dim=-1)[:, :, :patches]                               # patch queries only
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean()
    received = probs[..., :patches].mean(dim=2)                                  # (B, H, T): per patch key
    top = received.amax(dim=-1).mean() * tokens
    register_mass = probs[..., patches:].sum(-1).mean().item() if registers else None
    norms = out[:, :patches].float().norm(dim=-1)                                # (B, T)
    norm_ratio = (norms.amax(dim=-1) / norms.median(dim=-1).values).mean()
    return BlockAttention(block, logits.amax().item(), entropy.item(), register_mass, top.item(), norm_ratio.item())


@torch.no_grad()
def attention_statistics(model, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> list[BlockAttention]:
    """One forward of ``model`` (a `Denoiser`) on (x, t, y) with hooks on every block; its blocks' statistics."""
    blocks = list(model.blocks)
    grid = (x.shape[-2] // model.patch_size) * (x.shape[-1] // model.patch_size)
    registers = model.cfg.num_registers
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    results: list[BlockAttention] = []

    def on_attention(i: int):
        def hook(module, args):
            q, k, _ = module.project(*args)
            seen[i] = q, k
        return hook

    def on_block(i: int):
        def hook(module, args, out):
            q, k = seen.pop(i)
            results.append(_block_statistics(q, k, out, grid, i + 1, registers))
        return hook

    handles = [b.attn.register_forward_pre_hook(on_attention(i)) for i, b in enumerate(blocks)]
    handles += [b.register_forward_hook(on_block(i)) for i, b in enumerate(blocks)]
    try:
        model(x, t, y)
    finally:
        for h in handles:
            h.remove()
    return results


class AttentionError(ValueError):
    """A bad argument of the attention command: the message names the value and the fix."""


def parse_times(text: str) -> tuple[float, ...]:
    """'0.1,0.5,0.9' -> (0.1, 0.5, 0.9); every value in [0, 1]."""
    try:
        times = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated times in [0, 1], e.g. 0.1,0.5,0.9"
                                         ) from None
    bad = [v for v in times if not 0.0 <= v <= 1.0]  # NaN fails too
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: times must lie in [0, 1] (0 = noise, 1 = data); got {bad}")
    return times


def real_batch(cfg, num: int, data: str | None = None, channels: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``num`` items of the run's training data (or of ``data``, the same kind), unflipped.
    ``channels``: the model's input channels, checked against the items'."""
    from vit5_sit.data import build_dataset

    path = data or cfg.data.path
    kwargs = {"sample_posterior": False} if cfg.data.kind == "latents" else {
        "resolution": cfg.data.resolution, "channels": cfg.data.channels}
    try:
        ds = build_dataset(cfg.data.kind, path, random_flip=False, seed=0, **kwargs)
    except (OSError, ValueError, ImportError) as e:
        raise AttentionError(f"--data {path}: cannot read the run's {cfg.data.kind} data ({e}); pass --data with "
                             "the folder the run was trained on") from None
    if len(ds) < num:
        raise AttentionError(f"--num {num}: {path} holds only {len(ds)} items; pass --num {len(ds)} or less")
    items = [ds[i] for i in range(num)]
    x = torch.stack([a for a, _ in items])
    if channels is not None and x.shape[1] != channels:
        raise AttentionError(f"--data {path}: items have {x.shape[1]} channels, the model takes "
                             f"{channels} (VAE latents?); encode the images first (python -m "
                             "vit5_sit.data encode) and pass the latent folder as --data")
    return x, torch.stack([b for _, b in items])


def measure(model, transport, x1: torch.Tensor, y: torch.Tensor, times, seed: int = 0
            ) -> dict[float, list[BlockAttention]]:
    """The statistics at each t of ``times``, x_t on ``transport``'s path with noise drawn from ``seed`` (on the
    CPU, so a device gives the same batch); computed on the model's device."""
    device = next(model.parameters()).device
    x0 = torch.randn(x1.shape, generator=torch.Generator().manual_seed(seed))
    out = {}
    for t in times:
        tt = torch.full((x1.shape[0],), float(t))
        x_t, _ = transport.interpolate(x0, x1, tt)
        out[t] = attention_statistics(model, x_t.to(device), tt.to(device), y.to(device))
    return out


def summarize(stats: dict[float, list[BlockAttention]]) -> dict[str, float | None]:
    """One line per model over all blocks and times: the peak logit, the lowest entropy, the mean register share,
    the peak top-patch mass and the peak norm ratio (the numbers that compare runs)."""
    blocks = [b for bs in stats.values() for b in bs]
    shares = [b.register_mass for b in blocks if b.register_mass is not None]
    return {"max_logit": max(b.max_logit for b in blocks), "min_entropy": min(b.entropy for b in blocks),
            "register_mass": sum(shares) / len(shares) if shares else None,
            "top_patch_mass": max(b.top_patch_mass for b in blocks), "norm_ratio": max(b.norm_ratio for b in blocks)}


def format_summary(summaries: dict[str, dict[str, float | None]]) -> str:
    width = max(len("model"), *(len(n) for n in summaries))
    lines = [f"{'model':<{width}} {'max_logit':>10} {'min_entropy':>11} {'register':>9} {'top_patch':>10} "
             f"{'norm_ratio':>10}"]
    for name, s in summaries.items():
        reg = "-" if s["register_mass"] is None else f"{s['register_mass']:.3f}"
        lines.append(f"{name:<{width}} {s['max_logit']:>10.2f} {s['min_entropy']:>11.3f} {reg:>9} "
                     f"{s['top_patch_mass']:>10.2f} {s['norm_ratio']:>10.2f}")
    return "\n".join(lines)


def format_table(stats: dict[float, list[BlockAttention]]) -> str:
    lines = [f"{'t':>5} {'block':>5} {'max_logit':>10} {'entropy':>8} {'register':>9} {'top_patch':>10} "
             f"{'norm_ratio':>10}"]
    for t, blocks in stats.items():
        for b in blocks:
            reg = "-" if b.register_mass is None else f"{b.register_mass:.3f}"
            lines.append(f"{t:>5.2f} {b.block:>5} {b.max_logit:>10.2f} {b.entropy:>8.3f} {reg:>9} "
                         f"{b.top_patch_mass:>10.2f} {b.norm_ratio:>10.2f}")
    return "\n".join(lines)


def _measure_one(name: str, args) -> dict[float, list[BlockAttention]]:
    from vit5_sit.hub.model_files import load_for_sampling
    from vit5_sit.transport import Transport

    model, cfg = load_for_sampling(name, use_ema=not args.no_ema, device=args.device)
    x1, y = real_batch(cfg, args.num, args.data, model.in_channels)
    return measure(model, Transport(cfg.transport), x1, y, args.t, args.seed)


@stops_cleanly("interrupted: nothing was written; run the same command again")
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vit5_sit.eval.attention", command="attention",
                    description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="run folders (their newest valid checkpoint), checkpoint folders or model folders "
                             "(config.yaml beside the weights); several are measured one after another")
    parser.add_argument("--t", type=parse_times, default=DEFAULT_TIMES,
                        help="times along the path, comma-separated in [0, 1] (default: 0.1,0.5,0.9)")
    parser.add_argument("--num", type=positive_int, default=64, help="real items in the batch (default: 64)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the noise (default: 0)")
    parser.add_argument("--data", default=None, help="the data folder (default: the run's config data.path)")
    parser.add_argument("--device", default="cpu", help="where the forwards run (default: cpu), e.g. cuda")
    parser.add_argument("--no-ema", action="store_true", help="the raw weights instead of the EMA")
    parser.add_argument("--json", default=None, help="also write the statistics to this JSON file")
    args = parser.parse_args(argv)
    try:
        json_path = None if args.json is None else output_file(args.json, "--json")
        args.device = parse_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    from vit5_sit.config import ConfigError
    from vit5_sit.hub.model_files import ModelLoadError, check_model

    try:  # every model checked before the first is measured: a typo in the last one fails at once
        for name in args.models:
            if not Path(name).exists():
                raise AttentionError(f"{name}: no such run, checkpoint or model folder")
            if Path(name).is_file():
                raise AttentionError(f"{name}: an official .pt file has no data settings; give one of our folders")
            check_model(name, use_ema=not args.no_ema)
    except (AttentionError, ModelLoadError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    records, summaries = {}, {}
    for name in args.models:
        try:
            stats = _measure_one(name, args)
        except (AttentionError, ModelLoadError, ConfigError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{name}\n{format_table(stats)}", flush=True)
        records[name] = {str(t): [asdict(b) for b in blocks] for t, blocks in stats.items()}
        summaries[name] = summarize(stats)
    print(f"\nsummary (peak / lowest / mean over blocks and t = {','.join(str(t) for t in args.t)})")
    print(format_summary(summaries))
    if json_path is not None:
        from vit5_sit.common.utils import atomic_write_text

        record = {"num": args.num, "seed": args.seed, "ema": not args.no_ema, "t": list(args.t),
                  "summary": summaries, "models": records}
        atomic_write_text(json_path, json.dumps(record, indent=1) + "\n")
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
