"""The experiment config: YAML + dotted overrides, unknown keys and bad values name the fix."""

from pathlib import Path

import pytest

from vit5_sit.config import ConfigError, load_config, save_config, with_overrides

ROOT = Path(__file__).parent.parent
# Experiment configs; configs/study/ holds study specs (python -m vit5_sit.study), tested in test_study.py.
CONFIGS = sorted(p for p in ROOT.glob("configs/**/*.yaml") if "study" not in p.relative_to(ROOT / "configs").parts)


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(p.parents[1])) for p in CONFIGS])
def test_shipped_configs_load(path):
    cfg = load_config(path)
    mcfg = cfg.model_config()
    assert mcfg.input_size * (8 if cfg.data.kind == "latents" else 1) == cfg.data.resolution


def test_overrides_apply_and_coerce():
    cfg = load_config(None, ["model.preset=ViT5-S/2", "model.rope=false", "train.lr=2e-4",
                             "train.grad_clip=1", "log.sample_classes=[1,2]", "model.layer_scale_init=none"])
    assert cfg.train.lr == pytest.approx(2e-4) and isinstance(cfg.train.grad_clip, float)
    assert cfg.log.sample_classes == [1, 2]
    m = cfg.model_config()
    assert m.rope is False and m.layer_scale_init is None and m.hidden_size == 384


def test_data_section_sets_model_input():
    cfg = load_config(None, ["data.kind=latents", "data.resolution=256", "model.preset=SiT-XL/2"])
    m = cfg.model_config()
    assert (m.input_size, m.in_channels) == (32, 4)


@pytest.mark.parametrize("kind", ["mnist", "digits"])
def test_digit_datasets_have_ten_classes(kind):
    # Every kind build_dataset reads is a valid data.kind; both digit exports have classes 0-9.
    m = load_config(None, [f"data.kind={kind}", "data.resolution=16"]).model_config()
    assert (m.num_classes, m.in_channels, m.input_size) == (10, 1, 16)


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1e-4", "Did you mean train.lr"),
    ("trian.lr=1e-4", "Did you mean train"),
    ("model.rop=false", "Did you mean model.rope"),
    ("model.preset=ViT5-XXL/2", "model.preset='ViT5-XXL/2': must be one of 'SiT-T/2'"),
    ("train.lr=fast", "expected a number"),
    ("train.max_steps=1.5", "expected an integer"),
    ("model.rope=maybe", "expected true or false"),
    ("train.mixed_precision=fp8", "must be one of"),
    ("model.norm=batchnorm", "norm"),
    ("data.kind=imagenet", "Did you mean 'images'"),
    ("model.class_dropout_prob=0 log.sample_cfg_scale=4", "log.sample_cfg_scale: cfg_scale=4 needs the null"),
    ("train.lr", "expected key=value"),
])
def test_bad_keys_and_values_name_the_fix(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, override.split(" "))


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.preset=ViT5-T/4", "model.num_registers=2", "name=abl"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again.model_config() == cfg.model_config()
    assert again.name == "abl"



def test_overrides_on_a_built_config_equal_the_saved_file_loaded_with_them(tmp_path):
    cfg = load_config("configs/mnist/vit5g.yaml")
    extra = ["log.sample_cfg_scale=2.5", "sampler.method=heun", "sampler.steps=9"]
    save_config(cfg, tmp_path / "config.yaml")
    assert with_overrides(cfg, extra) == load_config(tmp_path / "config.yaml", extra)
    assert with_overrides(cfg, []) is cfg
    for bad, message in (("sampler.steps=0", "sampler.steps"), ("sampler.nope=1", "nope"), ("x", "key=value")):
        with pytest.raises(ConfigError, match=message):
            with_overrides(cfg, [bad])
    assert cfg.sampler.steps != 9  # the config it was given is left as it was

def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_the_generation_preset_config_is_the_study_arm_it_came_from():
    """configs/mnist/vit5g.yaml (preset ViT5G-T/4) builds exactly the model of the study's vit5-nols arm, and
    the paper-faithful vit5.yaml still builds LayerScale 1e-4."""
    gen = load_config(ROOT / "configs/mnist/vit5g.yaml").model_config()
    assert gen == load_config(ROOT / "configs/mnist/vit5-nols.yaml").model_config()
    assert gen.layer_scale_init is None
    assert load_config(ROOT / "configs/mnist/vit5.yaml").model_config().layer_scale_init == 1e-4
    # SiTRoPE-T/4 (#28's preset) is the study's sit-rope arm: sit.yaml with model.rope=true, nothing else
    sit_rope = load_config(ROOT / "configs/mnist/sit-rope.yaml")
    assert sit_rope.model_config() == load_config(ROOT / "configs/mnist/sit.yaml", ["model.rope=true"]).model_config()
    assert sit_rope.model_config().rope and sit_rope.model_config().norm == "layernorm"


