"""One source of truth per model folder (issue #53 item 2, `vit5_sit.hub.agreement`, `vit5_sit.hub.public`).

The files of a folder cannot disagree: config.yaml, transformer/config.json, the record in the weights' metadata,
the scheduler's config and model_index.json's guidance scale; a disagreement, weights that do not fit the model
and NaN / inf weights are one error through both doors (vit5-sit's loaders, and diffusers loading the folder's
own code in a Python where vit5_sit cannot be imported). ``demo export`` writes a new folder beside ``--out``,
checks it by loading it back and renames it into place: a bad source or a kill leaves ``--out`` as it was; nothing
it writes names a local path."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_diffusers_folder import run_without_package

from vit5_sit.common.utils import atomic_folder
from vit5_sit.config import load_config, save_config
from vit5_sit.demo.export import export_model
from vit5_sit.demo.export import main as export_main
from vit5_sit.hub import api as hub
from vit5_sit.hub.agreement import MODEL_CONFIG_KEY, disagreement
from vit5_sit.hub.components import Vit5SitTransformer2DModel
from vit5_sit.hub.model_files import ModelLoadError, check_model, load_for_sampling
from vit5_sit.hub.public import is_local_path, public_text
from vit5_sit.models import create_model
from vit5_sit.train.checkpoint import save_checkpoint

TINY = ["name=tiny-agree", "model.preset=ViT5-T/4", "model.depth=2", "model.hidden_size=64", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=3", "log.sample_cfg_scale=2.5"]
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"
FIX = "export the folder again"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _tiny_cfg(root: Path):
    """A tiny config whose paths are absolute paths of this machine (as a run made in a temporary folder has)."""
    return load_config(None, [*TINY, f"output_dir={root}/runs", f"data.path={root}/data/mnist8"])


def _tiny_model(cfg):
    torch.manual_seed(0)
    model = create_model(cfg.model_config())
    with torch.no_grad():  # a fresh model outputs zeros (adaLN-Zero): perturb it
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("agree")
    cfg = _tiny_cfg(root)
    out = root / "model"
    hub.PretrainedModel(_tiny_model(cfg), cfg).save_pretrained(out)
    return out


def _json_edit(name: str, **changes):
    def edit(folder: Path) -> None:
        path = folder / name
        data = json.loads(path.read_text())
        for key, value in changes.items():
            if value is ...:
                data.pop(key)
            else:
                data[key] = value
        path.write_text(json.dumps(data))
    return edit


def _weights_edit(change=None, metadata=None):
    def edit(folder: Path) -> None:
        path = folder / WEIGHTS
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        state = load_file(str(path))
        if change is not None:
            change(state)
        save_file(state, str(path), metadata=meta if metadata is None else metadata(meta))
    return edit


def _record(**changes):
    def metadata(meta):
        fields = json.loads(meta[MODEL_CONFIG_KEY])
        return {**meta, MODEL_CONFIG_KEY: json.dumps({**fields, **changes})}
    return metadata


def _nan(state):
    state["final_layer.linear.weight"][0, 0] = float("nan")


def _inf(state):
    state["blocks.0.attn.qkv.weight"][1, 1] = float("inf")


def _variant(folder: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "variant"
    shutil.copytree(folder, out)
    edit(out)
    return out


def test_the_derived_files_say_what_config_yaml_says(folder):
    cfg = load_config(folder / "config.yaml")
    model = json.loads((folder / "transformer" / "config.json").read_text())
    with safe_open(str(folder / WEIGHTS), "pt") as f:
        recorded = json.loads(f.metadata()[MODEL_CONFIG_KEY])
    import dataclasses

    assert recorded == {k: v for k, v in model.items() if not k.startswith("_")}
    assert disagreement(recorded, dataclasses.asdict(cfg.model_config()), "a", "b") is None
    load_for_sampling(folder)  # and both loaders take it
    assert Vit5SitTransformer2DModel.from_pretrained(folder / "transformer").cfg == cfg.model_config()


# Edits of one derived file, and the words of the one-line refusal by vit5-sit's loaders.
DISAGREEMENTS = {
    "depth": (_json_edit("transformer/config.json", depth=4), "transformer/config.json has depth=4 but config.yaml "
                                                              "has depth=2"),
    "heads": (_json_edit("transformer/config.json", num_heads=4), "num_heads=4"),   # the same weight shapes
    "dropped": (_json_edit("transformer/config.json", rope=...), "rope=False"),     # diffusers' default instead
    "steps": (_json_edit("scheduler/scheduler_config.json", steps=10), "steps=10 but config.yaml has steps=3"),
    "guidance": (_json_edit("model_index.json", guidance_scale=7.0), "guidance_scale=7.0 but config.yaml has "
                                                                     "guidance_scale=2.5"),
    "record": (_weights_edit(metadata=_record(depth=3)), "diffusion_pytorch_model.safetensors has depth=3"),
    "not-json": (lambda f: (f / "transformer" / "config.json").write_text("{depth: 4"), "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(DISAGREEMENTS))
def test_our_loaders_refuse_a_folder_whose_files_disagree(folder, tmp_path, case):
    edit, words = DISAGREEMENTS[case]
    bad = _variant(folder, tmp_path, edit)
    for load in (load_for_sampling, check_model, hub.PretrainedModel.from_pretrained):
        with pytest.raises(ModelLoadError) as e:
            load(bad)
        assert words in str(e.value) and FIX in str(e.value) and "\n" not in str(e.value), str(e.value)


# Weights that do not fit or are not finite, and the words of the refusal (both doors).
BAD_WEIGHTS = {
    "missing": (_weights_edit(lambda s: s.pop("final_layer.linear.bias")), "missing keys: final_layer.linear.bias"),
    "unexpected": (_weights_edit(lambda s: s.update(extra=torch.zeros(2))), "unexpected keys: extra"),
    "shape": (_weights_edit(lambda s: s.update({"final_layer.linear.bias": torch.zeros(3)})),
              "wrong shapes: final_layer.linear.bias (3,)"),
    "nan": (_weights_edit(_nan), "final_layer.linear.weight"),
    "inf": (_weights_edit(_inf), "blocks.0.attn.qkv.weight"),
    "truncated": (lambda f: (f / WEIGHTS).write_bytes((f / WEIGHTS).read_bytes()[:1000]),
                  "not a readable safetensors file"),
}


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_both_doors_refuse_weights_that_do_not_fit_or_are_not_finite(folder, tmp_path, case):
    edit, words = BAD_WEIGHTS[case]
    bad = _variant(folder, tmp_path, edit)
    with pytest.raises(ModelLoadError) as e:
        load_for_sampling(bad)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ModelLoadError) as e:  # the diffusers door, in this process: the class the folder carries
        Vit5SitTransformer2DModel.from_pretrained(bad / "transformer")
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_diffusers_door_refuses_a_config_json_that_is_not_the_weights_model(folder, tmp_path):
    bad = _variant(folder, tmp_path, _json_edit("transformer/config.json", num_heads=4))
    with pytest.raises(ModelLoadError, match=r"config.json has num_heads=4 but the record in "
                                             r"diffusion_pytorch_model.safetensors has num_heads=2; .*" + FIX):
        Vit5SitTransformer2DModel.from_pretrained(bad, subfolder="transformer")
    with pytest.raises(ModelLoadError, match="the model built has rope_base=100.0"):  # a keyword override, too
        Vit5SitTransformer2DModel.from_pretrained(folder / "transformer", rope_base=100.0)


OUTSIDE = textwrap.dedent("""
    from diffusers import DiffusionPipeline
    result = {}
    for folder in sys.argv[1:]:
        try:
            pipe = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
            result[os.path.basename(folder)] = "loaded"
        except Exception as e:
            result[os.path.basename(folder)] = f"{type(e).__name__}: {e}"
    print(json.dumps(result))
