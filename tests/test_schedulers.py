"""diffusers' flow schedulers driving our models: the adapter's Euler is our Euler, the flow-mode multistep
schedulers reach the exact flow, paths they cannot serve are refused in one line, and the pipeline and
sample.py take them."""

import numpy as np
import pytest
import torch
from test_pipeline import TINY, _model_dir
from test_transport import MU, S, exact_field, flow_end, noise

from vit5_sit.pipeline import Vit5SitPipeline
from vit5_sit.transport import SamplerConfig, Transport, TransportConfig
from vit5_sit.transport.diffusers_schedulers import SchedulerError, make_scheduler, sample_with_scheduler
from vit5_sit.transport.samplers import ode_euler

diffusers = pytest.importorskip("diffusers")


def _gaussian():
    return exact_field("linear", "velocity", MU.float(), S.float()), noise(300).float()


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_flow_euler_adapter_is_our_euler(shift):
    model, z = _gaussian()
    tr = Transport(TransportConfig())
    scheduler = make_scheduler("flow-euler", shift)
    theirs = sample_with_scheduler(model, z, None, tr, scheduler, 10)
    assert theirs.nfe == 10
    t_steps = (1 - scheduler.sigmas.double()).tolist()  # their sigma = our 1 - t
    ours = ode_euler(model, z, None, tr, SamplerConfig(steps=10), t_steps=t_steps)
    torch.testing.assert_close(theirs.samples, ours, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dpm-solver", "unipc"])
def test_flow_mode_multistep_schedulers_reach_the_exact_flow(name):
    model, z = _gaussian()
    want = flow_end("linear", z.double(), 0.0, 1.0)
    res = sample_with_scheduler(model, z, None, Transport(TransportConfig()), make_scheduler(name), 10)
    err = (res.samples.double() - want).pow(2).mean().sqrt().item()
    assert res.nfe == 10 and err < 0.03, err


@pytest.mark.parametrize("path", ["gvp", "vp"])
def test_other_paths_are_refused_in_one_line(path):
    model, z = _gaussian()
    with pytest.raises(SchedulerError) as e:
        sample_with_scheduler(model, z, None, Transport(TransportConfig(path=path)), make_scheduler("unipc"), 5)
    assert f"'{path}'" in str(e.value) and "\n" not in str(e.value) and "dpm++2m" in str(e.value)


@pytest.mark.parametrize("scheduler,message", [
    (lambda: diffusers.DPMSolverMultistepScheduler(), "use_flow_sigmas=True"),
    (lambda: diffusers.DDIMScheduler(), "not a flow-matching scheduler"),
    (lambda: diffusers.FlowMatchEulerDiscreteScheduler(stochastic_sampling=True), "stochastically"),
])
def test_schedulers_that_cannot_serve_are_named(scheduler, message):
    model, z = _gaussian()
    with pytest.raises(SchedulerError, match=message):
        sample_with_scheduler(model, z, None, Transport(TransportConfig()), scheduler(), 5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _model_dir(tmp_path_factory.mktemp("model"), TINY)


def test_pipeline_with_a_scheduler(model_dir):
    pipe = Vit5SitPipeline.from_pretrained(model_dir, scheduler=make_scheduler("flow-euler"))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(class_labels=[1, 2, 3], seed=0, num_inference_steps=4, output_type="np", batch_size=2)
    whole = pipe(class_labels=[1, 2, 3], seed=0, num_inference_steps=4, output_type="np")
    assert out.images.shape == (3, 8, 8, 3) and np.isfinite(out.images).all()  # RGB, as "pil" (#45)
    np.testing.assert_allclose(out.images, whole.images, atol=1e-6)  # batch size does not change an image
    with pytest.raises(ValueError, match="its scheduler"):
        pipe(class_labels=[1], method="heun")
    gvp = _model_dir(model_dir.parent / "gvp", [*TINY, "transport.path=gvp"])
    with pytest.raises(SchedulerError, match="'gvp'"):
        Vit5SitPipeline.from_pretrained(gvp, scheduler=make_scheduler("unipc"))


def test_sample_py_scheduler_flags(model_dir, tmp_path, capsys):
    from vit5_sit.cli import sample as sample_cli

    base = ["--ckpt", str(model_dir), "--no-progress", "--steps", "3"]
    assert sample_cli.main([*base, "--scheduler", "unipc", "--out", str(tmp_path / "g.png")]) == 0
    assert (tmp_path / "g.png").is_file()
    assert sample_cli.main([*base, "--scheduler", "unipc", "--method", "heun", "--out", str(tmp_path / "h.png")]) == 2
    assert sample_cli.main([*base, "--scheduler", "unipc", "--out", str(tmp_path / "s.npz")]) == 2
    assert sample_cli.main([*base, "--method", "dpm++2m", "--grid", "logsnr", "--out", str(tmp_path / "d.png")]) == 0
    err = capsys.readouterr().err
    assert "leave out --sampler/--method/--grid/--tol" in err and "for .png grids" in err


def test_sample_py_tol_sets_an_adaptive_solvers_tolerances_and_is_refused_elsewhere(model_dir, tmp_path, capsys):
    from vit5_sit.cli import sample as sample_cli
    from vit5_sit.sampling.generate import sampler_settings

    assert (sampler_settings(None, "ode", "dopri5", tol=1e-5).atol, sampler_settings(None, "ode", "dopri5",
                                                                                     tol=1e-5).rtol) == (1e-5, 1e-5)
    for mode, method in (("ode", "dpm++2m"), ("sde", "euler")):
        with pytest.raises(ValueError, match="adaptive ODE solvers.*add --method dopri5"):
            sampler_settings(None, mode, method, tol=1e-5)
    base = ["--ckpt", str(model_dir), "--no-progress", "--classes", "1", "--per-class", "1"]
    assert sample_cli.main([*base, "--method", "dopri5", "--tol", "1e-3", "--out", str(tmp_path / "a.png")]) == 0
    assert "ode/dopri5 atol 0.001 rtol 0.001" in capsys.readouterr().out
    assert sample_cli.main([*base, "--method", "euler", "--tol", "1e-3", "--out", str(tmp_path / "e.png")]) == 2
    assert "--tol" in capsys.readouterr().err and not (tmp_path / "e.png").exists()