def test_base_file_is_read_first_and_merged_section_by_section(tmp_path):
    """``base:`` (relative to the file) gives every key of another config; this file's keys win, a section is
    merged key by key, and the overrides still come last."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "base.yaml").write_text(
        "name: base\nmodel:\n  preset: SiT-T/4\n  num_classes: 10\ntrain:\n  lr: 3.0e-4\n  max_steps: 50\n")
    (tmp_path / "mid.yaml").write_text("base: recipes/base.yaml\nname: mid\ntrain:\n  lr: 1.0e-4\n")
    (tmp_path / "top.yaml").write_text("base: mid.yaml\nmodel:\n  rope: true\n")
    cfg = load_config(tmp_path / "top.yaml", ["train.max_steps=7"])
    assert cfg.name == "mid" and cfg.train.lr == 1e-4 and cfg.train.max_steps == 7
    assert cfg.model.preset == "SiT-T/4" and cfg.model_config().rope and cfg.model_config().num_classes == 10


def test_the_shipped_configs_resolve_to_their_base_with_a_model():
    """The configs of one folder share its recipe: each differs from it in name and model only (vit5-repa adds
    REPA, vit5g-b2 is the shorter prepared run), so a change to the recipe is one edit."""
    import dataclasses

    for base, folder in (("sit.yaml", "mnist"), ("sit-xl2.yaml", "imagenet256")):
        recipe = load_config(ROOT / "configs" / folder / base)
        for path in sorted((ROOT / "configs" / folder).glob("*.yaml")):
            cfg = load_config(path)
            same = {"train": cfg.train if path.name != "vit5g-b2.yaml" else recipe.train,
                    "repa": cfg.repa if path.name != "vit5-repa.yaml" else recipe.repa}
            if path.name.startswith(("meanflow-", "imf-", "convert-")):  # MeanFlow and iMF recipes (from scratch;
                # a flow model converted, train.init_from): their objective, sampler and settings
                same = {"train": recipe.train, "sampler": recipe.sampler, "meanflow": recipe.meanflow,
                        "log": recipe.log}
            assert dataclasses.replace(cfg, name=recipe.name, model=recipe.model, **same) == recipe, path.name
        # The MeanFlow configs of a folder share one MeanFlow recipe, and the iMF ones one iMF recipe: each pair
        # differs in name and model only (the two backbones of one objective).
        for kind in ("meanflow", "imf"):
            pair = [load_config(p) for p in sorted((ROOT / "configs" / folder).glob(f"{kind}-*.yaml"))]
            if folder == "imagenet256" and kind == "imf":
                continue  # no ImageNet iMF run from scratch: configs/imagenet256/convert-sit-xl2-imf.yaml converts
            assert len(pair) == 2 and all(c.train.objective == "meanflow" for c in pair), (folder, kind)
            assert all(c.meanflow.variant == kind for c in pair), (folder, kind)
            assert dataclasses.replace(pair[1], name=pair[0].name, model=pair[0].model) == pair[0], (folder, kind)


@pytest.mark.parametrize("text, message", [
    ("base: 3\n", "base: expected the path of another config file"),
    ("base: ''\n", "base: expected the path of another config file"),
    ("base: missing.yaml\n", r"base file .*missing.yaml: not found; fix the base: key of .*c.yaml"),
    ("base: c.yaml\n", r"makes a loop .*c.yaml -> .*c.yaml"),
    ('base: "a\\0b.yaml"\n', "NUL"),
    ("base: list.yaml\n", "expected a mapping of sections"),
    ("base: .\n", "is a folder"),
])
def test_bad_base_is_one_error_naming_the_file(tmp_path, text, message):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "c.yaml")


def test_a_base_loop_through_two_files_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"a.yaml -> .*b.yaml -> .*a.yaml"):
        load_config(tmp_path / "a.yaml")


def test_base_is_not_an_override():
    with pytest.raises(ConfigError, match="base: is read from a config file"):
        load_config(ROOT / "configs/mnist/sit.yaml", ["base=vit5.yaml"])
