"""Autoguidance (Karras et al. 2024, issue #52): the guide + w (model - guide) formula bit for bit, scale 1 = the
model alone, the interval switching it off, and a guide that does not fit is one error before any sampling."""

from __future__ import annotations

import pytest
import torch

from vit5_sit.models import create_model
from vit5_sit.sampling.generate import sample_images
from vit5_sit.transport import AutoGuidance, GuidanceError, SamplerConfig, Transport, check_guide


def tiny(seed: int, **overrides):
    torch.manual_seed(seed)
    fields = dict(input_size=8, in_channels=2, depth=1, hidden_size=32, num_heads=2, num_classes=3)
    model = create_model("ViT5-T/2", **{**fields, **overrides})
    with torch.no_grad():  # non-zero outputs: perturb the zero-initialised gates and output layer
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def pair():
    return tiny(0), tiny(1)


def batch(n: int = 4):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 2, 8, 8, generator=g)
    t = torch.linspace(0.1, 0.9, n)
    return x, t, torch.tensor([0, 1, 2, 0][:n])


@torch.no_grad()
def test_equals_the_formula_bit_for_bit(pair):
    model, guide = pair
    x, t, y = batch()
    out = AutoGuidance(model, guide, 2.5)(x, t, y)
    main, bad = model(x, t, y), guide(x, t, y)
    assert torch.equal(out, bad + 2.5 * (main - bad))
    assert not torch.equal(out, main)


@torch.no_grad()
def test_scale_one_is_the_model_alone_and_zero_the_guide(pair):
    model, guide = pair
    x, t, y = batch()
    assert torch.equal(AutoGuidance(model, guide, 1.0)(x, t, y), model(x, t, y))
    assert torch.allclose(AutoGuidance(model, guide, 0.0)(x, t, y), guide(x, t, y), atol=1e-6)


@torch.no_grad()
def test_interval_switches_it_off_outside(pair):
    model, guide = pair
    x, t, y = batch()  # t = 0.1, 0.37, 0.63, 0.9
    out = AutoGuidance(model, guide, 3.0, interval=(0.3, 0.7))(x, t, y)
    main, bad = model(x, t, y), guide(x, t, y)
    inside = (t >= 0.3) & (t <= 0.7)
    assert torch.equal(out[~inside], main[~inside])
    # the guide runs on the guided rows only: a smaller batch, so compare to float tolerance
    assert torch.allclose(out[inside], (bad + 3.0 * (main - bad))[inside], atol=1e-6)


@torch.no_grad()
def test_sampling_with_a_guide_is_the_hand_written_euler_loop(pair):
    model, guide = pair
    transport, sampler = Transport(), SamplerConfig(mode="ode", method="euler", steps=3)
    got = sample_images(model, transport, sampler, [0, 2], [11, 12], cfg_scale=2.0, guide=guide, as_float=True)
    from vit5_sit.transport import StackedRandomGenerator

    x = StackedRandomGenerator([11, 12], torch.device("cpu")).randn((2, 8, 8))
    y = torch.tensor([0, 2])
    ts = torch.linspace(0, 1, 4)
    for t0, t1 in zip(ts[:-1], ts[1:], strict=True):
        t = torch.full((2,), float(t0))
        main, bad = model(x, t, y), guide(x, t, y)
        x = x + (t1 - t0) * (bad + 2.0 * (main - bad))
    assert torch.allclose(got, x, atol=1e-5)
    plain = sample_images(model, transport, sampler, [0, 2], [11, 12], as_float=True)
    same = sample_images(model, transport, sampler, [0, 2], [11, 12], cfg_scale=1.0, guide=guide, as_float=True)
    assert torch.equal(same, plain)


@pytest.mark.parametrize("field, value, named", [
    ("in_channels", 1, "in_channels"), ("input_size", 16, "input_size"), ("num_classes", 5, "num_classes"),
    ("mean_flow", True, "mean_flow")])
def test_a_guide_that_does_not_fit_is_one_error_before_sampling(pair, field, value, named):
    model, _ = pair
    other = tiny(2, **{field: value})
    with pytest.raises(GuidanceError, match=named):
        check_guide(model.cfg, other.cfg)
    calls = []
    model_calls = model.forward

    def counted(*a, **k):
        calls.append(1)
        return model_calls(*a, **k)

    sampler = SamplerConfig(mode="ode", method="euler", steps=2)
    with pytest.raises(GuidanceError, match=named):
        sample_images(model, Transport(), sampler, [0], [0], cfg_scale=2.0, guide=other)
    assert not calls


def test_guide_transport_mismatch_is_named(pair):
    from vit5_sit.transport import TransportConfig

    model, guide = pair
    with pytest.raises(GuidanceError, match="prediction"):
        check_guide(model.cfg, guide.cfg, TransportConfig(), TransportConfig(prediction="noise"))


