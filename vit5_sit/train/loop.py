"""The training loop: accelerate (1 CPU to many GPUs / nodes), AdamW, EMA, atomic checkpoints, exact resume.

Every random draw of a step is a pure function of ``(train.seed, step)``: the data order (a seeded
permutation per epoch, read as one stream of global batches), the flips, the noise, the times and the label
dropout of the whole global batch are drawn from a generator seeded by the step, and each process takes its
slice. So a resumed run continues exactly where it stopped, and the same global batch gives the same
samples on one process or on many.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vit5_sit.config import ExperimentConfig
from vit5_sit.models import DiT, create_model
from vit5_sit.train import preflight
from vit5_sit.train.checkpoint import load_checkpoint, save_checkpoint
from vit5_sit.train.ema import EMA
from vit5_sit.train.sharding import full_state, full_tensor, is_sharded, shard_model, shard_optimizer_state
from vit5_sit.transport import Transport


class TrainingError(RuntimeError):
    """A run that cannot start or continue; the message says what to change."""


# ----------------------------------------------------------------------------------------------------------
# Data order.

class StepSampler(Sampler):
    """Yields ``(epoch, index)`` for this process, starting at ``start_step``; infinite.

    The data is one stream of seeded per-epoch permutations. Optimizer step ``s`` consumes positions
    ``[s * G, (s + 1) * G)``; within it, micro-batch ``a`` of process ``r`` takes the slice
    ``a * W * b + r * b + [0, b)`` (G global batch, W processes, b per-process micro-batch).
    """

    def __init__(self, n: int, seed: int, micro_batch: int, world: int, rank: int, grad_accum: int,
                 start_step: int = 0) -> None:
        self.n, self.seed, self.micro, self.world = n, seed, micro_batch, world
        self.rank, self.accum, self.start_step = rank, grad_accum, start_step
        self._perm: tuple[int, torch.Tensor] | None = None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = (epoch, torch.randperm(self.n, generator=g))
        return self._perm[1]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        global_batch = self.micro * self.world * self.accum
        step = self.start_step
        while True:
            for a in range(self.accum):
                first = step * global_batch + a * self.world * self.micro + self.rank * self.micro
                for pos in range(first, first + self.micro):
                    epoch, i = divmod(pos, self.n)
                    yield epoch, int(self._permutation(epoch)[i])
            step += 1


class EpochIndexed(Dataset):
    """Lets a dataset's seeded flips know the epoch: ``ds[(epoch, index)]``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return self.dataset[index]


def build_training_dataset(cfg: ExperimentConfig) -> Dataset:
    from vit5_sit.data import build_dataset

    return build_dataset(cfg.data.kind, cfg.data.path, resolution=cfg.data.resolution,
                         channels=cfg.data.channels, random_flip=cfg.data.random_flip, seed=cfg.train.seed)


# ----------------------------------------------------------------------------------------------------------
# Per-step randomness.

@dataclass
class StepNoise:
    t: torch.Tensor      # (b,)
    noise: torch.Tensor  # (b, C, H, W)
    drop: torch.Tensor   # (b,) bool: replace the label by the null class


def step_noise(seed: int, step: int, micro_index: int, global_batch: int, shape: tuple[int, ...],
               rank: int, world: int, micro: int, transport: Transport, drop_prob: float) -> StepNoise:
    """The noise of this process's micro-batch, sliced from a draw for the whole global batch."""
    g = torch.Generator().manual_seed((seed + 1) * 7_919_113 + step)
    t = transport.sample_t(global_batch, generator=g)
    noise = torch.randn((global_batch, *shape), generator=g)
    drop = torch.rand(global_batch, generator=g) < drop_prob
    lo = micro_index * world * micro + rank * micro
    sl = slice(lo, lo + micro)
    return StepNoise(t[sl], noise[sl], drop[sl])


# ----------------------------------------------------------------------------------------------------------
# The loop.

