"""REPA: the alignment term on toy cases, where its gradients go, the encoders (own file, timm from a local
file, the offline error), the config checks, and a training run that saves the projector beside (not in)
the exported model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_train import _cli_overrides, _image_folder, _repa_overrides, _train

from vit5_sit.config import ConfigError, load_config
from vit5_sit.models import create_model
from vit5_sit.repa import Alignment, EncoderError, alignment_loss, build_projector, load_encoder
from vit5_sit.repa.classifier import Classifier, load_classifier, main, save_classifier
from vit5_sit.repa.encoders import features_on_grid
from vit5_sit.train.checkpoint import list_checkpoints
from vit5_sit.train.objective import Batch, Objective, StepRng, Trainee
from vit5_sit.transport import Transport

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # trainings run in this process


def test_identical_features_give_minus_one_and_the_term_is_scale_free():
    f = torch.randn(3, 16, 8)
    assert torch.allclose(alignment_loss(f, f), torch.tensor(-1.0))
    assert torch.allclose(alignment_loss(2.5 * f, f), torch.tensor(-1.0))
    assert torch.allclose(alignment_loss(-f, f), torch.tensor(1.0))
    assert -1.0 < float(alignment_loss(torch.randn(3, 16, 8), f)) < 1.0
    with pytest.raises(ValueError, match="differ in shape"):
        alignment_loss(f, f[:, :4])


def test_a_projector_reaches_the_optimum_of_a_reachable_target():
    torch.manual_seed(0)
    hidden = torch.randn(4, 16, 12)
    target = hidden @ torch.randn(12, 6)  # features a linear map of the tokens: alignment can be perfect
    proj = build_projector(12, 6, width=32)
    opt = torch.optim.Adam(proj.parameters(), lr=1e-2)
    for _ in range(300):
        loss = alignment_loss(proj(hidden), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < -0.98


class ConstantEncoder(torch.nn.Module):
    """Features = a fixed linear map of the image's patches (a stand-in for a frozen encoder)."""

    def __init__(self, z_dim: int = 6) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.w = torch.nn.Parameter(torch.randn(2 * 2 * 2, z_dim))

    def forward(self, images, grid):
        patches = torch.nn.functional.unfold(images, 2, stride=2).transpose(1, 2)  # (B, 16, 8)
        return patches @ self.w


def test_gradients_reach_the_projector_and_the_blocks_up_to_depth_only():
    torch.manual_seed(0)
    model = create_model("ViT5-T/2", input_size=8, in_channels=2, depth=3, hidden_size=32, num_heads=2,
                         num_classes=3, layer_scale_init=None)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    encoder = ConstantEncoder()
    trainee = Trainee(model, build_projector(32, 6, width=16), depth=2)
    objective = Objective(Transport(), model.null_label, 0.1, Alignment(encoder, grid=4), alignment_weight=0.5)
    batch = Batch(torch.randn(4, 2, 8, 8), torch.tensor([0, 1, 2, 0]))
    terms = objective(trainee, batch, StepRng(0, 0, 4, slice(0, 4)))
    assert set(terms) == {"loss", "flow", "repa"}
    assert torch.allclose(terms["loss"], terms["flow"] + 0.5 * terms["repa"])
    terms["repa"].backward()
    def touched(module):
        return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    assert touched(trainee.projector) and touched(model.blocks[0]) and touched(model.blocks[1])
    assert touched(model.x_embedder) and touched(model.t_embedder)
    assert not touched(model.blocks[2]) and not touched(model.final_layer)
    assert encoder.w.grad is None  # the encoder is frozen


def test_features_are_resized_to_the_token_grid():
    f = torch.randn(2, 64, 5)
    assert features_on_grid(f, 8) is f
    assert features_on_grid(f, 4).shape == (2, 16, 5)
    const = torch.ones(2, 16, 5)
    assert torch.allclose(features_on_grid(const, 8), torch.ones(2, 64, 5))
    with pytest.raises(EncoderError, match="not a square grid"):
        features_on_grid(torch.randn(2, 10, 5), 4)


def small_classifier(channels: int = 1, size: int = 8) -> Classifier:
    from test_train import _small_classifier

    return _small_classifier(channels, size)


