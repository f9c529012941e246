"""The training loop: accelerate (1 CPU to many GPUs / nodes), AdamW, EMA, atomic checkpoints, exact resume.

``train()`` reads top to bottom: launch, resume point, build, then per step the objective, backward,
optimizer step, EMA and the non-finite guard, then the periodic work (log, checkpoint, sample grid). How the
work is spread over processes (one, DDP, FSDP2) is the strategy's business (vit5_sit.train.strategy); what
is minimised is the objective's (vit5_sit.train.objective).

Every random draw of a step is a pure function of ``(train.seed, step)`` (vit5_sit.train.seeding): the data
order (a seeded permutation per epoch, read as one stream of global batches), the flips, the noise, the
times and the label dropout of the whole global batch, and each process takes its slice. So a resumed run
continues exactly where it stopped, and the same global batch gives the same samples on one process or on
many.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from vit5_sit.common.checks import OutputLock, UsageError
from vit5_sit.common.interrupt import Interrupted, stop_requested
from vit5_sit.config import ExperimentConfig
from vit5_sit.models import create_model
from vit5_sit.train import preflight
from vit5_sit.train.checkpoint import load_checkpoint, load_extra, save_checkpoint
from vit5_sit.train.ema import EMA
from vit5_sit.train.objective import Batch, MeanFlowObjective, Objective, StepRng, Trainee
from vit5_sit.train.seeding import derive_seed
from vit5_sit.train.strategy import FullState, Replicated, StrategyError, make_strategy
from vit5_sit.transport import Transport

PROJECTOR_FILE = "projector.safetensors"  # REPA's projector in a checkpoint folder


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
            g = torch.Generator().manual_seed(derive_seed(self.seed, "data-order", epoch))
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
# The loop.

@dataclass
class Launch:
    """The processes: accelerate, the strategy, this process's share of a global batch, logging."""

    cfg: ExperimentConfig
    accelerator: Any
    strategy: Replicated
    world: int
    rank: int
    micro: int                               # per-process micro-batch
    log: Callable[[str], None]
    log_fn: Callable[[str], None] | None     # the caller's: also gets the step lines
    trackers: list[str]


@dataclass
class State:
    """What a step changes."""

    net: nn.Module                           # the (prepared) Trainee
    optimizer: Any
    ema: EMA
    objective: Objective
    transport: Transport
    vae: Any                                 # latent runs: loaded once, for REPA's images and the grids
    step: int = 0
    nonfinite_total: int = 0
    nonfinite_run: int = 0


@dataclass
class StepResult:
    terms: dict[str, float]                  # loss and its terms, averaged over processes
    grad_norm: float
    lr: float
    finite: bool


def train(cfg: ExperimentConfig, resume: str | None = None, log_fn=None) -> Path:
    """Train ``cfg`` to ``train.max_steps``; returns the run folder. ``resume``: None, 'auto' or a path."""
    launch = _launch(cfg, log_fn)
    preflight.check_grid(cfg)  # a file in the way, a read-only folder, a grid too large: said before the lock
    preflight.check_run_folder(cfg, launch.log)
    lock = _lock_run_folder(launch)
    try:
        return _train(launch, resume)
    finally:
        lock.release()


def _lock_run_folder(launch: Launch) -> OutputLock:
    """``<run folder>.lock``, taken by the main process before anything is read: a second training of the same
    run folder (the same command started twice, two study runners) is refused, on every process of its launch,
    instead of two trainings writing one folder's checkpoints. A lock left by a killed run is taken over."""
    run_dir = launch.cfg.run_dir
    lock, refused = OutputLock(run_dir, flag="run folder"), None
    if launch.accelerator.is_main_process:
        try:
            lock.acquire()
        except UsageError as e:
            refused = f"{e}; a second run needs its own folder: set name=... (or output_dir=...)"
    if launch.world > 1:  # every process of the launch stops, not only the main one
        import torch.distributed

        box = [refused]
        torch.distributed.broadcast_object_list(box, src=0)
        refused = box[0]
    if refused:
        lock.release()
        raise TrainingError(refused)
    return lock


