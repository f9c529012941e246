"""x-prediction (pMF's output, issue #51): the network gives the data point, the average velocity follows from it.

U(x_t, t, d) = (x_hat - x_t) / (1 - t): a MeanFlow step that ends at t = 1 lands on x_hat, so a one-step sample is
the network's output itself (the background needs no cancelling of the input noise)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_meanflow import _inputs, _model

from vit5_sit.config import ConfigError, load_config
from vit5_sit.hub.agreement import recorded_fields, weights_metadata
from vit5_sit.hub.model_files import load_for_sampling
from vit5_sit.models import create_model
from vit5_sit.models.config import ModelConfig
from vit5_sit.models.denoiser import X_PRED_MIN_GAP
from vit5_sit.train.init_from import X_PRED_HEAD, convert, flow_state
from vit5_sit.transport.meanflow import meanflow_sample


def _pair(name: str = "ViT5G-T/4"):
    """The same weights read as a velocity (the raw network output) and as x-prediction."""
    v = _model(name)
    x = create_model(dataclasses.replace(v.cfg, x_prediction=True)).eval()
    x.load_state_dict(v.state_dict())
    return v, x


def test_the_velocity_is_the_predicted_data_point_minus_x_t_over_the_time_left():
    raw, model = _pair()
    (x, t, d), _, y = _inputs()
    t = torch.cat([t[:2], torch.tensor([0.99])])  # the last one past the floor: 1 - t = 0.01 < 0.05
    with torch.no_grad():
        x_hat = raw(x, t, y, interval=d)
        u = model(x, t, y, interval=d)
    gap = (1 - t).clamp_min(X_PRED_MIN_GAP).view(-1, 1, 1, 1)
    assert torch.allclose(u, (x_hat - x) / gap, atol=1e-6)
    assert torch.allclose(u[2], (x_hat[2] - x[2]) / X_PRED_MIN_GAP, atol=1e-5)  # finite at the data end


@pytest.mark.parametrize("steps", [1, 2])
def test_a_sample_is_the_network_output_at_its_last_step(steps):
    raw, model = _pair()
    noise = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        sample = meanflow_sample(model, noise, y, steps)
        before = noise  # where the last step starts, at t = 1 - 1 / steps
        if steps == 2:  # the first of two steps: length 1/2 from the noise
            before = noise + 0.5 * model(noise, torch.zeros(4), y, interval=torch.full((4,), 0.5))
        t_last = torch.full((4,), 1 - 1 / steps)
        x_hat = raw(before, t_last, y, interval=torch.full((4,), 1 / steps))
    assert torch.allclose(sample, x_hat, atol=1e-5)


def test_the_jvp_through_the_x_prediction_matches_finite_differences():
    _, m = _pair("ViT5G-T/4")
    (x, t, d), (tx, tt, td), y = _inputs()
    out, dout = m.jvp((x, t, d), (tx, tt, td), y)
    h = 1e-3
    up, down = (m(x + s * tx, t + s * tt, y, interval=d + s * td) for s in (h, -h))
    fd = (up - down) / (2 * h)
    assert dout.norm() > 1e-3 and (dout - fd).norm() / dout.norm() < 2e-3


def test_x_prediction_is_for_meanflow_models_only():
    with pytest.raises(ValueError, match="x_prediction=True .* needs mean_flow=True"):
        ModelConfig(x_prediction=True)
    with pytest.raises(ConfigError, match="x_prediction"):
        load_config("configs/mnist/vit5g.yaml", ["model.overrides.x_prediction=true"])
    with pytest.raises(ValueError, match="x_prediction=1: must be True or False"):
        ModelConfig(mean_flow=True, x_prediction=1)
    cfg = load_config("configs/mnist/convert-demo-imf-x.yaml")
    mcfg = cfg.model_config()
    assert mcfg.x_prediction and mcfg.mean_flow and mcfg.guidance_input


def test_a_converted_x_prediction_model_keeps_the_trunk_and_learns_the_head_again():
    flow, _ = load_for_sampling("demo")
    mcfg = dataclasses.replace(flow.cfg, mean_flow=True, guidance_input=True, x_prediction=True)
    torch.manual_seed(1)
    model = create_model(mcfg).eval()
    state, _ = flow_state("demo", mcfg)
    new = convert(model, state)
    assert set(X_PRED_HEAD) <= set(new)
    own = model.state_dict()
    assert all(own[k].abs().max() == 0 for k in X_PRED_HEAD)
    assert all(torch.equal(own[k], state[k]) for k in state if k not in X_PRED_HEAD)
    # At step 0 the one-step sample is the head's zero output (mid-grey), for every input: nothing of the flow
    # model's velocity head is read as a data point.
    noise = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert meanflow_sample(model, noise, torch.tensor([1, 2]), 1).abs().max() < 1e-6


def test_a_record_written_before_a_field_existed_holds_its_default():
    cfg = ModelConfig(depth=2)
    meta = weights_metadata(cfg)
    fields = json.loads(meta["vit5_sit_model_config"])
    del fields["x_prediction"]
    meta["vit5_sit_model_config"] = json.dumps(fields)
    recorded = recorded_fields(meta, "w.safetensors")
    assert recorded["x_prediction"] is False and recorded["depth"] == 2
    fields["unknown_field"] = 1  # a field the class does not know still counts (a disagreement)
    meta["vit5_sit_model_config"] = json.dumps(fields)
    assert recorded_fields(meta, "w.safetensors")["unknown_field"] == 1


def test_the_card_says_the_network_outputs_the_data_point():
    from vit5_sit.hub.api import meanflow_rows, meanflow_section

    cfg = load_config("configs/mnist/convert-demo-imf-x.yaml")
    rows = dict(meanflow_rows(cfg))
    assert rows["output"].startswith("x-prediction (pMF)")
    assert "outputs the **data point**" in " ".join(meanflow_section(cfg, []))
    plain = load_config("configs/mnist/convert-demo-imf.yaml")
    assert "output" not in dict(meanflow_rows(plain))
    assert "data point" not in " ".join(meanflow_section(plain, []))
