"""Issue #53: settings that would be silently ignored or silently accepted, refused where they enter.

- a resume compares every config key with the run's config.yaml except the few that may change (RESUME_FREE):
  meanflow.*, the objective, the optimizer, EMA, REPA's encoder and any key added later are fixed;
- a setting that the chosen objective never reads (transport.time_dist under MeanFlow, meanflow.* under flow) is
  one ConfigError naming it; the objective implies its sampler when it is set after the sampler section.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vit5_sit.config import OBJECTIVE_IGNORES, ConfigError, load_config, save_config, to_dict, with_overrides
from vit5_sit.train import preflight
from vit5_sit.train.preflight import RESUME_FREE, PreflightError, check_same_run, config_differences

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2", "data.resolution=8"]
MEANFLOW = ["train.objective=meanflow", "meanflow.guidance_scale=2"]


# ----------------------------------------------------------------------------------------------------------
# Resume: every key fixed but RESUME_FREE.

def _run_config(tmp_path: Path, overrides: list[str]) -> Path:
    path = tmp_path / "config.yaml"
    save_config(load_config(None, [*TINY, *overrides]), path)
    return path


@pytest.mark.parametrize("base, change", [
    (MEANFLOW, "meanflow.ratio=0.5"),                 # was accepted, and config.yaml rewritten
    (MEANFLOW, "meanflow.guidance_scale=3"),
    (MEANFLOW, "meanflow.time_mean=-0.4"),
    (MEANFLOW, "meanflow.adaptive_p=0"),
    ([], "train.objective=meanflow"),
    ([], "train.ema_decay=0.99"),
    ([], "train.beta2=0.95"),
    ([], "train.weight_decay=0.1"),
    ([], "train.grad_clip=1"),
    ([], "train.ema_warmup=true"),
    ([], "train.mixed_precision=bf16"),
    ([], "data.random_flip=false"),
    ([], "transport.time_dist=logit_normal"),
])
def test_a_resume_refuses_any_setting_that_changes_training(tmp_path, base, change):
    run_config = _run_config(tmp_path, base)
    before = run_config.read_bytes()
    with pytest.raises(PreflightError, match=f"{change.split('=')[0]}: .* in config.yaml, .* now"):
        check_same_run(load_config(None, [*TINY, *base, change]), run_config)
    assert run_config.read_bytes() == before


@pytest.mark.parametrize("change", ["train.lr=3e-4", "train.max_steps=99", "train.grad_accum=2", "log.every=7",
                                    "sampler.steps=3", "train.keep_last=1", "data.num_workers=1", "name=elsewhere"])
def test_a_resume_may_change_the_schedule_logging_and_paths(tmp_path, change):
    run_config = _run_config(tmp_path, [])
    check_same_run(load_config(None, [*TINY, change]), run_config)  # no error


def test_a_key_added_later_is_fixed_until_it_is_listed_as_free(monkeypatch):
    old, new = load_config(None, TINY), load_config(None, TINY)
    real = preflight.to_dict

    def with_new_key(cfg):
        out = real(cfg)
        out["newsection"] = {"knob": 1 if cfg is old else 2}
        return out

    monkeypatch.setattr(preflight, "to_dict", with_new_key)
    assert config_differences(old, new) == ["newsection.knob: 1 in config.yaml, 2 now"]
    assert config_differences(old, new, free=(*RESUME_FREE, "newsection")) == []


def test_every_free_key_names_a_real_setting():
    flat = preflight._flat(to_dict(load_config(None, TINY)))
    for free in RESUME_FREE:
        assert any(k == free or k.startswith(free + ".") for k in flat), f"RESUME_FREE: {free} is no config key"


# ----------------------------------------------------------------------------------------------------------
# Settings the objective never reads.

@pytest.mark.parametrize("objective, setting", [
    (MEANFLOW, "transport.time_dist=logit_normal"),
    (MEANFLOW, "transport.logit_normal_mean=0.5"),
    (MEANFLOW, "transport.logit_normal_std=2"),
    (MEANFLOW, "transport.train_eps=0.01"),
    (MEANFLOW, "transport.sample_eps=0.01"),
    ([], "meanflow.ratio=0.5"),
    ([], "meanflow.guidance_scale=2"),
    ([], "meanflow.guidance_interval=[0.2,1.0]"),
])
def test_a_setting_the_objective_never_reads_is_refused(objective, setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.*: no effect with train.objective=(flow|meanflow) \("):
        load_config(None, [*TINY, *objective, setting])


def test_the_ignored_settings_are_all_named_at_once_and_defaults_pass():
    with pytest.raises(ConfigError, match="transport.time_dist=logit_normal, transport.logit_normal_std=2.0: "):
        load_config(None, [*TINY, *MEANFLOW, "transport.time_dist=logit_normal", "transport.logit_normal_std=2"])
    load_config(None, [*TINY, *MEANFLOW, "transport.time_dist=uniform", "meanflow.ratio=0.5"])  # defaults: fine
    load_config(None, [*TINY, "transport.time_dist=logit_normal", "meanflow.ratio=0.25"])


def test_every_ignored_key_is_a_real_setting():
    flat = preflight._flat(to_dict(load_config(None, TINY)))
    for keys, why in OBJECTIVE_IGNORES.values():
        assert why
        for key in keys:
            assert any(k == key or k.startswith(key + ".") for k in flat), key


# ----------------------------------------------------------------------------------------------------------
# The objective implies its sampler when it is set after it.

def test_meanflow_on_a_flow_config_implies_the_meanflow_sampler():
    flow = load_config(ROOT / "configs/mnist/sit.yaml")
    assert (flow.sampler.mode, flow.sampler.method, flow.sampler.steps) == ("ode", "heun", 25)
    cfg = load_config(ROOT / "configs/mnist/sit.yaml", ["train.objective=meanflow"])
    assert (cfg.sampler.mode, cfg.sampler.method, cfg.sampler.steps) == ("meanflow", "euler", 1)
    two = load_config(ROOT / "configs/mnist/sit.yaml", ["train.objective=meanflow", "sampler.steps=2"])
    assert (two.sampler.mode, two.sampler.steps) == ("meanflow", 2)  # set with the objective: kept
    built = with_overrides(flow, ["train.objective=meanflow"])
    assert built.sampler.mode == "meanflow" and built.model_config().mean_flow


def test_a_sampler_given_with_or_after_the_objective_that_contradicts_it_is_one_error():
    with pytest.raises(ConfigError, match="sampler.mode=ode with train.objective=meanflow.*sampler.mode=meanflow "
                                          "sampler.method=euler sampler.steps=1"):
        load_config(ROOT / "configs/mnist/sit.yaml", ["train.objective=meanflow", "sampler.mode=ode"])
    with pytest.raises(ConfigError, match="sampler.mode=meanflow with train.objective=flow"):
        load_config(None, ["sampler.mode=meanflow"])


def test_a_file_that_sets_the_objective_over_its_bases_sampler(tmp_path):
    (tmp_path / "mf.yaml").write_text(f"base: {ROOT / 'configs/mnist/sit.yaml'}\ntrain:\n  objective: meanflow\n")
    cfg = load_config(tmp_path / "mf.yaml")
    assert (cfg.sampler.mode, cfg.sampler.method, cfg.sampler.steps) == ("meanflow", "euler", 1)
    (tmp_path / "both.yaml").write_text("train:\n  objective: meanflow\nsampler:\n  mode: sde\n")
    with pytest.raises(ConfigError, match="sampler.mode=sde with train.objective=meanflow"):
        load_config(tmp_path / "both.yaml")  # one file, both set: a contradiction, not a derivation


def test_the_shipped_configs_still_load():
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        if path.parent.name == "study":
            continue  # study files, not experiment configs
        load_config(path)
