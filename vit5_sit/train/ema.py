"""Exponential moving average of the weights (SiT/DiT: decay 0.9999, updated after every step)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def local(t: torch.Tensor) -> torch.Tensor:
    """The process's own part of ``t``: its shard for an FSDP2 DTensor (same storage), ``t`` otherwise."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class EMA:
    """A frozen fp32 copy of a model whose parameters track ``decay * ema + (1 - decay) * live``.

    ``warmup``: use ``min(decay, (1 + n) / (10 + n))`` at the n-th update, so that a short run's average is
    not dominated by the (zero-output, adaLN-Zero) initial weights: with decay 0.999 and no warm-up, 30% of
    the average after 1,200 steps is still the initialisation. SiT has no warm-up (decay 0.9999 over
    hundreds of thousands of steps), so the ImageNet configs keep it off.

    Under FSDP the copy is sharded like the model (vit5_sit.train.strategy.Sharded): each process averages
    its own shards; the strategy gathers the full tensors for a checkpoint.
    """

    def __init__(self, model: nn.Module, decay: float, warmup: bool = False) -> None:
        self.decay, self.warmup, self.num_updates = decay, warmup, 0
        self.model = copy.deepcopy(model).float().eval().requires_grad_(False)

    def current_decay(self) -> float:
        n = self.num_updates
        return min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_params = [local(p) for p in self.model.parameters()]
        live = [local(p.detach()).float() for p in model.parameters()]
        torch._foreach_lerp_(ema_params, live, 1.0 - self.current_decay())
        self.num_updates += 1
        for b_ema, b in zip(self.model.buffers(), model.buffers()):
            b_ema.copy_(b)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The copy's state (unsharded models; a sharded one is gathered by the strategy)."""
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state, strict=True)
