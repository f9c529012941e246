"""model.gate_init: the adaLN gates start at the given value (0 = adaLN-Zero, the default, unchanged)."""

import pytest
import torch

from vit5_sit.models import create_model, model_config


def _tiny(**kw):
    return create_model(model_config("ViT5-T/4", depth=2, hidden_size=32, num_heads=2, input_size=8,
                                     in_channels=1, num_classes=3, **kw))


def test_gate_init_sets_only_the_gate_biases():
    model = _tiny(gate_init=1.0)
    D = 32
    for block in model.blocks:
        bias = block.adaLN_modulation[-1].bias.detach()
        assert torch.all(bias[2 * D:3 * D] == 1) and torch.all(bias[5 * D:6 * D] == 1)
        rest = torch.cat([bias[:2 * D], bias[3 * D:5 * D]])
        assert torch.all(rest == 0)
        assert torch.all(block.adaLN_modulation[-1].weight == 0)


def _first_block_io(model):
    seen = {}
    handle = model.blocks[0].register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    with torch.no_grad():
        model.eval()(torch.randn(2, 1, 8, 8), torch.rand(2), torch.tensor([0, 1]))
    handle.remove()
    return seen["x"], seen["out"]


def test_default_is_adaln_zero_and_the_blocks_start_as_identity():
    model = _tiny()
    assert all(torch.all(b.adaLN_modulation[-1].bias == 0) for b in model.blocks)
    x, out = _first_block_io(model)
    assert torch.equal(out, x)  # adaLN-Zero: the block starts as the identity
    x, out = _first_block_io(_tiny(gate_init=0.5))
    assert not torch.equal(out, x)  # open gates: the branches contribute from the start


def test_gate_init_must_be_a_number():
    with pytest.raises(ValueError, match="gate_init"):
        model_config("ViT5-T/4", gate_init="big")