# ----------------------------------------------------------------------------------------------------------
# sample.py --guide: an early checkpoint of the same run guides its newest one.

def _tiny_run(root):
    from vit5_sit.config import load_config, save_config
    from vit5_sit.train.checkpoint import save_checkpoint

    cfg = load_config(None, ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
                             "data.kind=mnist", "data.resolution=8", "sampler.steps=3"])
    states = []
    for seed in (1, 0):
        torch.manual_seed(seed)
        model = create_model(cfg.model_config())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        states.append({k: v.contiguous() for k, v in model.state_dict().items()})
    save_config(cfg, root / "config.yaml")
    save_checkpoint(root, 10, states[0], states[0], {"optimizer": {}})
    save_checkpoint(root, 20, states[1], states[1], {"optimizer": {}})
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _tiny_run(tmp_path_factory.mktemp("run"))


def _sample():
    from vit5_sit.cli import sample

    return sample


def test_sample_py_guide_is_the_formula(run, tmp_path):
    from vit5_sit.hub.model_files import load_for_sampling
    from vit5_sit.transport import TransportConfig

    sample = _sample()
    guide_ckpt = next(p for p in (run / "checkpoints").iterdir() if p.name.endswith("10"))
    out = tmp_path / "g.npz"
    args = ["--ckpt", run, "--guide", guide_ckpt, "--cfg-scale", 2, "--out", out, "--num-samples", 3,
            "--classes", "1,2,3", "--no-progress"]
    assert sample.main([str(a) for a in args]) == 0
    model, cfg = load_for_sampling(run)
    guide, _ = load_for_sampling(guide_ckpt)
    want = sample_images(model, Transport(TransportConfig(**vars(cfg.transport))), cfg.sampler, [1, 2, 3],
                         [0, 1, 2], cfg_scale=2.0, guide=guide)
    import numpy as np

    assert np.array_equal(np.load(out)["arr_0"], want)
    manifest = __import__("json").loads((tmp_path / "g.npz.json").read_text())
    assert manifest["guide"]["sha256"]  # the guide is part of what the file was sampled with