def _train(launch: Launch, resume: str | None) -> Path:
    from tqdm.auto import tqdm

    cfg = launch.cfg
    tc, run_dir = cfg.train, cfg.run_dir
    # Where to start (run folder, checkpoints and settings checked before any compute).
    start = preflight.start_checkpoint(cfg, resume, log=launch.log, main=launch.accelerator.is_main_process)
    state = _build(launch, start)
    dataset, data_iter = _data(launch, state.step)
    if launch.accelerator.is_main_process:  # only now: a start that fails leaves no run folder behind
        preflight.write_run_config(cfg)
    if launch.trackers:
        launch.accelerator.init_trackers(cfg.log.project, config=_flat_hparams(cfg))
    bar = tqdm(total=tc.max_steps, initial=state.step, disable=not launch.accelerator.is_main_process,
               desc="train", dynamic_ncols=True)
    meter = _Throughput()
    if cfg.log.sample_every and cfg.log.sample_at_start and state.step == 0:
        _sample_grid(launch, state)
    state.net.train()
    try:
        while state.step < tc.max_steps:
            result = _train_step(launch, state, data_iter)
            _guard(launch, state, result)
            bar.update(1)
            meter.add(tc.global_batch_size)
            _periodic(launch, state, result, bar, meter)
    finally:  # also on an error: its message then starts a line of its own, after the bar
        bar.close()
    preflight.report_skipped(dataset, log=launch.log)
    launch.accelerator.end_training()
    return run_dir


def _launch(cfg: ExperimentConfig, log_fn) -> Launch:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    tc, run_dir = cfg.train, cfg.run_dir
    trackers = [] if cfg.log.tracker == "none" else [cfg.log.tracker]
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),  # without it, CPU processes of a multi-process launch don't join
        mixed_precision=tc.mixed_precision,
        gradient_accumulation_steps=tc.grad_accum,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
    )
    log = log_fn or (lambda msg: accelerator.print(msg))
    world, rank = accelerator.num_processes, accelerator.process_index
    try:
        strategy = make_strategy(cfg, accelerator, log)
    except StrategyError as e:
        raise TrainingError(str(e)) from None
    if tc.global_batch_size % (world * tc.grad_accum):
        raise TrainingError(
            f"train.global_batch_size={tc.global_batch_size} is not divisible by processes ({world}) x "
            f"train.grad_accum ({tc.grad_accum}); choose a multiple of {world * tc.grad_accum}")
    micro = tc.global_batch_size // (world * tc.grad_accum)
    log(f"{_describe_processes(accelerator)}, per-process batch {micro} x "
        f"{tc.grad_accum} accumulation = global batch {tc.global_batch_size}")
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = tc.tf32
        torch.backends.cudnn.allow_tf32 = tc.tf32
    return Launch(cfg, accelerator, strategy, world, rank, micro, log, log_fn, trackers)


def _build(launch: Launch, start: Path | None) -> State:
    """Model, EMA, REPA, optimizer and objective, laid out by the strategy, resumed from ``start``."""
    cfg, tc = launch.cfg, launch.cfg.train
    torch.manual_seed(tc.seed)
    mcfg = cfg.model_config()
    model = create_model(mcfg)
    if tc.init_from is not None and start is None:  # a resumed run reads its own checkpoint
        _init_from(launch, model, mcfg)
    ema = EMA(model, tc.ema_decay, warmup=tc.ema_warmup)
    vae = _load_vae(launch)
    projector, alignment = _repa(launch, mcfg, vae)
    trainee = Trainee(model, projector, cfg.repa.depth if projector is not None else None)
    if tc.grad_checkpointing:
        model.set_grad_checkpointing(True)

    def make_optimizer(params):
        return torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=(tc.beta1, tc.beta2))

    net, optimizer = launch.strategy.prepare(trainee, ema, make_optimizer)
    if tc.compile:
        model.compile()  # in place: parameter names (and so checkpoints) unchanged
    transport = Transport(cfg.transport)
    if tc.objective == "meanflow":
        objective = MeanFlowObjective(transport, mcfg.null_label, mcfg.class_dropout_prob, cfg.meanflow, alignment,
                                      cfg.repa.weight, teacher=_teacher(launch, mcfg))
    else:
        objective = Objective(transport, mcfg.null_label, mcfg.class_dropout_prob, alignment, cfg.repa.weight)
    state = State(net, optimizer, ema, objective, transport, vae)
    if start is not None:
        _resume(launch, state, start)
    return state


