"""``meanflow.teacher``: iMF distilling a frozen flow model's guided ODE. Ground truth: Gaussian data, where the
flow's velocity and the exact average velocity of its ODE are closed-form, and the exact average velocity is the
fixed point of the teacher's target (the MeanFlow identity along the teacher's ODE)."""

from __future__ import annotations

import pytest
import torch
from tinydata import TINY_TRAIN, image_folder
from torch import nn

from vit5_sit.config import load_config
from vit5_sit.train.checkpoint import list_checkpoints
from vit5_sit.transport.meanflow import MeanFlowConfig, imf_target, teacher_velocity

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

S = 0.5                                   # the data's std: x1 ~ N(mu_y, S^2) per pixel, x0 ~ N(0, 1)
MEANS = torch.tensor([1.5, -1.0, 0.25])   # mu_y for labels 0, 1 and the null label 2 (the unconditional field)
NULL = 2


def _sigma(t):
    return (t.square() * S**2 + (1 - t).square()).sqrt()  # std of x_t = t x1 + (1 - t) x0


def _rows(v, x):
    return v.view(-1, *[1] * (x.ndim - 1))


class GaussianFlow(nn.Module):
    """The flow velocity E[x1 - x0 | x_t] of N(mu_y, S^2) data: mu + k(t) (x - t mu), k = (t S^2 - (1 - t)) / s_t^2."""

    def forward(self, x, t, y):
        mu, tt = _rows(MEANS[y], x), _rows(t, x)
        return mu + (tt * S**2 - (1 - tt)) / _rows(_sigma(t), x).square() * (x - tt * mu)


class ExactAverage(nn.Module):
    """The exact average velocity of the guided ODE: the flow of N(m, S^2), m = mu_u + w (mu_y - mu_u) (guided
    Gaussian fields of one variance are the field of the guided mean), is x_s = s m + s_s / s_t (x - t m), so
    U(x, t, d) = (x_{t+d} - x) / d; as ``imf_target``'s model it has the `Denoiser`'s forward and jvp."""

    def _u(self, x, t, d, y, w):
        m = _rows(MEANS[NULL] + w * (MEANS[y] - MEANS[NULL]), x)
        tt, dd = _rows(t, x), _rows(d, x)
        ratio = _rows(_sigma(t + d) / _sigma(t), x)
        return ((tt + dd) * m + ratio * (x - tt * m) - x) / dd

    def jvp(self, primals, tangents, y, guidance=None):
        w = guidance[:, 0]
        return torch.func.jvp(lambda x, t, d: self._u(x, t, d, y, w), primals, tangents)


def test_the_teacher_velocity_is_the_guided_field_and_null_labels_are_unconditional():
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(5, 1, 2, 2, generator=g), torch.rand(5, generator=g)
    y, w = torch.tensor([0, 1, NULL, 0, 1]), torch.tensor([1.0, 3.0, 4.0, 2.5, 1.0])
    flow = GaussianFlow()
    got = teacher_velocity(flow, x, t, y, w, NULL)
    v_c, v_u = flow(x, t, y), flow(x, t, torch.full_like(y, NULL))
    want = v_u + _rows(w, x) * (v_c - v_u)
    want[2] = v_u[2]  # a dropped label learns the unconditional field, whatever w
    assert torch.allclose(got, want, atol=1e-6)


