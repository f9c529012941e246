"""``meanflow.shortcut``: a share of the batch at the whole interval, regressed on the network's own two-step sample."""

from __future__ import annotations

import pytest
import torch
from test_imf import _imf_model

from vit5_sit.train.objective import Batch, MeanFlowObjective, StepRng, Trainee
from vit5_sit.transport import Transport
from vit5_sit.transport.meanflow import (
    MeanFlowConfig,
    imf_target,
    meanflow_loss,
    meanflow_sample,
    shortcut_target,
    with_guidance,
)


def test_the_target_is_the_two_step_sample_as_an_average_velocity():
    model = _imf_model()
    g = torch.Generator().manual_seed(0)
    x0, y = torch.randn(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 3])  # 3: the null label
    guidance = torch.tensor([[2.5, 0.0, 1.0]]).expand(4, 3)
    with torch.no_grad():
        two_step = meanflow_sample(with_guidance(model, 2.5), x0, y, steps=2)
        one_step = meanflow_sample(with_guidance(model, 2.5), x0, y, steps=1)
    got = shortcut_target(model, x0, y, guidance)
    torch.testing.assert_close(x0 + got, two_step, rtol=0, atol=1e-6)
    assert (x0 + got - one_step).abs().max() > 1e-3  # not the one-step sample: the halves disagree with the whole


def test_the_draw_adds_whole_intervals_and_leaves_the_others_as_they_were():
    model = _imf_model()
    plain = MeanFlowObjective(Transport(), model.null_label, 0.1, MeanFlowConfig(variant="imf", ratio=0.5))
    cut = MeanFlowObjective(Transport(), model.null_label, 0.1,
                            MeanFlowConfig(variant="imf", ratio=0.5, shortcut=0.25))
    rng = StepRng(1, 2, 4096, slice(0, 4096))
    (t0, d0, n0, drop0, g0), (t1, d1, n1, drop1, g1) = plain.draw(rng, (1, 2, 2)), cut.draw(rng, (1, 2, 2))
    whole = (t1 == 0) & (d1 == 1)
    assert abs(whole.float().mean() - 0.25) < 0.03
    assert torch.equal(t1[~whole], t0[~whole]) and torch.equal(d1[~whole], d0[~whole])
    assert torch.equal(n1, n0) and torch.equal(drop1, drop0) and torch.equal(g1, g0)


def test_the_objective_regresses_whole_intervals_on_the_two_step_sample_and_the_rest_as_before():
    model = _imf_model()
    cfg = MeanFlowConfig(variant="imf", ratio=0.5, shortcut=0.5)
    objective = MeanFlowObjective(Transport(), model.null_label, 0.0, cfg)
    n = 16
    g = torch.Generator().manual_seed(3)
    x1, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    rng = StepRng(5, 7, n, slice(0, n))
    t, d, noise, _, guidance = objective.draw(rng, (1, 8, 8))
    whole = (t == 0) & (d == 1)
    assert whole.any() and (~whole).any()
    loss = objective(Trainee(model), Batch(x1, y), rng)["loss"]
    x_t, v = Transport().interpolate(noise, x1, t)
    target = torch.empty_like(x1)
    target[~whole] = imf_target(model, x_t[~whole], t[~whole], d[~whole], y[~whole], v[~whole], guidance[~whole],
                                model.null_label)
    target[whole] = shortcut_target(model, noise[whole], y[whole], guidance[whole])
    per_sample, _ = meanflow_loss(model(x_t, t, y, interval=d, guidance=guidance), target, cfg, flat=whole)
    torch.testing.assert_close(loss, per_sample.mean(), rtol=1e-5, atol=1e-7)


def test_the_stage_starts_at_its_step():
    model = _imf_model()
    plain = MeanFlowObjective(Transport(), model.null_label, 0.1, MeanFlowConfig(variant="imf", ratio=0.5))
    stage = MeanFlowObjective(Transport(), model.null_label, 0.1,
                              MeanFlowConfig(variant="imf", ratio=0.5, shortcut=0.5, shortcut_from=10))
    for step, whole_rows in ((9, False), (10, True)):
        rng = StepRng(1, step, 256, slice(0, 256))
        (t0, *_), (t1, d1, *_) = plain.draw(rng, (1, 2, 2)), stage.draw(rng, (1, 2, 2))
        assert bool(((t1 == 0) & (d1 == 1)).any()) == whole_rows
        assert torch.equal(t0, t1) != whole_rows


@pytest.mark.parametrize(("key", "value"), [("shortcut", -0.1), ("shortcut", 1.0), ("shortcut", "half"),
                                            ("shortcut_from", -1), ("shortcut_from", 1.5), ("shortcut_from", True)])
def test_a_bad_share_or_start_is_refused(key, value):
    with pytest.raises(ValueError, match=rf"meanflow.{key}="):
        MeanFlowConfig(variant="imf", **{key: value})


def test_the_card_names_the_stage():
    from pathlib import Path

    from vit5_sit.config import load_config
    from vit5_sit.hub.api import meanflow_rows

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "mnist" / "convert-demo-imf-xs.yaml")
    rows = dict(meanflow_rows(cfg))
    assert rows["shortcut"].startswith("25% of each batch from step 1,644 at the whole interval")


def test_a_run_may_be_continued_with_the_shortcut_switched_on():
    """configs/mnist/convert-demo-imf-xs.yaml continues convert-demo-imf-x.yaml's run (--resume its checkpoint):
    the shortcut share is a stage's setting; the objective's others still must match."""
    from pathlib import Path

    from vit5_sit.config import load_config
    from vit5_sit.train.preflight import config_differences

    configs = Path(__file__).resolve().parents[1] / "configs" / "mnist"
    base = load_config(configs / "convert-demo-imf-x.yaml")
    assert config_differences(base, load_config(configs / "convert-demo-imf-xs.yaml")) == []
    assert config_differences(base, load_config(configs / "convert-demo-imf-xs.yaml", ["meanflow.ratio=0.3"])) == [
        "meanflow.ratio: 0.5 in config.yaml, 0.3 now"]