def _init_from(launch: Launch, model, mcfg) -> None:
    """``train.init_from``: the flow model's weights into ``model``, the objective's new inputs neutral."""
    from vit5_sit.train.init_from import InitFromError, convert, flow_state

    try:
        state, what = flow_state(launch.cfg.train.init_from, mcfg)
        new = convert(model, state)
    except InitFromError as e:
        raise TrainingError(str(e)) from None
    added = sorted({k.split(".")[0] for k in new})
    launch.log(f"init_from: {what}" + (f"; new or learned again, starting at zero: {', '.join(added)}"
                                       if added else ""))


def _teacher(launch: Launch, mcfg):
    """``meanflow.teacher``: the frozen flow model whose guided velocity the one-step model distils (read at every
    start, resumes too: it is not in the checkpoints), in eval mode on the run's device; None without one."""
    from vit5_sit.train.init_from import InitFromError, load_teacher

    spec = launch.cfg.meanflow.teacher
    if spec is None:
        return None
    try:
        teacher, what = load_teacher(spec, mcfg)
    except InitFromError as e:
        raise TrainingError(str(e)) from None
    launch.log(f"meanflow.teacher: {what}, frozen")
    return teacher.to(launch.accelerator.device)


def _load_vae(launch: Launch):
    """Latent runs: the VAE, loaded once (REPA's encoder sees decoded images; the grids decode samples)."""
    cfg = launch.cfg
    if cfg.data.kind != "latents":
        return None
    if not (cfg.repa.enabled or (cfg.log.sample_every and launch.accelerator.is_main_process)):
        return None
    from vit5_sit.data.vae import VAELoadError, load_vae

    try:
        return load_vae(cfg.data.vae, device=launch.accelerator.device)
    except VAELoadError as e:
        need = "REPA's encoder sees decoded images" if cfg.repa.enabled else (
            "it decodes the training grids; log.sample_every=0 trains without it")
        raise TrainingError(f"data.vae={cfg.data.vae!r}: {e} ({need})") from None


def _repa(launch: Launch, mcfg, vae):
    """(projector, alignment term), or (None, None) without REPA."""
    rc = launch.cfg.repa
    if not rc.enabled:
        return None, None
    from vit5_sit.data.vae import decode
    from vit5_sit.repa import Alignment, EncoderError, build_projector, load_encoder

    try:
        encoder = load_encoder(rc.encoder, rc.encoder_weights, rc.encoder_resolution, launch.accelerator.device)
    except EncoderError as e:
        raise TrainingError(str(e)) from None
    projector = build_projector(mcfg.hidden_size, encoder.z_dim, rc.projector_dim)
    to_images = (lambda x1: decode(vae, x1)) if vae is not None else None
    launch.log(f"REPA: block {rc.depth} aligned to {rc.encoder} ({encoder.z_dim} features), weight {rc.weight:g}")
    return projector, Alignment(encoder, mcfg.grid_size, to_images)


def _resume(launch: Launch, state: State, start: Path) -> None:
    model_sd, ema_sd, saved = load_checkpoint(start)
    projector_sd = load_extra(start, PROJECTOR_FILE)
    repa = launch.cfg.repa.enabled
    if repa != (projector_sd is not None):
        raise TrainingError(
            f"{start} was trained {'with' if projector_sd is not None else 'without'} REPA but this run has "
            f"repa.weight={launch.cfg.repa.weight:g}: resume with the repa.* settings of its config.yaml, or "
            "start a new run (name=...)")
    full = FullState(model_sd, projector_sd, ema_sd, saved["optimizer"])
    launch.strategy.load(state.net, state.optimizer, state.ema, full)
    state.step, state.nonfinite_total = int(saved["step"]), int(saved.get("nonfinite_total", 0))
    state.ema.num_updates = int(saved.get("ema_updates", state.step))
    launch.log(f"resumed from {start} at step {state.step}")


def _data(launch: Launch, step: int) -> tuple[Dataset, Iterator]:
    """The dataset and an endless iterator over this process's micro-batches from ``step`` on.

    Our own sampler shards the stream, so the loader is not passed through accelerate.
    """
    cfg, tc = launch.cfg, launch.cfg.train
    mcfg = cfg.model_config()
    dataset = build_training_dataset(cfg)
    data_shape = tuple(getattr(dataset, "sample_shape", ()) or ())
    model_shape = (mcfg.in_channels, mcfg.input_size, mcfg.input_size)
    if data_shape and data_shape != model_shape:
        raise TrainingError(
            f"the data gives samples of shape {data_shape} but the model expects {model_shape}; set "
            f"model.in_channels={data_shape[0]} model.input_size={data_shape[1]} (or fix data.resolution / "
            f"data.channels)")
    preflight.check_dataset(cfg, dataset, mcfg)
    sampler = StepSampler(len(dataset), tc.seed, launch.micro, launch.world, launch.rank, tc.grad_accum,
                          start_step=step)
    loader = DataLoader(EpochIndexed(dataset), batch_size=launch.micro, sampler=sampler,
                        num_workers=cfg.data.num_workers, pin_memory=torch.cuda.is_available(), drop_last=True,
                        persistent_workers=cfg.data.num_workers > 0)
    return dataset, iter(loader)


