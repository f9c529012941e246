"""benchmarks/class_signal.py: the class share of a model's velocity and the move of its guidance input (#51 (a))."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit5_sit.models import create_model

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("class_signal", ROOT / "benchmarks" / "class_signal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(imf: bool, guidance_off: bool = False):
    torch.manual_seed(0)
    m = create_model("ViT5G-T/4", input_size=8, in_channels=1, num_classes=3, depth=2, hidden_size=48, num_heads=2,
                     mean_flow=imf, guidance_input=imf)
    with torch.no_grad():  # the zero-initialised layers too: every input carries signal
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if guidance_off:
            for p in m.guidance_embedder.parameters():
                p.zero_()
    return m.eval()


def test_the_shares_are_the_formula(tool):
    x1, y = torch.rand(6, 1, 8, 8) * 2 - 1, torch.tensor([0, 1, 2, 0, 1, 2])
    model = _model(imf=True)
    share, move = tool.signal(model, x1, y, 0.5, 3.0, seed=1)
    x0 = torch.randn(x1.shape, generator=torch.Generator().manual_seed(1))
    xt, t, d = 0.5 * x0 + 0.5 * x1, torch.full((6,), 0.5), torch.zeros(6)
    with torch.no_grad():
        g1 = torch.tensor([[1.0, 0.0, 1.0]]).expand(6, 3)
        v_c = model(xt, t, y, interval=d, guidance=g1)
        v_u = model(xt, t, torch.full_like(y, 3), interval=d, guidance=g1)
        v_w = model(xt, t, y, interval=d, guidance=torch.tensor([[3.0, 0.0, 1.0]]).expand(6, 3))
    norm = v_c.flatten(1).norm(dim=1)
    assert share == pytest.approx(((v_c - v_u).flatten(1).norm(dim=1) / norm).mean().item(), rel=1e-6)
    assert move == pytest.approx(((v_w - v_c).flatten(1).norm(dim=1) / norm).mean().item(), rel=1e-6)
    assert share > 0 and move > 0


def test_an_unused_guidance_input_moves_nothing_and_a_flow_model_has_none(tool):
    x1, y = torch.rand(4, 1, 8, 8) * 2 - 1, torch.tensor([0, 1, 2, 0])
    assert tool.signal(_model(imf=True, guidance_off=True), x1, y, 0.25, 3.0, seed=0)[1] == 0.0
    share, move = tool.signal(_model(imf=False), x1, y, 0.25, 3.0, seed=0)
    assert share > 0 and math.isnan(move)


def test_real_digits_reads_class_folders(tool, tmp_path):
    for label in (0, 1):  # the class folders of an export: labels by sorted folder name
        (tmp_path / str(label)).mkdir()
        Image.fromarray(np.full((32, 32), 255 * label, np.uint8)).save(tmp_path / str(label) / "00000.png")
    images, labels = tool.real_digits(tmp_path, 2, seed=0)
    assert images.shape == (2, 1, 32, 32)
    for image, label in zip(images, labels.tolist()):
        assert image.min() == image.max() == (1.0 if label == 1 else -1.0)