def test_the_exact_average_velocity_of_the_teachers_ode_is_the_fixed_point_of_the_target():
    """Gaussian closed form: with the teacher's guided field, sg(v_g + d dU/dt) = U for the exact U, at every
    interval and guidance scale; the sample's own velocity ``v`` plays no part (it is noise here)."""
    g = torch.Generator().manual_seed(1)
    n = 8
    x, t = torch.randn(n, 1, 3, 3, dtype=torch.float64, generator=g), 0.05 + 0.5 * torch.rand(n, generator=g).double()
    d = torch.where(torch.arange(n) % 2 == 0, (1 - t) * torch.rand(n, generator=g).double(), torch.zeros(n).double())
    y = torch.tensor([0, 1, 0, 1, NULL, 0, 1, 0])
    w = torch.tensor([1.0, 2.0, 3.0, 5.0, 1.0, 1.5, 1.0, 4.0]).double()
    guidance = torch.stack([w, torch.zeros(n).double(), torch.ones(n).double()], 1)
    guidance[4] = torch.tensor([1.0, 0.0, 1.0])
    exact = ExactAverage()
    target = imf_target(exact, x, t, d, y, torch.randn_like(x), guidance, NULL, teacher=GaussianFlow())
    moving = d > 0
    want = exact._u(x[moving], t[moving], d[moving], y[moving], w[moving])
    assert torch.allclose(target[moving], want, atol=1e-9)
    assert torch.allclose(target[~moving], teacher_velocity(GaussianFlow(), x, t, y, w, NULL)[~moving], atol=1e-12)
    # A wrong U is not a fixed point: the target moves it.
    wrong = imf_target(exact, x, t, d * 0.5, y, x, guidance, NULL, teacher=GaussianFlow())
    assert not torch.allclose(wrong[moving], want, atol=1e-3)


def test_a_teacher_needs_imf_and_a_path():
    with pytest.raises(ValueError, match=r"meanflow.teacher='demo' needs meanflow.variant=imf"):
        MeanFlowConfig(teacher="demo")
    with pytest.raises(ValueError, match=r"meanflow.teacher=' ': give the path"):
        MeanFlowConfig(variant="imf", teacher=" ")
    with pytest.raises(ValueError, match=r"meanflow.teacher=3"):
        MeanFlowConfig(variant="imf", teacher=3)


def test_a_run_distils_a_flow_run_and_reads_the_teacher_again_when_it_resumes(tmp_path):
    from vit5_sit.train.loop import TrainingError, train

    data = image_folder(tmp_path / "data")
    common = [*TINY_TRAIN, f"output_dir={tmp_path}", "data.kind=images", f"data.path={data}", "data.resolution=8",
              "data.channels=3", "model.num_classes=2", "train.global_batch_size=4"]
    flow_run = train(load_config(None, [*common, "name=flow", "train.max_steps=2"]))
    mf = [*common, "name=mf", "train.objective=meanflow", "meanflow.variant=imf", f"train.init_from={flow_run}",
          f"meanflow.teacher={flow_run}", "model.x_prediction=true", "train.max_steps=2"]
    lines = []
    run = train(load_config(None, mf), log_fn=lines.append)
    assert any(line.startswith(f"meanflow.teacher: the flow model {flow_run}") for line in lines), lines
    lines.clear()
    train(load_config(None, [*mf, "train.max_steps=3"]), resume="auto", log_fn=lines.append)
    assert any(line.startswith("meanflow.teacher:") for line in lines) and [c.step for c in list_checkpoints(run)] \
        == [2, 3]
    with pytest.raises(TrainingError, match=r"^meanflow.teacher=.*gone: no such file or folder"):
        train(load_config(None, [*mf, "name=mf2", f"meanflow.teacher={tmp_path / 'gone'}"]))
    with pytest.raises(TrainingError, match=r"^meanflow.teacher=.*a MeanFlow model already"):
        train(load_config(None, [*mf, "name=mf3", f"meanflow.teacher={run}"]))
    noise_run = train(load_config(None, [*common, "name=noise", "train.max_steps=1", "transport.prediction=noise"]))
    for key in ("meanflow.teacher", "train.init_from"):  # MeanFlow builds on the linear path's velocity
        with pytest.raises(TrainingError, match=rf"^{key}=.*prediction=noise; MeanFlow builds on"):
            train(load_config(None, [*mf, f"name=mf-{key}", f"{key}={noise_run}"]))
