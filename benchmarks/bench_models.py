"""Training-step and inference cost of model presets, side by side: forward+backward and no-grad forward.

The target (issue 13): a ViT-5 model costs at most 1.05x the time of the vanilla SiT model of the same
size, in training and inference. Steps of the models are interleaved (A, B, A, B, ...) and the median is
reported, so a machine shared with other jobs slows all models alike. On the CPU the table also gives the
process CPU time per step, which waiting for a busy core does not inflate (with --threads 1 it is the
compute time of the step).
Peak memory is measured separately, one model per spawned process: on CUDA `max_memory_allocated`, on
the CPU the growth of the process's peak resident memory (weights, gradients and activations of a step).

    python benchmarks/bench_models.py --presets SiT-T/4 ViT5-T/4 --batch-size 64 --channels 1 --iters 10 --threads 1
    python benchmarks/bench_models.py --presets SiT-S/2 ViT5-S/2 --batch-size 8 --iters 6 --threads 1
    python benchmarks/bench_models.py --presets SiT-XL/2 ViT5-XL/2 --batch-size 32 --bf16 --compile  # GPU
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit5_sit.models import PRESETS, count_flops, count_params, create_model, model_config  # noqa: E402

WARMUP = 2  # untimed steps per model (the first compiles with --compile)


def build(name: str, args: argparse.Namespace):
    torch.manual_seed(0)
    channels = {"in_channels": args.channels} if args.channels else {}
    model = create_model(name, input_size=args.input_size, **channels).to(args.device).train()
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, cfg.in_channels, args.input_size, args.input_size, generator=gen)
    batch = (x.to(args.device), torch.rand(args.batch_size, generator=gen).to(args.device),
             torch.randint(0, cfg.num_classes, (args.batch_size,), generator=gen).to(args.device))
    step_model = torch.compile(model) if args.compile else model
    return model, step_model, batch


def train_step(model, step_model, batch, args: argparse.Namespace) -> None:
    """Forward, a regression loss, backward; gradients freed afterwards (no optimizer step)."""
    bf16 = torch.autocast(args.device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    with bf16:
        out = step_model(*batch)
        loss = (out.float() - batch[0]).square().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    if args.device.type == "cuda":
        torch.cuda.synchronize()


def infer_step(model, step_model, batch, args: argparse.Namespace) -> None:
    """A no-grad forward in eval mode (one sampler step's network evaluation)."""
    bf16 = torch.autocast(args.device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    with torch.no_grad(), bf16:
        step_model(*batch)
    if args.device.type == "cuda":
        torch.cuda.synchronize()


STEPS = {"train": train_step, "infer": infer_step}


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def peak_memory_mib(name: str, args: argparse.Namespace) -> float:
    """Run in a fresh process: the memory of building the model and running two steps, in MiB.

    CPU: the growth of the peak resident set (VmHWM, reset through /proc/self/clear_refs); NaN where Linux's
    /proc is not available."""
    if args.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(args.device)
        base = torch.cuda.memory_allocated(args.device)
    else:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS to the current RSS
            base = _proc_status_kib("VmRSS")
        except OSError:
            return math.nan
    model, step_model, batch = build(name, args)
    for _ in range(2):
        train_step(model, step_model, batch, args)
    if args.device.type == "cuda":
        return (torch.cuda.max_memory_allocated(args.device) - base) / 2 ** 20
    return (_proc_status_kib("VmHWM") - base) / 1024


def _memory_child(name: str, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(args.threads)
    queue.put(peak_memory_mib(name, args))


def measure_memory(name: str, args: argparse.Namespace) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(name, args, queue))
    proc.start()
    value = queue.get()
    proc.join()
    return value


def vanilla_of(name: str) -> str | None:
    return "SiT-" + name[len("ViT5-"):] if name.startswith("ViT5-") else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--presets", nargs="+", default=["SiT-S/2", "ViT5-S/2"], metavar="NAME",
                        help="model presets (python -m vit5_sit.models lists them)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-size", type=int, default=32, help="input height = width (32: 256px latents)")
    parser.add_argument("--channels", type=int, default=None, help="input channels (default: the preset's, 4)")
    parser.add_argument("--modes", nargs="+", default=["train", "infer"], choices=list(STEPS),
                        help="train: forward+backward; infer: no-grad forward in eval mode")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes (faster)")
    parser.add_argument("--iters", type=int, default=10, help="timed steps per model")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile the models")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in args.presets:
        if name not in PRESETS:
            parser.error(f"--presets: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.threads = torch.get_num_threads()

    models = {name: build(name, args) for name in args.presets}
    keys = [(mode, name) for mode in args.modes for name in args.presets]
    times: dict[tuple, list[float]] = {key: [] for key in keys}
    cpu_times: dict[tuple, list[float]] = {key: [] for key in keys}
    for i in range(WARMUP + args.iters):
        for mode, name in keys:  # interleaved: every model and mode once per round
            model, step_model, batch = models[name]
            model.train(mode == "train")
            start, cpu_start = time.perf_counter(), time.process_time()
            STEPS[mode](model, step_model, batch, args)
            if i >= WARMUP:
                times[mode, name].append(time.perf_counter() - start)
                cpu_times[mode, name].append(time.process_time() - cpu_start)
    del models
    memory = {name: math.nan if args.no_memory or "train" not in args.modes else measure_memory(name, args)
              for name in args.presets}

    device = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else (
        f"cpu, {args.threads} threads")
    channels = args.channels or model_config(args.presets[0]).in_channels
    print(f"device: {device}; torch {torch.__version__}; batch {args.batch_size}, input {args.input_size}x"
          f"{args.input_size}x{channels}; {'bf16 autocast' if args.bf16 else 'fp32'}; "
          f"{'compiled' if args.compile else 'eager'}; median of {args.iters} interleaved rounds "
          "(train: forward+backward; infer: no-grad forward)")
    cpu = args.device.type == "cpu"
    columns = ["preset", "mode", "params", "GFLOPs", "ms", "images/s", "peak MiB", "time / vanilla"]
    if cpu:
        columns += ["CPU ms", "CPU / vanilla"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join(["---", "---"] + ["---:"] * (len(columns) - 2)) + "|")
    wall = {key: statistics.median(ts) for key, ts in times.items()}
    proc = {key: statistics.median(ts) for key, ts in cpu_times.items()}
    for mode, name in keys:
        base = (mode, vanilla_of(name))
        params = count_params(model_config(name, input_size=args.input_size, in_channels=channels))
        flops = count_flops(model_config(name, input_size=args.input_size, in_channels=channels))
        mem = f"{memory[name]:.0f}" if mode == "train" and not math.isnan(memory[name]) else ""
        row = [name, mode, f"{params / 1e6:.2f}M", f"{flops / 1e9:.2f}", f"{wall[mode, name] * 1e3:.1f}",
               f"{args.batch_size / wall[mode, name]:.1f}", mem,
               f"{wall[mode, name] / wall[base]:.3f}x" if base in wall else ""]
        if cpu:
            row += [f"{proc[mode, name] * 1e3:.1f}",
                    f"{proc[mode, name] / proc[base]:.3f}x" if base in proc else ""]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