def _lr(tc, step: int) -> float:
    """Linear warm-up over ``train.warmup_steps``, then constant."""
    return tc.lr * min(1.0, (step + 1) / tc.warmup_steps) if tc.warmup_steps else tc.lr


def _describe_processes(accelerator) -> str:
    """'1 process (CPU, 2 threads)', '8 processes (MULTI_GPU, cuda)': accelerate's label 'NO' means no distribution.

    On CPU the thread count is named because it is part of what makes a run reproducible: the same seed gives the
    same weights bit for bit at the same thread count, and differs in the last float bit at another (the order of
    the reductions changes), a difference that training then grows (docs/training.md, "Reproducible from the seed").
    """
    n = accelerator.num_processes
    kind = accelerator.distributed_type.value
    on_cpu = accelerator.device.type == "cpu"
    device = "CPU" if on_cpu else accelerator.device.type
    where = device if kind == "NO" else f"{kind}, {device}"
    if on_cpu:
        threads = torch.get_num_threads()
        where += f", {threads} thread{'s' if threads > 1 else ''}{' each' if n > 1 else ''}"
    return f"{n} process{'es' if n > 1 else ''} ({where})"


def _train_step(launch: Launch, state: State, data_iter: Iterator) -> StepResult:
    """One optimizer step over ``train.grad_accum`` micro-batches; skipped if the loss or gradients are not finite."""
    tc, acc, strategy = launch.cfg.train, launch.accelerator, launch.strategy
    torch.manual_seed(derive_seed(tc.seed, "step", state.step, launch.rank))  # any other randomness: per step too
    lr = _lr(tc, state.step)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    sums: dict[str, torch.Tensor] = {}
    for a in range(tc.grad_accum):
        x1, y = next(data_iter)  # x1: the data (images or latents); noise x0 and x_t are the objective's
        batch = Batch(x1.to(acc.device, non_blocking=True), y.to(acc.device, non_blocking=True))
        rng = StepRng.for_micro_batch(tc.seed, state.step, tc.global_batch_size, a, launch.micro, launch.rank,
                                      launch.world)
        strategy.before_micro_step(state.net, last=a == tc.grad_accum - 1)
        with acc.accumulate(state.net):
            with strategy.autocast():
                terms = state.objective(state.net, batch, rng)
            acc.backward(terms["loss"])
            for k, v in terms.items():
                sums[k] = sums.get(k, 0) + v.detach().float() / tc.grad_accum
            if acc.sync_gradients:
                grad_norm = strategy.clip(state.net, tc.grad_clip)
                reduced = acc.reduce(torch.stack(list(sums.values())), "mean")
                # fp16: overflowing gradients are the loss scaler's business (it skips and rescales).
                grads_ok = math.isfinite(grad_norm) or tc.mixed_precision == "fp16"
                finite = bool(torch.isfinite(reduced).all()) and grads_ok
                if finite:
                    state.optimizer.step()
                state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return StepResult(dict(zip(sums, reduced.tolist())), grad_norm, lr, finite)


def _guard(launch: Launch, state: State, result: StepResult) -> None:
    """EMA after a good step; count a skipped one, and stop the run after ``train.max_nonfinite`` in a row."""
    tc = launch.cfg.train
    if result.finite:
        state.nonfinite_run = 0
        state.ema.update(launch.strategy.unwrap(state.net).model)
        return
    state.nonfinite_run += 1
    state.nonfinite_total += 1
    bad = [k for k, v in result.terms.items() if not math.isfinite(v)]  # the objective's terms (MeanFlow: target)
    what = ", ".join(f"{k} {result.terms[k]:.4g}" for k in bad) if bad else f"gradient norm {result.grad_norm:.4g}"
    launch.log(f"step {state.step}: non-finite {what}; step skipped ({state.nonfinite_run} in a row)")
    if state.nonfinite_run >= tc.max_nonfinite:
        raise TrainingError(
            f"{state.nonfinite_run} non-finite steps in a row at step {state.step}: the run diverged. Try a "
            f"lower train.lr (now {tc.lr:g}), train.mixed_precision=bf16 instead of fp16, model.qk_norm=true, "
            f"or train.grad_clip=1.0; resume from the last checkpoint with --resume auto")


