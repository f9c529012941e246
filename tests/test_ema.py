"""EMA of the weights: the decay, and the warm-up that keeps short runs from averaging in the initialisation."""

import torch
from torch import nn

from vit5_sit.train.ema import EMA


def _pair():
    model = nn.Linear(3, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


def test_update_is_the_exponential_average():
    model = _pair()
    ema = EMA(model, decay=0.9)
    with torch.no_grad():
        model.weight.fill_(1.0)
    for _ in range(3):
        ema.update(model)
    torch.testing.assert_close(ema.model.weight, torch.full((2, 3), 1 - 0.9**3))


def test_warmup_follows_the_live_weights_early():
    model = _pair()
    plain, warm = EMA(model, decay=0.999), EMA(model, decay=0.999, warmup=True)
    with torch.no_grad():
        model.weight.fill_(1.0)
    for _ in range(100):
        plain.update(model)
        warm.update(model)
    assert plain.model.weight.mean() < 0.1  # 1 - 0.999^100
    assert warm.model.weight.mean() > 0.99
    assert warm.current_decay() == (1 + 100) / (10 + 100)
    assert EMA(model, decay=0.999, warmup=True).current_decay() == 0.1
