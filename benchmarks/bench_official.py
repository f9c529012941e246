"""Side by side with the official SiT code: its model, our SiT and our ViT-5 at the same size, and one sampling run.

Needs a checkout of github.com/willisma/SiT (its `models.py` and `transport/`, nothing of it copied here) and
timm, which the official model imports (`pip install timm`; not a dependency of this project). Our SiT gets the
official model's (randomised) weights, so the script also prints how far the two outputs are apart.

Training step (forward, a regression loss, backward) and inference (no-grad forward, eval mode) of the three
models, interleaved (official, ours, ViT-5, official, ...), median wall and process CPU time. Then sampling at
equal NFE: the official `Sampler.sample_ode(sampling_method="euler", num_steps=N + 1)` (N + 1 points = N Euler
steps) against our `sample(..., SamplerConfig(mode="ode", method="euler", steps=N))`, same weights and noise.

    git clone https://github.com/willisma/SiT /tmp/SiT   # or any checkout of it
    python benchmarks/bench_official.py --official-repo /tmp/SiT --size S --patch 2 --batch-size 8 --threads 1
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, not another installed copy

from vit5_sit.models import create_model, model_config  # noqa: E402
from vit5_sit.transport import SamplerConfig, Transport, TransportConfig, sample  # noqa: E402

WARMUP = 2  # untimed rounds


def load_official(repo: Path):
    """The official `SiT_models` dict and `create_transport`, `Sampler`, imported from the checkout."""
    if not (repo / "models.py").is_file() or not (repo / "transport" / "__init__.py").is_file():
        raise ValueError(f"--official-repo: {repo} has no models.py and transport/ (a checkout of "
                         "github.com/willisma/SiT is expected)")
    try:
        importlib.import_module("timm")
    except ImportError:
        raise ValueError("the official SiT model needs timm: pip install timm") from None
    sys.path.insert(0, str(repo))
    models = importlib.import_module("models")
    transport = importlib.import_module("transport")
    return models.SiT_models, transport.create_transport, transport.Sampler


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Every trainable weight random (the zero-initialised gates and output layer too): real outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * (p[0].numel() if p.ndim > 1 else 16) ** -0.5)


def timed(fn) -> tuple[float, float]:
    start, cpu_start = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu_start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official-repo", type=Path, required=True, help="a checkout of github.com/willisma/SiT")
    p.add_argument("--size", default="S", choices=["S", "B", "L", "XL"], help="model size (official names)")
    p.add_argument("--patch", type=int, default=2, choices=[2, 4, 8])
    p.add_argument("--input-size", type=int, default=32, help="latent side (32 = 256 px images)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--iters", type=int, default=5, help="timed rounds of the model steps")
    p.add_argument("--sample-steps", type=int, default=10, help="Euler steps (= NFE) of the sampling run")
    p.add_argument("--sample-repeats", type=int, default=2, help="timed sampling runs per sampler")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    for name in ("batch_size", "iters", "sample_steps", "sample_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    try:
        official_models, create_transport, Sampler = load_official(args.official_repo)
    except ValueError as err:
        p.error(str(err))

    # The three models: official SiT, ours with its weights, ViT-5 at the same size.
    name = f"{args.size}/{args.patch}"
    torch.manual_seed(0)
    official = official_models[f"SiT-{name}"](input_size=args.input_size).to(device)
    randomize(official)
    ours = create_model(f"SiT-{name}", input_size=args.input_size).to(device)
    ours.load_state_dict(official.state_dict(), strict=True)
    vit5 = create_model(f"ViT5-{name}", input_size=args.input_size).to(device)
    randomize(vit5)
    models = {f"official SiT-{name}": official, f"our SiT-{name}": ours, f"our ViT5-{name}": vit5}
    C = model_config(f"SiT-{name}").in_channels
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch_size, C, args.input_size, args.input_size, generator=gen).to(device)
    t = torch.rand(args.batch_size, generator=gen).to(device)
    y = torch.randint(0, 1000, (args.batch_size,), generator=gen).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step(model) -> None:
        model.train()
        out = model(x, t, y)[:, :C]  # the official model returns the learn_sigma half too
        (out - x).square().mean().backward()
        model.zero_grad(set_to_none=True)
        sync()

    @torch.no_grad()
    def infer_step(model) -> None:
        model.eval()
        model(x, t, y)
        sync()

    with torch.no_grad():
        official.eval(), ours.eval()
        diff = (official(x, t, y)[:, :C] - ours(x, t, y)).abs().max().item()
    wall = {(m, n): [] for m in ("train", "infer") for n in models}
    cpu = {key: [] for key in wall}
    for i in range(WARMUP + args.iters):
        for mode, step in (("train", train_step), ("infer", infer_step)):
            for label, model in models.items():
                w, c = timed(lambda: step(model))  # noqa: B023 (called at once)
                if i >= WARMUP:
                    wall[mode, label].append(w)
                    cpu[mode, label].append(c)

    # Sampling at equal NFE, the same weights and noise.
    n = args.sample_steps
    official_sample = Sampler(create_transport("Linear", "velocity")).sample_ode(sampling_method="euler",
                                                                                num_steps=n + 1)
    transport, sampler_cfg = Transport(TransportConfig()), SamplerConfig(mode="ode", method="euler", steps=n)
    noise = torch.randn(args.batch_size, C, args.input_size, args.input_size, generator=gen).to(device)
    official.eval(), ours.eval(), vit5.eval()
    samplers = {
        f"official Sampler.sample_ode euler, SiT-{name}": lambda: official_sample(noise, official.forward, y=y)[-1],
        f"our sample() ode euler, SiT-{name}": lambda: sample(ours, noise, y, transport, sampler_cfg).samples,
        f"our sample() ode euler, ViT5-{name}": lambda: sample(vit5, noise, y, transport, sampler_cfg).samples,
    }
    with torch.no_grad():
        results = {label: fn() for label, fn in samplers.items()}  # also the warm-up
    sample_diff = (results[next(iter(samplers))][:, :C] - results[list(samplers)[1]]).abs().max().item()
    sample_wall = {label: [] for label in samplers}
    sample_cpu = {label: [] for label in samplers}
    with torch.no_grad():
        for _ in range(args.sample_repeats):
            for label, fn in samplers.items():
                w, c = timed(lambda: (fn(), sync()))  # noqa: B023
                sample_wall[label].append(w)
                sample_cpu[label].append(c)

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"device: {where}; torch {torch.__version__}; batch {args.batch_size}, input {args.input_size}x"
          f"{args.input_size}x{C}; fp32; median of {args.iters} interleaved rounds")
    print(f"our SiT vs official SiT, same weights: max |output difference| = {diff:.2e}; "
          f"after {n} Euler steps: {sample_diff:.2e}\n")
    print("| model | mode | ms | CPU ms | time / official | CPU / official | time / our SiT | CPU / our SiT |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    labels = list(models)
    for mode in ("train", "infer"):
        w = {label: statistics.median(wall[mode, label]) for label in labels}
        c = {label: statistics.median(cpu[mode, label]) for label in labels}
        for label in labels:
            print(f"| {label} | {mode} | {w[label] * 1e3:.1f} | {c[label] * 1e3:.1f} | "
                  f"{w[label] / w[labels[0]]:.3f}x | {c[label] / c[labels[0]]:.3f}x | "
                  f"{w[label] / w[labels[1]]:.3f}x | {c[label] / c[labels[1]]:.3f}x |")
    print(f"\nsampling: {n} Euler steps (NFE {n}), batch {args.batch_size}, no guidance, median of "
          f"{args.sample_repeats} runs\n")
    print("| sampler | s | CPU s | time / official | CPU / official |")
    print("|---|---:|---:|---:|---:|")
    first = next(iter(samplers))
    w0, c0 = statistics.median(sample_wall[first]), statistics.median(sample_cpu[first])
    for label in samplers:
        w, c = statistics.median(sample_wall[label]), statistics.median(sample_cpu[label])
        print(f"| {label} | {w:.2f} | {c:.2f} | {w / w0:.3f}x | {c / c0:.3f}x |")


if __name__ == "__main__":
    main()
