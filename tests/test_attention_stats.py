"""Attention statistics (vit5_sit.eval.attention): the recomputed attention is the forward's, the analytic
uniform case, and the command on a model folder with its bad inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tinydata import image_folder

from vit5_sit.config import load_config, save_config
from vit5_sit.eval.attention import _block_statistics, attention_statistics, main
from vit5_sit.models import create_model

TINY = ["model.preset=ViT5-T/4", "model.depth=2", "model.hidden_size=32", "model.num_heads=2",
        "model.input_size=8", "model.in_channels=3", "model.num_classes=2", "data.kind=images",
        "data.resolution=8", "data.channels=3"]
PATCHES = 4  # an 8x8 input in 4x4 patches


def _model(overrides=(), seed: int = 0):
    cfg = load_config(None, [*TINY, *overrides])
    torch.manual_seed(seed)
    model = create_model(cfg.model_config()).eval()
    with torch.no_grad():  # a fresh adaLN-Zero model has zero gates and outputs: perturb it
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return cfg, model


def _inputs(n: int = 3):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 8, 8, generator=g), torch.rand(n, generator=g), torch.tensor([0, 1, 0][:n])


@pytest.mark.parametrize("overrides", [[], ["model.preset=SiT-T/4", "model.num_registers=0"]],
                         ids=["vit5-registers", "sit"])
def test_statistics_are_those_of_the_attention_the_forward_computes(overrides):
    cfg, model = _model(overrides)
    x, t, y = _inputs()
    expected = model(x, t, y)
    captured = {}

    def keep(module, args, out):  # the real attention output of block 1
        captured["out"], captured["in"] = out, args
    h = model.blocks[0].attn.register_forward_hook(keep)
    stats = attention_statistics(model, x, t, y)
    h.remove()
    assert torch.equal(model(x, t, y), expected)  # the hooks are gone and changed nothing
    assert [s.block for s in stats] == [1, 2]
    # Rebuild block 1's attention from the logits the statistics read: its output must be the forward's.
    attn = model.blocks[0].attn
    q, k, v = attn.project(*captured["in"])
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    rebuilt = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(x.shape[0], -1, model.cfg.hidden_size))
    torch.testing.assert_close(rebuilt, captured["out"], rtol=1e-5, atol=1e-5)
    assert stats[0].max_logit == pytest.approx(logits.amax().item(), rel=1e-6)
    registers = model.cfg.num_registers
    assert (stats[0].register_mass is None) == (registers == 0)
    for s in stats:
        assert 0 < s.entropy < math.log(PATCHES + registers) + 1e-6
        assert s.top_patch_mass >= (1 - (s.register_mass or 0)) * (PATCHES + registers) / PATCHES - 1e-5
        assert s.norm_ratio >= 1.0


def test_zero_queries_and_keys_give_uniform_attention_analytically():
    cfg, model = _model()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:2 * model.cfg.hidden_size].zero_()  # q = k = 0 (bias-free QKV): logits 0
    registers = model.cfg.num_registers
    assert registers == 4
    for s in attention_statistics(model, *_inputs()):
        assert s.max_logit == 0.0
        assert s.entropy == pytest.approx(math.log(PATCHES + registers), rel=1e-6)
        assert s.register_mass == pytest.approx(registers / (PATCHES + registers), rel=1e-6)
        assert s.top_patch_mass == pytest.approx(1.0, rel=1e-6)


def test_a_sink_and_a_high_norm_token_show_analytically():
    """Synthetic q, k: every query (1, ..., 1); patch token 0's key 10 x that, the rest 0 -> token 0 takes
    e^(10 sqrt(hd)) / (e^(10 sqrt(hd)) + T + R - 1) of each query's attention; its output norm 10x the others'."""
    B, H, hd, R = 2, 2, 4, 2
    tokens = PATCHES + R
    q = torch.ones(B, H, tokens, hd)
    k = torch.zeros(B, H, tokens, hd)
    k[:, :, 0] = 10.0
    out = torch.ones(B, tokens, 8)
    out[:, 0] *= 10.0
    s = _block_statistics(q, k, out, PATCHES, 1, R)
    e = math.exp(10 * math.sqrt(hd))
    p0 = e / (e + tokens - 1)
    assert s.max_logit == pytest.approx(10 * math.sqrt(hd))
    assert s.top_patch_mass == pytest.approx(p0 * tokens, rel=1e-5)
    assert s.register_mass == pytest.approx(R * (1 - p0) / (tokens - 1), rel=1e-4, abs=1e-12)
    expected_entropy = -(p0 * math.log(p0) + (1 - p0) * math.log((1 - p0) / (tokens - 1)))  # p0, and the rest even
    assert s.entropy == pytest.approx(expected_entropy, rel=1e-3, abs=1e-6)
    # the median of the 4 patch tokens' norms is the plain tokens' (torch takes the lower middle)
    assert s.norm_ratio == pytest.approx(10.0)


def _model_folder(root: Path) -> Path:
    data = image_folder(root / "data", per_class=3)
    cfg, model = _model([f"data.path={data}"])
    folder = root / "model"
    folder.mkdir()
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "ema.safetensors"))
    return folder


def test_the_command_prints_and_writes_the_statistics(tmp_path, capsys):
    folder = _model_folder(tmp_path)
    assert main([str(folder), str(folder), "--t", "0.2,0.8", "--num", "4", "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "max_logit" in out and "register" in out
    record = json.loads((tmp_path / "a.json").read_text())
    stats = record["models"][str(folder)]
    assert sorted(stats) == ["0.2", "0.8"]
    assert [b["block"] for b in stats["0.2"]] == [1, 2]
    assert 0 < stats["0.8"][0]["register_mass"] < 1
    summary = record["summary"][str(folder)]
    assert summary["max_logit"] == max(b["max_logit"] for bs in stats.values() for b in bs)
    assert summary["register_mass"] == pytest.approx(
        sum(b["register_mass"] for bs in stats.values() for b in bs) / 4)
    assert "summary" in out and "min_entropy" in out


def _exit_code(argv: list[str]) -> int:
    """main's return value, or the code of argparse's SystemExit (a flag's own check)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("args, words", [
    (["--t", "0.5,1.5"], "[0, 1]"),
    (["--t", "half"], "comma-separated"),
    (["--t", "nan"], "[0, 1]"),
    (["--num", "0"], "--num"),
    (["--num", "99"], "holds only 6"),
    (["--data", "/nonexistent/folder"], "--data"),
    (["--device", "gpu7"], "--device"),
])
def test_bad_arguments_name_the_value_and_the_fix(tmp_path, capsys, args, words):
    folder = _model_folder(tmp_path)
    assert _exit_code([str(folder), *args]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert "Traceback" not in err


def test_a_missing_or_broken_model_fails_before_any_is_measured(tmp_path, capsys):
    folder = _model_folder(tmp_path)
    assert main([str(folder), str(tmp_path / "nothing")]) == 2
    captured = capsys.readouterr()
    assert "no such run" in captured.err and "max_logit" not in captured.out
    (folder / "ema.safetensors").write_bytes(b"not safetensors")
    assert main([str(folder)]) == 2
    assert "ema.safetensors" in capsys.readouterr().err