def test_own_encoder_file_round_trip(tmp_path):
    model = small_classifier()
    path = save_classifier(model, tmp_path / "enc.safetensors", test_accuracy=0.5)
    back = load_classifier(path)
    x = torch.rand(3, 1, 8, 8) * 2 - 1
    assert torch.equal(back(x), model.eval()(x))
    enc = load_encoder(str(path))
    assert enc.z_dim == 16 and enc(x, 4).shape == (3, 16, 16) and enc(x, 2).shape == (3, 4, 16)
    assert not any(p.requires_grad for p in enc.parameters())
    (tmp_path / "other.safetensors").write_bytes(b"")
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(EncoderError, match="not an encoder file of this project"):
        load_encoder(str(tmp_path / "other.safetensors"))
    with pytest.raises(EncoderError, match="no such file"):
        load_encoder(str(tmp_path / "missing.safetensors"))


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "argument --steps: must be at least 1"),  # was: an untrained encoder, "wrote"
    (["--batch-size", "0"], "argument --batch-size: must be at least 1"),
    (["--lr", "nan"], "argument --lr: must be a finite number"),
    (["--lr", "-1"], "argument --lr: must be greater than 0"),
    (["--seed", "-1"], "argument --seed: must be 0 or more"),
    (["--channels", "2"], "argument --channels: invalid choice"),
])
def test_encoder_cli_refuses_bad_numbers_before_reading_data(tmp_path, flags, message, capsys):
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "e.safetensors"), *flags])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--hidden-size", "7"], "--hidden-size/--num-heads: hidden_size=7 is not divisible by num_heads=2"),
    (["--resolution", "30"], "input_size=30 is not divisible by patch_size=4"),  # were tracebacks after loading
    (["--out", "e.pt"], "argument --out: must be a file name ending in .safetensors, got 'e.pt'"),
])
def test_encoder_cli_names_bad_model_flags(tmp_path, flags, message, capsys):
    out = ["--out", str(tmp_path / "e.safetensors")] if "--out" not in flags else []
    try:
        code = main(["--data", str(tmp_path / "none"), *out, *flags])
    except SystemExit as e:  # refused while parsing (the flag's contract), before main's own checks
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing read, nothing written


def test_timm_encoder_from_a_local_file_and_the_offline_error(tmp_path, monkeypatch):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    name = "vit_tiny_patch16_224"
    ref = timm.create_model(name, pretrained=False, num_classes=0, img_size=32)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "w.safetensors"))
    enc = load_encoder(f"timm:{name}", str(tmp_path / "w.safetensors"), resolution=32)
    x = torch.rand(2, 1, 16, 16) * 2 - 1  # one channel, another size: repeated and resized
    feats = enc(x, 4)
    assert feats.shape == (2, 16, 192)
    monkeypatch.setattr("vit5_sit.data.vae.hub_reachable", lambda: False)
    with pytest.raises(EncoderError, match=f"repa.encoder_weights=PATH/{name}.safetensors"):
        load_encoder(f"timm:{name}")
    with pytest.raises(EncoderError, match="timm has no such model"):
        load_encoder("timm:not_a_model_xyz", str(tmp_path / "w.safetensors"))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(EncoderError, match="not weights of"):
        load_encoder(f"timm:{name}", str(tmp_path / "bad.safetensors"), resolution=32)


def test_config_checks():
    with pytest.raises(ConfigError, match="repa.weight > 0 needs repa.encoder"):
        load_config(None, ["repa.weight=0.5"])
    with pytest.raises(ConfigError, match="repa.depth=9: the model has 6 blocks"):
        load_config(None, ["repa.weight=0.5", "repa.encoder=x.safetensors", "repa.depth=9"])
    with pytest.raises(ConfigError, match="repa.weight=-1.0"):
        load_config(None, ["repa.weight=-1"])
    assert not load_config(None, []).repa.enabled


def test_training_saves_the_projector_beside_the_exported_model(tmp_path):
    data = _image_folder(tmp_path / "data")
    logs = []
    from vit5_sit.train.loop import TrainingError, train

    cfg = load_config(None, [*_cli_overrides(tmp_path, "repa", data), "train.max_steps=2", "log.every=1",
                             *_repa_overrides(tmp_path)])
    run = train(cfg, log_fn=logs.append)
    assert any(m.startswith("REPA: block 1 aligned to") for m in logs)
    assert any(m.startswith("step 2 ") and " repa=" in m and " flow=" in m for m in logs)
    ckpt = list_checkpoints(run)[-1].path
    projector = load_file(str(ckpt / "projector.safetensors"))
    assert set(projector) == {f"{i}.{k}" for i in (0, 2, 4) for k in ("weight", "bias")}
    assert projector["4.weight"].shape == (16, 16)  # z_dim of the encoder x projector_dim
    for name in ("model.safetensors", "ema.safetensors"):
        assert not any("projector" in k for k in load_file(str(ckpt / name)))
    from vit5_sit.hub.model_files import load_for_sampling

    model, _ = load_for_sampling(run)  # the exported EMA model loads without REPA
    assert model.cfg.depth == 1
    from vit5_sit.train.preflight import PreflightError

    with pytest.raises(PreflightError, match="repa.weight"):  # the run's config.yaml says REPA
        _train([*_cli_overrides(tmp_path, "repa", data), "train.max_steps=4"], resume="auto")
    import shutil

    loose = shutil.copytree(ckpt, tmp_path / "loose" / ckpt.name)  # a checkpoint without its run folder
    with pytest.raises(TrainingError, match="trained with REPA but this run has repa.weight=0"):
        _train([*_cli_overrides(tmp_path, "other", data), "train.max_steps=4"], resume=str(loose))