def test_sample_py_guide_errors_are_one_line_before_sampling(run, tmp_path, capsys, monkeypatch):
    import vit5_sit.sampling.generate as generate

    sample = _sample()
    monkeypatch.setattr(generate, "sample_images", lambda *a, **k: pytest.fail("sampled"))
    out = tmp_path / "x.png"
    cases = [(["--guide", "demo", "--cfg-scale", "2"], "--guide: the guide cannot guide this model"),
             (["--guide", str(run)], "--cfg-scale W"),
             (["--guide", str(tmp_path / "nope"), "--cfg-scale", "2"], "no such file"),
             (["--guide", str(run), "--cfg-scale", "2", "--guide-channels", "1"], "--guide-channels")]
    for extra, message in cases:
        assert sample.main(["--ckpt", str(run), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


def test_guide_auto_is_the_checkpoint_the_run_kept(tmp_path_factory, tmp_path, capsys):
    import numpy as np

    from vit5_sit.config import load_config, save_config

    run = _tiny_run(tmp_path_factory.mktemp("kept"))
    cfg = load_config(run / "config.yaml", ["train.max_steps=20", "train.ckpt_every=10", "train.guide_at=0.4"])
    save_config(cfg, run / "config.yaml")
    sample = _sample()
    common = ["--ckpt", run, "--cfg-scale", 1.5, "--num-samples", 2, "--no-progress"]
    assert sample.main([str(a) for a in [*common, "--guide", "auto", "--out", tmp_path / "a.npz"]]) == 0
    explicit = run / "checkpoints" / "step_0000010"
    assert sample.main([str(a) for a in [*common, "--guide", explicit, "--out", tmp_path / "b.npz"]]) == 0
    assert np.array_equal(np.load(tmp_path / "a.npz")["arr_0"], np.load(tmp_path / "b.npz")["arr_0"])
    capsys.readouterr()
    save_config(load_config(run / "config.yaml", ["train.guide_at=null"]), run / "config.yaml")
    assert sample.main([str(a) for a in [*common, "--guide", "auto", "--out", tmp_path / "c.npz"]]) == 2
    err = capsys.readouterr().err
    assert "keeps no guide" in err and "train.guide_at=None" in err


# ----------------------------------------------------------------------------------------------------------
# eval_fid.py compare --guide: every checkpoint sampled with its guide, cached apart from classifier-free guidance.

@pytest.mark.parametrize("spec", ["step:10", "path"])
def test_compare_samples_each_checkpoint_with_its_guide(run, tmp_path, monkeypatch, spec):
    import numpy as np

    import vit5_sit.eval.compare as compare
    from vit5_sit.config import load_config
    from vit5_sit.hub.model_files import load_for_sampling
    from vit5_sit.train.checkpoint import list_checkpoints

    guide_dir = run / "checkpoints" / "step_0000010"
    settings = compare.CompareSettings(num_samples=4, steps=2, cfg_scale=2.0, part_size=4, batch_size=4,
                                       metrics=("fid",), guide=str(guide_dir) if spec == "path" else spec)
    assert settings.tag() != compare.CompareSettings(num_samples=4, steps=2, cfg_scale=2.0).tag()
    monkeypatch.setattr(compare, "_cached_metrics", lambda *a, **k: {})
    cfg = load_config(run / "config.yaml")
    newest = list_checkpoints(run)[-1]
    row = compare.evaluate_checkpoint(run, "run", cfg, newest, settings, None, device="cpu", progress=False,
                                      log=lambda m: None, cache=tmp_path)
    model, _ = load_for_sampling(newest.path)
    guide, _ = load_for_sampling(guide_dir)
    want = sample_images(model, Transport(cfg.transport), settings.sampler(), [0, 1, 2, 3], [0, 1, 2, 3],
                         cfg_scale=2.0, guide=guide)
    assert np.array_equal(np.load(row["samples"])["arr_0"], want)


@pytest.mark.parametrize("spec, message", [("step:x", "step:N takes a positive whole step"),
                                           ("step:30", "no checkpoint at step 30"), ("auto", "is not there yet")])
def test_compare_guide_errors_name_the_problem(run, spec, message):
    import vit5_sit.eval.compare as compare

    with pytest.raises(compare.CompareError, match=message):
        compare.CompareSettings(guide=spec).guide_path(run)


def test_sample_py_takes_the_model_folders_guide_as_the_pipeline_does(tmp_path):
    """A model folder carrying guide/: sample.py uses it by default (= Vit5SitPipeline.from_pretrained), and
    --guide none samples with classifier-free guidance instead."""
    import numpy as np

    from vit5_sit.config import load_config
    from vit5_sit.pipeline import Vit5SitPipeline

    cfg = load_config(None, ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2",
                             "data.kind=mnist", "data.resolution=8", "sampler.steps=2"])
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = create_model(cfg.model_config())
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        models.append(m.eval())
    folder = Vit5SitPipeline(models[0], cfg, guide=models[1]).save_pretrained(tmp_path / "guided")
    pipe = Vit5SitPipeline.from_pretrained(folder)  # the folder's guide/ comes back as the pipeline's guide
    assert pipe.guide is not None
    transport = Transport(pipe.config.transport)
    want = sample_images(pipe.model, transport, pipe.config.sampler, [3, 4], [0, 1], cfg_scale=2.0, guide=pipe.guide)
    plain = sample_images(pipe.model, transport, pipe.config.sampler, [3, 4], [0, 1], cfg_scale=2.0)
    sample = _sample()
    common = ["--ckpt", folder, "--cfg-scale", 2, "--classes", "3,4", "--num-samples", 2, "--no-progress"]
    assert sample.main([str(a) for a in [*common, "--out", tmp_path / "a.npz"]]) == 0
    assert sample.main([str(a) for a in [*common, "--guide", "none", "--out", tmp_path / "b.npz"]]) == 0
    assert np.array_equal(np.load(tmp_path / "a.npz")["arr_0"], want)
    assert np.array_equal(np.load(tmp_path / "b.npz")["arr_0"], plain)
    assert not np.array_equal(want, plain)


@torch.no_grad()
def test_an_imf_model_takes_the_sampling_guidance_as_its_input(pair):
    """Improved MeanFlow (#51): one model, two guidance scales, two outputs, each the network called with that scale
    and interval as its guidance inputs, one pass per step (no unconditional pass); a guide is refused."""
    from vit5_sit.transport import StackedRandomGenerator
    from vit5_sit.transport.meanflow import guidance_inputs

    model = tiny(3, mean_flow=True, guidance_input=True)
    sampler = SamplerConfig(mode="meanflow", method="euler", steps=1)
    outs = []
    for scale in (1.0, 3.0):
        got = sample_images(model, Transport(), sampler, [0, 2], [5, 6], cfg_scale=scale,
                            guidance_interval=(0.1, 0.9), as_float=True)
        x = StackedRandomGenerator([5, 6], torch.device("cpu")).randn((2, 8, 8))
        g = guidance_inputs(2, scale, (0.1, 0.9))
        want = x + model(x, torch.zeros(2), torch.tensor([0, 2]), interval=torch.ones(2), guidance=g)
        assert torch.allclose(got, want, atol=1e-6)
        outs.append(got)
    assert not torch.allclose(outs[0], outs[1])
    with pytest.raises(GuidanceError, match="network inputs"):
        sample_images(model, Transport(), sampler, [0], [0], cfg_scale=2.0, guide=tiny(4, mean_flow=True,
                                                                                      guidance_input=True))
