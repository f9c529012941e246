"""Training-step cost of model presets: forward+backward throughput and peak memory, side by side.

The target (issue 2): a ViT-5 model costs at most 1.10x the step time of the vanilla SiT model of the same
size. Steps of the models are interleaved (A, B, A, B, ...) and the median is reported, so a machine shared
with other jobs slows all models alike. On the CPU the table also gives the process CPU time per step,
which waiting for a busy core does not inflate (with --threads 1 it is the compute time of the step).
Peak memory is measured separately, one model per spawned process: on CUDA `max_memory_allocated`, on
the CPU the growth of the process's peak resident memory (weights, gradients and activations of a step).

    python benchmarks/bench_models.py --presets SiT-T/2 ViT5-T/2 --batch-size 8 --input-size 32 --iters 10
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
    model = create_model(name, input_size=args.input_size).to(args.device).train()
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
    times: dict[str, list[float]] = {name: [] for name in args.presets}
    cpu_times: dict[str, list[float]] = {name: [] for name in args.presets}
    for i in range(WARMUP + args.iters):
        for name, (model, step_model, batch) in models.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            train_step(model, step_model, batch, args)
            if i >= WARMUP:
                times[name].append(time.perf_counter() - start)
                cpu_times[name].append(time.process_time() - cpu_start)
    del models
    memory = {name: measure_memory(name, args) for name in args.presets}

    device = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else (
        f"cpu, {args.threads} threads")
    print(f"device: {device}; torch {torch.__version__}; batch {args.batch_size}, input {args.input_size}x"
          f"{args.input_size}; {'bf16 autocast' if args.bf16 else 'fp32'}; "
          f"{'compiled' if args.compile else 'eager'}; median of {args.iters} steps (forward+backward)")
    cpu = args.device.type == "cpu"
    columns = ["preset", "params", "GFLOPs", "step ms", "images/s", "peak MiB", "time / vanilla"]
    if cpu:
        columns += ["CPU ms", "CPU / vanilla"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|")
    wall = {name: statistics.median(ts) for name, ts in times.items()}
    proc = {name: statistics.median(ts) for name, ts in cpu_times.items()}
    for name in args.presets:
        base = vanilla_of(name)
        params = count_params(model_config(name, input_size=args.input_size))
        row = [name, f"{params / 1e6:.2f}M", f"{count_flops(name, args.input_size) / 1e9:.2f}",
               f"{wall[name] * 1e3:.1f}", f"{args.batch_size / wall[name]:.1f}", f"{memory[name]:.0f}",
               f"{wall[name] / wall[base]:.3f}x" if base in wall else ""]
        if cpu:
            row += [f"{proc[name] * 1e3:.1f}", f"{proc[name] / proc[base]:.3f}x" if base in proc else ""]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