class _Throughput:
    """Images per second since the last log line."""

    def __init__(self) -> None:
        self.t_last, self.images = time.perf_counter(), 0

    def add(self, n: int) -> None:
        self.images += n

    def rate(self) -> float:
        now = time.perf_counter()
        ips = self.images / max(now - self.t_last, 1e-9)
        self.t_last, self.images = now, 0
        return ips


def _periodic(launch: Launch, state: State, result: StepResult, bar, meter: _Throughput) -> None:
    """Log every ``log.every`` steps, checkpoint every ``train.ckpt_every``, grid every ``log.sample_every``."""
    cfg, step = launch.cfg, state.step
    last = step == cfg.train.max_steps
    if step % cfg.log.every == 0 or last:
        _log_step(launch, state, result, bar, meter.rate())
    # Ctrl-C under vit5_sit.common.interrupt.deferred_sigint: save a checkpoint, then stop.
    interrupted = stop_requested() and not last
    if step % cfg.train.ckpt_every == 0 or last or interrupted:
        _checkpoint(launch, state)
    if interrupted:
        bar.close()
        raise Interrupted(f"interrupted at step {step} of {cfg.train.max_steps}; checkpoint saved in "
                          f"{cfg.run_dir / 'checkpoints'}; run the same command with --resume auto to continue")
    if cfg.log.sample_every and step % cfg.log.sample_every == 0:
        _sample_grid(launch, state)


def _log_step(launch: Launch, state: State, result: StepResult, bar, ips: float) -> None:
    stats = {**result.terms, "grad_norm": result.grad_norm, "lr": result.lr, "images_per_s": ips,
             "nonfinite_total": state.nonfinite_total}
    bar.set_postfix(loss=f"{stats['loss']:.4f}", gnorm=f"{result.grad_norm:.3g}", lr=f"{result.lr:.2g}",
                    ips=f"{ips:.1f}")
    if launch.trackers:
        launch.accelerator.log(stats, step=state.step)
    if launch.log_fn is not None:
        launch.log_fn(f"step {state.step} " + " ".join(f"{k}={v:.5g}" for k, v in stats.items()))


def _checkpoint(launch: Launch, state: State) -> None:
    """Full tensors gathered by the strategy (a collective), written by the main process."""
    acc, tc = launch.accelerator, launch.cfg.train
    acc.wait_for_everyone()
    full = launch.strategy.gather(state.net, state.optimizer, state.ema)
    if full is not None:
        saved = {"optimizer": full.optimizer, "nonfinite_total": state.nonfinite_total,
                 "ema_updates": state.ema.num_updates, "samples_seen": state.step * tc.global_batch_size}
        extra = {PROJECTOR_FILE: full.projector} if full.projector is not None else None
        guide = tc.guide_step()
        save_checkpoint(launch.cfg.run_dir, state.step, full.model, full.ema, saved, keep_last=tc.keep_last,
                        extra=extra, keep=() if guide is None else (guide,))
    acc.wait_for_everyone()


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


def _sample_grid(launch: Launch, state: State) -> None:
    """The run's fixed-seed grid from the EMA weights, on the main process (gathered first when sharded)."""
    from vit5_sit.sampling.generate import sample_images, save_labelled_grid

    cfg = launch.cfg
    model = launch.strategy.sampling_model(state.ema, lambda: create_model(cfg.model_config()))
    if model is None:
        return
    lc = cfg.log
    classes = [c for c in lc.sample_classes for _ in range(lc.sample_per_class)]
    seeds = list(range(lc.sample_seed, lc.sample_seed + len(classes)))
    images = sample_images(model, state.transport, cfg.sampler, classes, seeds, cfg_scale=lc.sample_cfg_scale,
                           guidance_interval=tuple(lc.sample_guidance_interval), vae=state.vae,
                           device=launch.accelerator.device)
    save_labelled_grid(images, cfg.run_dir / "samples" / f"step_{state.step:07d}.png", ncol=lc.sample_per_class,
                       row_labels=[f"class {c}" for c in lc.sample_classes])