def train(cfg: ExperimentConfig, resume: str | None = None, log_fn=None) -> Path:
    """Train ``cfg`` to ``train.max_steps``; returns the run folder. ``resume``: None, 'auto' or a path."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from tqdm.auto import tqdm

    tc = cfg.train
    run_dir = cfg.run_dir
    trackers = [] if cfg.log.tracker == "none" else [cfg.log.tracker]
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),  # without it, CPU processes of a multi-process launch don't join
        mixed_precision=tc.mixed_precision,
        gradient_accumulation_steps=tc.grad_accum,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
    )
    log = log_fn or (lambda msg: accelerator.print(msg))
    if accelerator.distributed_type.value in ("DEEPSPEED", "MEGATRON_LM"):
        raise TrainingError(
            f"{accelerator.distributed_type.value} is not supported: launch with data parallelism "
            "(accelerate launch --multi_gpu ...) or with FSDP (train.fsdp=true, or an accelerate config with "
            "distributed_type: FSDP)")
    world, rank = accelerator.num_processes, accelerator.process_index
    if tc.global_batch_size % (world * tc.grad_accum):
        raise TrainingError(
            f"train.global_batch_size={tc.global_batch_size} is not divisible by processes ({world}) x "
            f"train.grad_accum ({tc.grad_accum}); choose a multiple of {world * tc.grad_accum}")
    micro = tc.global_batch_size // (world * tc.grad_accum)
    log(f"{world} process(es) ({accelerator.distributed_type.value}), per-process batch {micro} x "
        f"{tc.grad_accum} accumulation = global batch {tc.global_batch_size}")
    sharded = _use_fsdp(cfg, accelerator, world, log)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = tc.tf32
        torch.backends.cudnn.allow_tf32 = tc.tf32

    # Where to start (run folder, checkpoints and settings checked before any compute).
    start_ckpt = preflight.start_checkpoint(cfg, resume, log=log, main=accelerator.is_main_process)

    # Model, EMA, optimizer.
    torch.manual_seed(tc.seed)
    mcfg = cfg.model_config()
    model = create_model(mcfg)
    model.label_dropout = False  # drawn below with the step's noise instead
    ema = EMA(model, tc.ema_decay, warmup=tc.ema_warmup)
    transport = Transport(cfg.transport)
    step, nonfinite_total, optimizer_state = 0, 0, None
    if start_ckpt is not None:
        model_sd, ema_sd, state = load_checkpoint(getattr(start_ckpt, "path", start_ckpt))
        model.load_state_dict(model_sd, strict=True)
        ema.load_state_dict(ema_sd)
        optimizer_state = state["optimizer"]
        step, nonfinite_total = int(state["step"]), int(state.get("nonfinite_total", 0))
        ema.num_updates = int(state.get("ema_updates", step))
        log(f"resumed from {getattr(start_ckpt, 'path', start_ckpt)} at step {step}")
    if tc.grad_checkpointing:
        model.set_grad_checkpointing(True)
    ema.model.to(accelerator.device)
    if sharded:  # the optimizer must be built over the shards
        shard_model(model.to(accelerator.device), accelerator.device.type)
        shard_model(ema.model, accelerator.device.type)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay,
                                  betas=(tc.beta1, tc.beta2))
    if optimizer_state is not None:
        optimizer.load_state_dict(shard_optimizer_state(optimizer_state, optimizer) if sharded else optimizer_state)
    if tc.compile:
        model = torch.compile(model)

    # Data: our own sampler shards the stream, so the loader is not passed through accelerate.
    dataset = build_training_dataset(cfg)
    data_shape = tuple(getattr(dataset, "sample_shape", ()) or ())
    model_shape = (mcfg.in_channels, mcfg.input_size, mcfg.input_size)
    if data_shape and data_shape != model_shape:
        raise TrainingError(
            f"the data gives samples of shape {data_shape} but the model expects {model_shape}; set "
            f"model.in_channels={data_shape[0]} model.input_size={data_shape[1]} (or fix data.resolution / "
            f"data.channels)")
    preflight.check_dataset(cfg, dataset, mcfg)
    if accelerator.is_main_process:  # only now: a start that fails leaves no run folder behind
        preflight.write_run_config(cfg)
    sampler = StepSampler(len(dataset), tc.seed, micro, world, rank, tc.grad_accum, start_step=step)
    loader = DataLoader(EpochIndexed(dataset), batch_size=micro, sampler=sampler, num_workers=cfg.data.num_workers,
                        pin_memory=torch.cuda.is_available(), drop_last=True,
                        persistent_workers=cfg.data.num_workers > 0)
    if not sharded:  # sharded: our FSDP2 wrapping, autocast below, no DDP wrapper
        model, optimizer = accelerator.prepare(model, optimizer)
    autocast = accelerator.autocast if sharded else contextlib.nullcontext
    if trackers:
        accelerator.init_trackers(cfg.log.project, config=_flat_hparams(cfg))

    shape = model_shape
    null_class = mcfg.num_classes
    drop_prob = mcfg.class_dropout_prob
    model.train()
    data_iter = iter(loader)
    bar = tqdm(total=tc.max_steps, initial=step, disable=not accelerator.is_main_process, desc="train",
               dynamic_ncols=True)
    nonfinite_run, t_last, images_since = 0, time.perf_counter(), 0
    if cfg.log.sample_every and step == 0:
        _sample_grid(cfg, ema, transport, run_dir, step, accelerator)
    while step < tc.max_steps:
        torch.manual_seed((tc.seed + 1) * 104_729 + step * 97 + rank)  # any other randomness: per step too
        lr = tc.lr * min(1.0, (step + 1) / tc.warmup_steps) if tc.warmup_steps else tc.lr
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=accelerator.device)
        for a in range(tc.grad_accum):
            x, y = next(data_iter)
            x, y = x.to(accelerator.device, non_blocking=True), y.to(accelerator.device, non_blocking=True)
            sn = step_noise(tc.seed, step, a, tc.global_batch_size, shape, rank, world, micro, transport,
                            drop_prob)
            y = torch.where(sn.drop.to(y.device), torch.full_like(y, null_class), y)
            if sharded:  # reduce-scatter the gradients once, after the last micro-batch
                model.set_requires_gradient_sync(a == tc.grad_accum - 1)
            with accelerator.accumulate(model):
                with autocast():
                    loss = transport.loss(model, x, y, t=sn.t.to(x.device), noise=sn.noise.to(x.device)).mean()
                accelerator.backward(loss)
                loss_sum += loss.detach() / tc.grad_accum
                if accelerator.sync_gradients:
                    grad_norm = _clip(accelerator, model, tc.grad_clip, sharded)
                    loss_all = accelerator.reduce(loss_sum, "mean")
                    # fp16: overflowing gradients are the loss scaler's business (it skips and rescales).
                    grads_ok = math.isfinite(grad_norm) or tc.mixed_precision == "fp16"
                    finite = bool(torch.isfinite(loss_all)) and grads_ok
                    if finite:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        step += 1
        if finite:
            nonfinite_run = 0
            ema.update(accelerator.unwrap_model(model))
        else:
            nonfinite_run += 1
            nonfinite_total += 1
            log(f"step {step}: non-finite loss or gradient ({float(loss_all):.4g}); step skipped "
                f"({nonfinite_run} in a row)")
            if nonfinite_run >= tc.max_nonfinite:
                raise TrainingError(
                    f"{nonfinite_run} non-finite steps in a row at step {step}: the run diverged. Try a lower "
                    f"train.lr (now {tc.lr:g}), train.mixed_precision=bf16 instead of fp16, model.qk_norm=true, "
                    f"or train.grad_clip=1.0; resume from the last checkpoint with --resume auto")
        images_since += tc.global_batch_size
        bar.update(1)
        if step % cfg.log.every == 0 or step == tc.max_steps:
            now = time.perf_counter()
            ips = images_since / max(now - t_last, 1e-9)
            t_last, images_since = now, 0
            stats = {"loss": float(loss_all), "grad_norm": grad_norm, "lr": lr, "images_per_s": ips,
                     "nonfinite_total": nonfinite_total}
            bar.set_postfix(loss=f"{stats['loss']:.4f}", gnorm=f"{grad_norm:.3g}", lr=f"{lr:.2g}",
                            ips=f"{ips:.1f}")
            if trackers:
                accelerator.log(stats, step=step)
            if log_fn is not None:
                log_fn(f"step {step} " + " ".join(f"{k}={v:.5g}" for k, v in stats.items()))
        if step % tc.ckpt_every == 0 or step == tc.max_steps:
            accelerator.wait_for_everyone()
            # Sharded: every process takes part in gathering the full tensors; the main one writes them.
            if sharded or accelerator.is_main_process:
                model_sd = full_state(accelerator.unwrap_model(model).state_dict())
                ema_sd = ema.state_dict()
                optimizer_sd = full_state(optimizer.state_dict()) if sharded else optimizer.state_dict()
            if accelerator.is_main_process:
                state = {"optimizer": optimizer_sd, "nonfinite_total": nonfinite_total,
                         "ema_updates": ema.num_updates,
                         "samples_seen": step * tc.global_batch_size}
                save_checkpoint(run_dir, step, model_sd, ema_sd, state, keep_last=tc.keep_last)
            accelerator.wait_for_everyone()
        if cfg.log.sample_every and step % cfg.log.sample_every == 0:
            _sample_grid(cfg, ema, transport, run_dir, step, accelerator)
    bar.close()
    preflight.report_skipped(dataset, log=log)
    accelerator.end_training()
    return run_dir


def _use_fsdp(cfg: ExperimentConfig, accelerator, world: int, log) -> bool:
    """Whether to shard with FSDP2: ``train.fsdp`` or an accelerate config with ``distributed_type: FSDP``."""
    wanted = cfg.train.fsdp or accelerator.distributed_type.value == "FSDP"
    if not wanted:
        return False
    if world == 1:
        log("FSDP asked for with one process: nothing to shard, training unsharded")
        return False
    if cfg.train.mixed_precision == "fp16":
        raise TrainingError("train.mixed_precision=fp16 is not supported with FSDP (its loss scaler needs sharded "
                            "gradients); use train.mixed_precision=bf16")
    log(f"FSDP2: each transformer block, the model and the EMA sharded over {world} processes"
        + (" (accelerate's fsdp_* options other than FSDP itself are not read)"
           if accelerator.distributed_type.value == "FSDP" else ""))
    return True


def _clip(accelerator, model: torch.nn.Module, max_norm: float | None, sharded: bool = False) -> float:
    """Global gradient norm (clipped to ``max_norm`` when set)."""
    if sharded:  # DTensor gradients: torch's norm reduces over the shards
        if max_norm is not None:
            return float(full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        return float(full_tensor(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()
                                                                 if p.grad is not None])))
    if max_norm is not None:
        return float(accelerator.clip_grad_norm_(model.parameters(), max_norm))
    accelerator.unscale_gradients()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def _flat_hparams(cfg: ExperimentConfig) -> dict:
    from vit5_sit.config import to_dict

    flat = {}
    for section, values in to_dict(cfg).items():
        if isinstance(values, dict):
            for k, v in values.items():
                flat[f"{section}.{k}"] = v if isinstance(v, int | float | str | bool) else str(v)
        else:
            flat[section] = values
    return flat


def _sample_grid(cfg: ExperimentConfig, ema: EMA, transport: Transport, run_dir: Path, step: int,
                 accelerator) -> None:
    """The run's fixed-seed grid from the EMA weights, on the main process (gathered first when sharded)."""
    from vit5_sit.generate import sample_images, save_labelled_grid

    model: DiT = ema.model
    if is_sharded(model):  # a collective: every process gathers, the main one samples
        full = ema.state_dict()
        if not accelerator.is_main_process:
            return
        model = create_model(cfg.model_config()).to(accelerator.device).eval()
        model.load_state_dict(full)
    elif not accelerator.is_main_process:
        return
    lc = cfg.log
    classes = [c for c in lc.sample_classes for _ in range(lc.sample_per_class)]
    seeds = list(range(lc.sample_seed, lc.sample_seed + len(classes)))
    images = sample_images(model, transport, cfg.sampler, classes, seeds, cfg_scale=lc.sample_cfg_scale,
                           vae=cfg.data.vae if cfg.data.kind == "latents" else None, device=accelerator.device)
    save_labelled_grid(images, run_dir / "samples" / f"step_{step:07d}.png", ncol=lc.sample_per_class,
                       row_labels=[f"class {c}" for c in lc.sample_classes])
