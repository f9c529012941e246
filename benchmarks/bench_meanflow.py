"""What a MeanFlow training step costs against a flow-matching step, side by side (issue 43).

Each preset trains with both objectives of `vit5_sit.train.objective` (the same data batch, AdamW step
included): `Objective` (flow matching) and `MeanFlowObjective` (the JVP target on the share of the batch with an
interval, the guidance pass when guidance is trained in, then forward + backward). Steps are interleaved
(flow, MeanFlow, flow, ...) and the median reported, so a busy machine slows both alike; on the CPU the table
also gives the process CPU time per step (with --threads 1, the compute time of the step). The ratio is what
the MeanFlow runs' step budget is set from: equal training CPU time, not equal steps.

    python benchmarks/bench_meanflow.py --presets SiTRoPE-T/4 ViT5G-T/4 --threads 1 --iters 8
    python benchmarks/bench_meanflow.py --presets SiT-XL/2 ViT5G-XL/2 --input-size 32 --channels 4 \\
        --batch-size 32 --bf16 --compile   # GPU (benchmarks/run_gpu.sh)

``--compare-compile``: eager against ``torch.compile`` (``nn.Module.compile``, as ``train.compile=true``) for each
objective instead, interleaved, with the time the first steps took (compiling; the JVP target, the guidance pass
and the training forward are separate graphs, and the JVP's batch size changes from step to step):

    python benchmarks/bench_meanflow.py --compare-compile --presets ViT5G-T/4 --input-size 16 --batch-size 32 \
        --threads 1 --iters 5

``--imf``: the MeanFlow column is improved MeanFlow's step (``meanflow.variant=imf``, the paper's ratio 0.5).

``--sampling``: the two bundled demos instead, 100 images each (10 classes x 10, seeds 0-99), with each model's
own default sampler and guidance (the flow demo: ODE Euler 6 steps, autoguidance on t in [0, 0.5] = 10 network
passes an image; the one-step demo: 1 pass, its guidance a network input), interleaved, the median of --iters rounds:

    python benchmarks/bench_meanflow.py --sampling --threads 1 --iters 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit5_sit.models import create_model  # noqa: E402
from vit5_sit.train.objective import Batch, MeanFlowObjective, Objective, StepRng, Trainee  # noqa: E402
from vit5_sit.transport import MeanFlowConfig, Transport, TransportConfig  # noqa: E402

WARMUP = 2


def build(name: str, objective: str, args: argparse.Namespace, compiled: bool | None = None):
    """(net, optimizer, objective) for one preset; ``compiled`` None = ``--compile``."""
    torch.manual_seed(0)
    meanflow = objective == "meanflow"
    model = create_model(name, input_size=args.input_size, in_channels=args.channels, num_classes=args.classes,
                         mean_flow=meanflow, guidance_input=meanflow and args.imf).to(args.device).train()
    if args.compile if compiled is None else compiled:
        model.compile()
    net = Trainee(model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    transport = Transport(TransportConfig())
    if objective == "meanflow":
        cfg = (MeanFlowConfig(variant="imf", ratio=0.5, adaptive_c=0.01) if args.imf  # the paper's values
               else MeanFlowConfig(guidance_scale=args.guidance))
        obj = MeanFlowObjective(transport, model.null_label, 0.1, cfg)
    else:
        obj = Objective(transport, model.null_label, 0.1)
    return net, opt, obj


def step(net, opt, obj, batch: Batch, i: int, args) -> None:
    rng = StepRng(0, i, args.batch_size, slice(0, args.batch_size))
    autocast = (torch.autocast(args.device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext())
    with autocast:
        loss = obj(net, batch, rng)["loss"]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if args.device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["SiTRoPE-T/4", "ViT5G-T/4"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--input-size", type=int, default=32)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--guidance", type=float, default=3.0, help="guidance trained in (1 = none)")
    p.add_argument("--imf", action="store_true", help="the MeanFlow step is improved MeanFlow's (meanflow.variant=imf: "
                   "guidance inputs, half the batch with d > 0; --guidance unused)")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sampling", action="store_true", help="time the two bundled demos' sampling instead")
    p.add_argument("--compare-compile", action="store_true",
                   help="eager against torch.compile, for each objective, instead of MeanFlow against flow")
    p.add_argument("--convert", action="store_true",
                   help="train.init_from's conversion of a flow model saved as an official SiT .pt, first")
    args = p.parse_args(argv)
    if args.sampling:
        if args.threads:
            torch.set_num_threads(args.threads)
        return sampling(args)
    args.device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(args.batch_size, args.channels, args.input_size, args.input_size, generator=g)
    batch = Batch(x1.to(args.device), torch.randint(0, args.classes, (args.batch_size,), generator=g).to(args.device))
    mode = "eager and compiled" if args.compare_compile else "compiled" if args.compile else "eager"
    print(f"device {args.device}, threads {torch.get_num_threads()}, batch {args.batch_size}, "
          f"{args.input_size}x{args.input_size}x{args.channels}, "
          f"{'iMF (guidance an input)' if args.imf else f'guidance {args.guidance:g}'}, "
          f"{'bf16' if args.bf16 else 'fp32'}, {mode}, {args.iters} steps each")
    if args.compare_compile:
        return compare_compile(batch, args)
    if args.convert:
        for name in args.presets:
            convert_official(name, batch, args)
    print("| preset | flow ms/step | MeanFlow ms/step | ratio (wall) | flow CPU ms | MeanFlow CPU ms | ratio (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.presets:
        runs = {k: build(name, k, args) for k in ("flow", "meanflow")}
        wall, cpu, _ = timed(runs, batch, args)
        fw, mw = statistics.median(wall["flow"]), statistics.median(wall["meanflow"])
        fc, mc = statistics.median(cpu["flow"]), statistics.median(cpu["meanflow"])
        print(f"| {name} | {fw:.0f} | {mw:.0f} | {mw / fw:.2f}x | {fc:.0f} | {mc:.0f} | {mc / fc:.2f}x |", flush=True)


def convert_official(name: str, batch: Batch, args: argparse.Namespace) -> None:
    """``train.init_from`` on an official SiT file: a flow model of ``name`` (random weights: the official
    SiT-XL/2 file is not on the GPU machine) saved as a raw state dict .pt, read back into the MeanFlow (--imf:
    iMF) model by `vit5_sit.train.init_from`; prints the seconds it took and the largest difference of the
    converted model's output from the flow model's, over random intervals (0: bit for bit)."""
    import dataclasses
    import tempfile

    from vit5_sit.train.init_from import convert, flow_state

    torch.manual_seed(0)
    flow = create_model(name, input_size=args.input_size, in_channels=args.channels, num_classes=args.classes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "SiT-official.pt"
        torch.save(flow.state_dict(), path)
        start = time.perf_counter()
        mcfg = dataclasses.replace(flow.cfg, mean_flow=True, guidance_input=args.imf)
        model = create_model(mcfg)
        state, what = flow_state(str(path), mcfg)
        convert(model, state)
        seconds = time.perf_counter() - start
    flow, model = flow.to(args.device).eval(), model.to(args.device).eval()
    x, y = batch.x1, batch.y
    t = torch.rand(len(x), device=x.device)
    kw = {"guidance": torch.tensor([[2.0, 0.0, 1.0]], device=x.device).expand(len(x), 3)} if args.imf else {}
    autocast = (torch.autocast(args.device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext())
    with torch.no_grad(), autocast:
        want = flow(x, t, y)
        diff = max((model(x, t, y, interval=d, **kw) - want).abs().max().item()
                   for d in (torch.zeros_like(t), torch.rand_like(t)))
    print(f"convert {name} from {what}: {seconds:.1f} s to read and convert; max |converted - flow| = {diff:g}",
          flush=True)


def timed(runs: dict, batch: Batch, args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """Interleaved steps of ``runs``: (wall ms, CPU ms of the timed steps, wall s of the WARMUP steps) per run."""
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    warm = dict.fromkeys(runs, 0.0)
    for i in range(WARMUP + args.iters):
        for k, (net, opt, obj) in runs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            step(net, opt, obj, batch, i, args)
            if i >= WARMUP:
                wall[k].append(1000 * (time.perf_counter() - w0))
                cpu[k].append(1000 * (time.process_time() - c0))
            else:
                warm[k] += time.perf_counter() - w0
    return wall, cpu, warm


def compare_compile(batch: Batch, args: argparse.Namespace) -> None:
    """Eager against compiled, each objective, each preset: one table row per (preset, objective)."""
    print("| preset | objective | eager ms/step | compiled ms/step | speed-up (wall) | eager CPU ms | compiled CPU ms "
          f"| first {WARMUP} steps, eager / compiled s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.presets:
        for objective in ("flow", "meanflow"):
            runs = {mode: build(name, objective, args, compiled=mode == "compiled") for mode in ("eager", "compiled")}
            wall, cpu, warm = timed(runs, batch, args)
            ew, cw = statistics.median(wall["eager"]), statistics.median(wall["compiled"])
            ec, cc = statistics.median(cpu["eager"]), statistics.median(cpu["compiled"])
            print(f"| {name} | {objective} | {ew:.0f} | {cw:.0f} | {ew / cw:.2f}x | {ec:.0f} | {cc:.0f} | "
                  f"{warm['eager']:.1f} / {warm['compiled']:.1f} |", flush=True)


def sampling(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_guidance, beside this file
    from bench_guidance import nfe_per_image

    from vit5_sit.pipeline import Vit5SitPipeline

    labels = [c for c in range(10) for _ in range(10)]
    pipes = {name: Vit5SitPipeline.from_pretrained(name) for name in ("demo", "demo-1step")}
    for pipe in pipes.values():
        pipe.set_progress_bar_config(disable=True)
        pipe(class_labels=[0], seed=0)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in pipes}
    for _ in range(args.iters):
        for name, pipe in pipes.items():
            start = time.perf_counter()
            pipe(class_labels=labels, seed=0, batch_size=100)
            times[name].append(time.perf_counter() - start)
    print(f"threads {torch.get_num_threads()}, 100 images (10 classes x 10), median of {args.iters} rounds")
    print("| model | sampler | network passes / image | s / 100 images | ms / image |")
    print("|---|---|---|---|---|")
    for name, pipe in pipes.items():
        sc, scale = pipe.config.sampler, pipe.config.log.sample_cfg_scale
        low, high = pipe.config.log.sample_guidance_interval
        as_input = pipe.config.model_config().guidance_input  # iMF: the scale is a network input, one pass
        passes = nfe_per_image(sc.steps, scale, (low, high), as_input)  # Euler: guided steps inside the interval
        t = statistics.median(times[name])
        kind = "autoguidance" if pipe.guide is not None else "guidance"
        where = "" if (low, high) == (0.0, 1.0) or scale == 1 else f" on t in [{low:g}, {high:g}]"
        how = f"{kind} {scale:g}{where}" + (" (an input)" if as_input else "")
        print(f"| {name} | {sc.mode}/{sc.method} {sc.steps} steps, {how} | {passes} | {t:.2f} | "
              f"{10 * t:.1f} |")
    ratio = statistics.median(times["demo"]) / statistics.median(times["demo-1step"])
    print(f"one-step demo: {ratio:.1f}x faster")


if __name__ == "__main__":
    main()