""")


@pytest.mark.slow
def test_diffusers_alone_refuses_what_our_loaders_refuse(folder, tmp_path):
    """The folder's own code, in a Python where vit5_sit cannot be imported: the same refusals, one line each (the
    other cases run in this process above, through the same class)."""
    cases = {"depth": DISAGREEMENTS["depth"][0], **{k: BAD_WEIGHTS[k][0] for k in ("missing", "nan")}}
    folders = []
    for name, edit in cases.items():
        out = tmp_path / name
        shutil.copytree(folder, out)
        edit(out)
        folders.append(str(out))
    folders.append(str(folder))
    proc = run_without_package(OUTSIDE, folders, tmp_path)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result[folder.name] == "loaded"
    want = {"depth": "config.json has depth=4 but the record in diffusion_pytorch_model.safetensors has depth=2",
            "missing": "missing keys: final_layer.linear.bias", "nan": "hold NaN or inf (final_layer.linear.weight)"}
    for name, words in want.items():
        assert result[name].startswith("ModelLoadError: ") and words in result[name], (name, result[name])
        assert "\n" not in result[name]


# ----------------------------------------------------------------------------------------------------------
# demo export: checked, atomic, no local path.

def _run(root: Path, edit=None) -> Path:
    """A run folder with one checkpoint (its config's paths absolute, under ``root``); ``edit(state)`` changes
    the EMA weights before they are saved."""
    cfg = _tiny_cfg(root)
    run = root / "run"
    run.mkdir(parents=True)
    save_config(cfg, run / "config.yaml")
    state = _tiny_model(cfg).state_dict()
    ema = {k: v.clone() for k, v in state.items()}
    if edit is not None:
        edit(ema)
    save_checkpoint(run, 10, state, ema, {"optimizer": {}})
    return run


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_publishes_no_local_path(tmp_path):
    run = _run(tmp_path)
    out = tmp_path / "exported"
    export_model(run, out, samples=False)
    local = str(tmp_path)
    leaks = [name for name, data in _tree(out).items() if local.encode() in data]
    assert leaks == []  # the weights' metadata, config.yaml, the card, the json files, the code
    cfg = load_config(out / "config.yaml")
    assert (cfg.output_dir, cfg.data.path) == ("runs", "mnist8")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no stage left beside it


@pytest.mark.parametrize(("text", "public"), [
    ("/home/me/runs", "runs"), ("~/data/x", "x"), ("C:\\Users\\me\\vae", "vae"), ("../../secret/vae", "vae"),
    ("data/mnist32", "data/mnist32"), ("stabilityai/sd-vae-ft-ema", "stabilityai/sd-vae-ft-ema"),
    ("timm:vit_small_patch14_dinov2.lvd142m", "timm:vit_small_patch14_dinov2.lvd142m"), ("linear", "linear"),
    ("eval_fid.py compare --reference /home/me/ref.npz --json=/tmp/x/m.json",  # a word of a command line
     "eval_fid.py compare --reference ref.npz --json=m.json"),
    ("see https://huggingface.co/me/x, a / b", "see https://huggingface.co/me/x, a / b")])
def test_a_local_path_is_published_as_its_last_part(text, public):
    assert public_text(text) == public
    if " " not in text:
        assert is_local_path(text) == (text != public)


BAD_SOURCES = {
    "missing": (lambda s: s.pop("final_layer.linear.bias"), "missing keys: final_layer.linear.bias"),
    "nan": (_nan, "NaN"),
}


@pytest.mark.parametrize("case", [*sorted(BAD_SOURCES), "truncated"])
def test_export_of_a_bad_source_is_one_line_and_leaves_the_destination_as_it_was(tmp_path, capsys, case):
    edit, words = BAD_SOURCES.get(case, (None, "not a readable safetensors file"))
    run = _run(tmp_path / "src", edit)
    if case == "truncated":
        weights = next(run.glob("checkpoints/step_*")) / "ema.safetensors"
        data = weights.read_bytes()[:500]
        weights.write_bytes(data)
        meta = json.loads((weights.parent / "meta.json").read_text())  # a valid checkpoint of broken weights
        import hashlib

        meta["files"]["ema.safetensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (weights.parent / "meta.json").write_text(json.dumps(meta))
    fresh = tmp_path / "fresh"
    assert export_main(["export", str(run), "--out", str(fresh), "--no-samples"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not fresh.exists()
    good = tmp_path / "good"
    export_model(_run(tmp_path / "other"), good, samples=False)
    before = _tree(good)
    assert export_main(["export", str(run), "--out", str(good), "--no-samples"]) == 2
    assert _tree(good) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good", "other", "src"]  # no stage left


def test_an_interrupted_export_leaves_the_old_destination_or_none(tmp_path, monkeypatch):
    run = _run(tmp_path / "src")
    out = tmp_path / "out"
    export_model(run, out, samples=False)
    before = _tree(out)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "write_diffusers_layout", killed)  # after the weights and config.yaml are written
    for dest in (out, tmp_path / "new"):
        with pytest.raises(KeyboardInterrupt):
            export_model(run, dest, samples=False, cfg_scale=4.0)
    assert _tree(out) == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_a_killed_export_is_cleaned_up_by_the_next(tmp_path):
    """A process killed mid-export (no Python cleanup) leaves its stage, or between the two renames the old folder
    aside: the next export for the same destination removes the stage and puts the old folder back first."""
    dead = 2**22 + 12345  # above the default pid_max: no such process
    out = tmp_path / "out"
    (tmp_path / f".out.new-{dead}-abc").mkdir()
    (tmp_path / f".out.old-{dead}-def").mkdir()
    (tmp_path / f".out.old-{dead}-def" / "config.yaml").write_text("old")
    with atomic_folder(out) as stage:
        assert (out / "config.yaml").read_text() == "old"  # put back before anything else
        (stage / "config.yaml").write_text("new")
    assert (out / "config.yaml").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_export_refuses_to_replace_a_folder_with_other_files(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / ".git").mkdir()
    assert export_main(["export", str(_run(tmp_path / "src")), "--out", str(out), "--no-samples"]) == 2
    err = capsys.readouterr().err
    assert "holds .git, notes.txt" in err and err.count("\n") == 1
    assert (out / "notes.txt").read_text() == "keep me"


def test_export_replaces_an_earlier_export_whole(tmp_path):
    run = _run(tmp_path / "src")
    out = tmp_path / "out"
    export_model(run, out, samples=False)
    (out / "samples.png").write_bytes(b"an older grid")  # a file this export does not write: not kept
    export_model(run, out, samples=False, cfg_scale=4.0)
    assert not (out / "samples.png").exists()
    assert load_config(out / "config.yaml").log.sample_cfg_scale == 4.0
    assert json.loads((out / "model_index.json").read_text())["guidance_scale"] == 4.0
    load_for_sampling(out)


def test_save_pretrained_refuses_weights_that_do_not_fit_their_config(tmp_path):
    cfg = _tiny_cfg(tmp_path)
    state = _tiny_model(cfg).state_dict()
    state.pop("final_layer.linear.bias")
    with pytest.raises(ModelLoadError, match="missing keys: final_layer.linear.bias"):
        hub.write_model_folder(tmp_path / "out", state, cfg)
    assert not (tmp_path / "out").exists()


def test_the_record_in_the_weights_is_kept_through_a_float16_export(folder, tmp_path):
    out = export_model(folder, tmp_path / "half", samples=False)
    with safe_open(str(out / WEIGHTS), "pt") as f:
        assert json.loads(f.metadata()[MODEL_CONFIG_KEY])["depth"] == 2
        assert "source" not in f.metadata()
    assert os.path.getsize(out / WEIGHTS) < os.path.getsize(folder / WEIGHTS)


def test_export_again_is_the_fix_unless_the_weights_say_they_are_another_model(folder, tmp_path, capsys):
    """A hand-edited derived file is written again from config.yaml; weights whose own record disagrees with
    config.yaml are refused (one line, nothing written)."""
    edited = _variant(folder, tmp_path, DISAGREEMENTS["heads"][0])
    fixed = export_model(edited, tmp_path / "fixed", samples=False)
    assert json.loads((fixed / "transformer" / "config.json").read_text())["num_heads"] == 2
    load_for_sampling(fixed)
    shutil.rmtree(edited)
    other = _variant(folder, tmp_path, _weights_edit(metadata=_record(num_heads=4)))
    assert export_main(["export", str(other), "--out", str(tmp_path / "o"), "--no-samples"]) == 2
    err = capsys.readouterr().err
    assert "the record in diffusion_pytorch_model.safetensors has num_heads=4 but config.yaml has num_heads=2" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()
    (tmp_path / "file").write_text("x")
    assert export_main(["export", str(folder), "--out", str(tmp_path / "file"), "--no-samples"]) == 2
    assert "is a file" in capsys.readouterr().err and (tmp_path / "file").read_text() == "x"
