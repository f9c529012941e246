"""The training objective: the old loss bit for bit, label dropout once at its rate, seeded draws sliced
by process and micro-batch, one seed rule."""

from __future__ import annotations

import pytest
import torch

from vit5_sit.models import create_model
from vit5_sit.train.objective import Batch, Objective, StepRng, Trainee
from vit5_sit.train.seeding import derive_seed
from vit5_sit.transport import Transport, TransportConfig
from vit5_sit.transport.transport import LOSS_WEIGHTS, PATHS, PREDICTIONS

COMBOS = [(p, pr, w) for p in PATHS for pr in PREDICTIONS for w in LOSS_WEIGHTS if pr != "velocity" or w == "none"]


def tiny_model(**overrides):
    torch.manual_seed(0)
    model = create_model("ViT5-T/2", input_size=8, in_channels=2, depth=2, hidden_size=32, num_heads=2,
                         num_classes=3, **overrides)
    with torch.no_grad():  # non-zero outputs: perturb the zero-initialised gates and output layer
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return model


def old_step_noise(seed, step, micro_index, global_batch, shape, rank, world, micro, transport, drop_prob):
    """The loop's draw before the objective existed (vit5_sit/train/loop.py: step_noise), on the new seed."""
    g = torch.Generator().manual_seed(derive_seed(seed, "noise", step))
    t = transport.sample_t(global_batch, generator=g)
    noise = torch.randn((global_batch, *shape), generator=g)
    drop = torch.rand(global_batch, generator=g) < drop_prob
    lo = micro_index * world * micro + rank * micro
    return t[lo:lo + micro], noise[lo:lo + micro], drop[lo:lo + micro]


@pytest.mark.parametrize("path, prediction, weight", COMBOS)
def test_loss_equals_the_old_transport_loss_bit_for_bit(path, prediction, weight):
    model = tiny_model()
    transport = Transport(TransportConfig(path=path, prediction=prediction, loss_weight=weight))
    objective = Objective(transport, null_label=model.null_label, label_dropout=0.3)
    x1 = torch.randn(4, 2, 8, 8, generator=torch.Generator().manual_seed(5))
    y = torch.tensor([0, 1, 2, 1])
    for step, micro_index, rank in [(0, 0, 0), (7, 1, 1)]:
        rng = StepRng.for_micro_batch(3, step, 16, micro_index, micro=4, rank=rank, world=2)
        new = objective(Trainee(model), Batch(x1, y), rng)
        t, noise, drop = old_step_noise(3, step, micro_index, 16, (2, 8, 8), rank, 2, 4, transport, 0.3)
        y_old = torch.where(drop, torch.full_like(y, model.cfg.num_classes), y)
        old = transport.loss(model, x1, y_old, t=t, noise=noise).mean()
        assert torch.equal(new["loss"], old) and torch.equal(new["flow"], old)
        assert set(new) == {"loss", "flow"}


class Recorder(torch.nn.Module):
    """A network that records the labels it is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, x, t, y):
        self.seen.append(y.clone())
        return torch.zeros_like(x), None


def test_label_dropout_happens_once_at_the_configured_rate():
    objective = Objective(Transport(), null_label=10, label_dropout=0.25)
    net = Recorder()
    y = torch.arange(10).repeat(100)  # 1,000 labels, none of them null
    x = torch.zeros(len(y), 1, 2, 2)
    dropped = []
    for step in range(8):
        rng = StepRng(0, step, len(y), slice(0, len(y)))
        objective(net, Batch(x, y), rng)
        _, _, drop = objective.draw(rng, (1, 2, 2))
        seen = net.seen[-1]
        assert torch.equal(seen == 10, drop)          # the draw decides, nothing else drops
        assert torch.equal(seen[~drop], y[~drop])
        dropped.append(drop.float().mean())
    rate = float(torch.stack(dropped).mean())
    assert abs(rate - 0.25) < 0.02, rate
    # ... and the model's forward drops nothing on top (train mode == eval mode).
    model = tiny_model(class_dropout_prob=0.5).train()
    xt, t, yy = torch.randn(6, 2, 8, 8), torch.rand(6), torch.tensor([0, 1, 2, 0, 1, 2])
    assert torch.equal(model(xt, t, yy), model.eval()(xt, t, yy))


def test_micro_batches_of_all_processes_tile_the_global_draw():
    objective = Objective(Transport(), null_label=3, label_dropout=0.5)
    whole = objective.draw(StepRng(1, 4, 12, slice(0, 12)), (2,))
    parts = {}
    for a in range(2):
        for rank in range(3):
            rng = StepRng.for_micro_batch(1, 4, 12, a, micro=2, rank=rank, world=3)
            parts[rng.rows.start] = objective.draw(rng, (2,))
    for i, field in enumerate(whole):
        assert torch.equal(torch.cat([parts[k][i] for k in sorted(parts)]), field)
    other_step = objective.draw(StepRng(1, 5, 12, slice(0, 12)), (2,))
    assert not torch.equal(other_step[0], whole[0])


def test_one_seed_rule():
    seeds = {derive_seed(0, s, i) for s in ("noise", "data-order") for i in range(50)}
    seeds |= {derive_seed(0, "step", i, r) for i in range(50) for r in range(2)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(1, "noise", 3) == derive_seed(1, "noise", 3) != derive_seed(2, "noise", 3)
    torch.Generator().manual_seed(max(seeds))  # accepted by torch


def test_mismatched_batch_and_draw_is_an_error():
    objective = Objective(Transport(), null_label=3, label_dropout=0.0)
    with pytest.raises(ValueError, match="the batch has 2 samples but the step's draw gives 4"):
        objective(Recorder(), Batch(torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.long)),
                  StepRng(0, 0, 4, slice(0, 4)))
