"""The training objective: one object owns a step's draws (t, noise, label dropout), calls the network and
returns the loss with each of its terms.

``objective(net, batch, rng) -> {"loss": total, "flow": ..., ["repa": ...]}``. Every draw is a pure function
of ``(train.seed, step)``: it is made for the whole global batch and each micro-batch of each process takes
its rows (:class:`StepRng`), so a resumed run continues exactly and N processes see what one process sees.
Label dropout happens here and nowhere else: the model's forward never drops labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vit5_sit.models import Denoiser
from vit5_sit.train.seeding import derive_seed
from vit5_sit.transport import Transport
from vit5_sit.transport.meanflow import (
    UNGUIDED,
    MeanFlowConfig,
    draw_guidance,
    draw_times,
    imf_target,
    meanflow_loss,
    meanflow_target,
    shortcut_target,
)


@dataclass
class Batch:
    x1: torch.Tensor  # (b, C, H, W) the data (t = 1): images in [-1, 1] or latents
    y: torch.Tensor  # (b,) class ids


@dataclass
class StepRng:
    """The randomness of one micro-batch: the stream of ``(seed, step)``, drawn for the global batch, and the
    rows of it that this micro-batch of this process takes."""

    seed: int
    step: int
    global_batch: int
    rows: slice

    @classmethod
    def for_micro_batch(cls, seed: int, step: int, global_batch: int, micro_index: int, micro: int, rank: int,
                        world: int) -> StepRng:
        lo = micro_index * world * micro + rank * micro  # the data order's layout (StepSampler)
        return cls(seed, step, global_batch, slice(lo, lo + micro))

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(self.seed, "noise", self.step))


class Trainee(nn.Module):
    """What the optimizer trains: the denoiser and, with REPA, the projector of block ``depth``'s tokens.

    ``forward(x_t, t, y) -> (prediction, projected tokens or None)``. One module, so that DDP and FSDP wrap
    and synchronise both, and the optimizer's parameter order is the model's, then the projector's.
    """

    def __init__(self, model: Denoiser, projector: nn.Module | None = None, depth: int | None = None) -> None:
        super().__init__()
        self.model, self.projector, self.depth = model, projector, depth

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, interval: torch.Tensor | None = None,
                guidance: torch.Tensor | None = None):
        kw = {} if interval is None else {"interval": interval}  # MeanFlow's second time
        if guidance is not None:
            kw["guidance"] = guidance  # iMF's guidance inputs
        if self.projector is None:
            return self.model(x_t, t, y, **kw), None
        out, hidden = self.model(x_t, t, y, return_hidden=(self.depth,), **kw)
        return out, self.projector(hidden[self.depth])  # (B, C, H, W), (B, T, z_dim)


class Objective:
    """Flow matching (``Transport``'s loss) plus, optionally, REPA's alignment term times its weight."""

    def __init__(self, transport: Transport, null_label: int, label_dropout: float,
                 alignment=None,         # vit5_sit.repa.Alignment: (projected tokens, x1) -> scalar; None = off
                 alignment_weight: float = 0.0) -> None:
        self.transport, self.null_label, self.label_dropout = transport, null_label, label_dropout
        self.alignment, self.alignment_weight = alignment, alignment_weight

    def draw(self, rng: StepRng, sample_shape: tuple[int, ...]):
        """(t, noise, drop) of the micro-batch: times (b,), noise (b, *sample_shape), drop (b,) bool."""
        g = rng.generator()
        t = self.transport.sample_t(rng.global_batch, generator=g)
        noise = torch.randn((rng.global_batch, *sample_shape), generator=g)
        drop = torch.rand(rng.global_batch, generator=g) < self.label_dropout
        return t[rng.rows], noise[rng.rows], drop[rng.rows]

    def drop_labels(self, y: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
        """Classifier-free guidance training: dropped labels become the null label."""
        return torch.where(drop.to(y.device), torch.full_like(y, self.null_label), y)

    def __call__(self, net: nn.Module, batch: Batch, rng: StepRng) -> dict[str, torch.Tensor]:
        x1 = batch.x1
        t, noise, drop = self.draw(rng, tuple(x1.shape[1:]))
        if t.shape[0] != x1.shape[0]:
            raise ValueError(f"the batch has {x1.shape[0]} samples but the step's draw gives {t.shape[0]}")
        y = self.drop_labels(batch.y, drop)
        x0, t = noise.to(x1), t.to(x1)
        x_t, ut = self.transport.interpolate(x0, x1, t)
        out, projected = net(x_t, t, y)
        flow = self.transport.prediction_loss(out, x0, ut, t).mean()
        if self.alignment is None:
            return {"loss": flow, "flow": flow}
        align = self.alignment(projected, x1)
        return {"loss": flow + self.alignment_weight * align, "flow": flow, "repa": align}


def _bare_model(net: nn.Module) -> Denoiser:
    """The `Denoiser` inside a (DDP-wrapped) `Trainee`: the JVP and the guidance passes need no gradient sync."""
    while hasattr(net, "module"):
        net = net.module
    return net.model


class MeanFlowObjective(Objective):
    """MeanFlow (`vit5_sit.transport.meanflow`): the network's average velocity U(x_t, t, d) regressed on the
    stop-gradient target v~ + d dU/dt, with the adaptive weight; guidance trained in when the config says so.
    ``meanflow.variant=imf``: improved MeanFlow, the target v_g + d dU/dt of `imf_target` (the JVP along the
    network's own velocity) and the guidance inputs drawn per sample and fed to the network; with a ``teacher``
    (``meanflow.teacher``), the frozen flow model's guided velocity is the target's velocity and tangent.

    Draws, per step and for the whole global batch (like `Objective`): (t, d) (`draw_times`), noise, label
    dropout. The target's JVP and guidance passes run on the bare model without gradient; the prediction with
    gradient goes through ``net`` (so DDP synchronises it) with the fast kernels: never take the prediction from
    the JVP's primal output, whose gradient would bypass DDP's all-reduce (tests/test_meanflow_traps.py). Returns
    {"loss", "mse", "target"}: mse is the unweighted squared error per element, the number to watch (the weighted
    loss is ~1 by design); target is the RMS of the target, non-finite whenever an element of it is (a NaN in the
    JVP's dU/dt or in the guidance pass), so the loop's non-finite guard skips that step whatever the loss makes
    of it."""

    def __init__(self, transport: Transport, null_label: int, label_dropout: float, cfg: MeanFlowConfig,
                 alignment=None, alignment_weight: float = 0.0, teacher: nn.Module | None = None) -> None:
        super().__init__(transport, null_label, label_dropout, alignment, alignment_weight)
        self.cfg, self.teacher = cfg, teacher  # teacher: the frozen flow model of meanflow.teacher, or None

    def draw(self, rng: StepRng, sample_shape: tuple[int, ...]):
        """(t, d, noise, drop, guidance) of the micro-batch; guidance (b, 3) for iMF (`draw_guidance`, no guidance
        where the label is dropped; drawn after the others, so MeanFlow's draws are unchanged), else None."""
        g = rng.generator()
        t, d = draw_times(rng.global_batch, self.cfg, generator=g)
        noise = torch.randn((rng.global_batch, *sample_shape), generator=g)
        drop = torch.rand(rng.global_batch, generator=g) < self.label_dropout
        guidance = None
        if self.cfg.imf:
            guidance = torch.where(drop[:, None], torch.tensor(UNGUIDED), draw_guidance(d, self.cfg, generator=g))
            guidance = guidance[rng.rows]
        if self.cfg.shortcut and rng.step >= self.cfg.shortcut_from:  # drawn last: the draws above are unchanged
            whole = torch.rand(rng.global_batch, generator=g) < self.cfg.shortcut
            t, d = torch.where(whole, 0.0, t), torch.where(whole, 1.0, d)
        return t[rng.rows], d[rng.rows], noise[rng.rows], drop[rng.rows], guidance

    def _target(self, model: Denoiser, x_t, t, d, y, v, drop, guidance) -> torch.Tensor:
        if guidance is None:
            return meanflow_target(model, x_t, t, d, y, v, drop, self.null_label, self.cfg)
        # iMF: ||U - sg(v_g + d dU/dt)||^2 = ||V - v_g||^2, V = U - d sg(dU/dt)
        return imf_target(model, x_t, t, d, y, v, guidance, self.null_label, self.teacher)

    def __call__(self, net: nn.Module, batch: Batch, rng: StepRng) -> dict[str, torch.Tensor]:
        x1 = batch.x1
        t, d, noise, drop, guidance = self.draw(rng, tuple(x1.shape[1:]))
        if t.shape[0] != x1.shape[0]:
            raise ValueError(f"the batch has {x1.shape[0]} samples but the step's draw gives {t.shape[0]}")
        y = self.drop_labels(batch.y, drop)
        x0, t, d = noise.to(x1), t.to(x1), d.to(x1)
        x_t, v = self.transport.interpolate(x0, x1, t)  # linear path: x_t = t x1 + (1 - t) x0, v = x1 - x0
        model = _bare_model(net)
        guidance = None if guidance is None else guidance.to(x1)
        drop = drop.to(y.device)
        whole = (t == 0) & (d == 1) if self.cfg.shortcut else None
        if whole is None or not bool(whole.any()):
            target = self._target(model, x_t, t, d, y, v, drop, guidance)
        else:  # meanflow.shortcut: the whole interval regressed on the network's own two-step sample
            rest, idx = (~whole).nonzero(as_tuple=True)[0], whole.nonzero(as_tuple=True)[0]
            target = torch.empty_like(x1)
            target[rest] = self._target(model, x_t[rest], t[rest], d[rest], y[rest], v[rest], drop[rest],
                                        None if guidance is None else guidance[rest])
            target[idx] = shortcut_target(model, x_t[idx], y[idx], None if guidance is None else guidance[idx]
                                          ).to(target.dtype)
        kw = {} if guidance is None else {"guidance": guidance}
        pred, projected = net(x_t, t, y, interval=d, **kw)
        if whole is None:
            weighted, mse = meanflow_loss(pred, target, self.cfg)
        else:  # the shortcut rows at the batch's mean adaptive weight
            weighted, mse = meanflow_loss(pred, target, self.cfg, flat=whole)
        loss = weighted.mean()
        terms = {"loss": loss, "mse": mse.mean(), "target": target.float().square().mean().sqrt()}
        if self.alignment is not None:
            align = self.alignment(projected, x1)
            terms.update(loss=loss + self.alignment_weight * align, repa=align)
        return terms
