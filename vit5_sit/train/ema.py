"""Exponential moving average of the weights (SiT/DiT: decay 0.9999, updated after every step)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    """A frozen fp32 copy of a model whose parameters track ``decay * ema + (1 - decay) * live``."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).float().eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_params = list(self.model.parameters())
        live = [p.detach().float() for p in model.parameters()]
        torch._foreach_lerp_(ema_params, live, 1.0 - self.decay)
        for b_ema, b in zip(self.model.buffers(), model.buffers()):
            b_ema.copy_(b)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state, strict=True)
