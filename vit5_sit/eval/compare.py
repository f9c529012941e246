"""Compare runs checkpoint by checkpoint: FID / IS / precision / recall against training step.

For every saved checkpoint of every run, `compare_runs` samples the same images (same seeds, balanced
classes, the same sampler for all runs), evaluates them against one reference, and writes a markdown
table, a JSON file and a plot of FID against training step (one line per run, like the paper's curves).

Everything is cached under each run, so an interrupted or repeated comparison redoes nothing:
``RUN/eval/<settings>/step_0001000.npz`` holds the samples (resumable, see `vit5_sit.sampling.generate`), and
``step_0001000.metrics-<key>.json`` the metrics, keyed by the reference and the Inception weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vit5_sit.common.checks import guide_step
from vit5_sit.common.contract import metric_problem
from vit5_sit.common.utils import atomic_write_file, atomic_write_text
from vit5_sit.transport.samplers import FIXED_STEP_METHODS

from .errors import EvalError
from .evaluation import LazyInception, check_sizes, evaluate, parse_metrics, prepare_reference
from .inception import find_inception_weights
from .metrics import feature_statistics
from .sources import Reference, open_reference

TABLE_METRICS = ("fid", "sfid", "is", "precision", "recall")  # the papers' columns, in their order


class CompareError(EvalError):
    """A run folder or setting that cannot be compared; the message says which and why."""


@dataclass
class CompareSettings:
    """How each checkpoint is sampled and evaluated; the same for every run, so the numbers compare."""

    num_samples: int = 10_000               # images per checkpoint (FID-10K; the paper reports FID-50K)
    seed: int = 0                           # image i has seed `seed + i` in every run and checkpoint
    mode: str = "ode"                       # sampler: 'ode' | 'sde'
    method: str = "euler"
    steps: int = 50
    cfg_scale: float = 1.0                  # 1 = no guidance (the paper's scaling curves)
    guidance_interval: tuple[float, float] = (0.0, 1.0)
    guide: str | None = None                # autoguidance (cfg_scale: its weight): None = classifier-free;
                                            # 'auto' = each run's kept guide (train.guide_at); 'step:N' = each
                                            # run's checkpoint at step N; else a folder guiding every run
    metrics: tuple[str, ...] = TABLE_METRICS
    batch_size: int = 64                    # sampling: images per forward per process
    part_size: int = 256                    # sampling: images per resumable part file
    extra_sampler: dict = field(default_factory=dict)  # other SamplerConfig fields (atol, diffusion_form)

    def __post_init__(self) -> None:
        from vit5_sit.transport.guidance import GuidanceError, check_guidance_settings
        from vit5_sit.transport.rng import SeedError, check_seeds

        try:
            check_guidance_settings(self.cfg_scale, self.guidance_interval)
            check_seeds(self.seed, self.num_samples)
        except (GuidanceError, SeedError) as e:
            raise CompareError(str(e)) from None
        try:
            guide_step(self.guide or "")
        except ValueError as e:
            raise CompareError(f"guide {e}") from None

    def guide_path(self, run: Path) -> Path | None:
        """The guide of ``run``'s checkpoints (None: classifier-free guidance); CompareError when it is missing."""
        from vit5_sit.hub.model_files import ModelLoadError, kept_guide, local_model_path
        from vit5_sit.train.checkpoint import PREFIX, checkpoint_dir

        if self.guide is None:
            return None
        try:
            if self.guide == "auto":
                return kept_guide(run)
            if (step := guide_step(self.guide)) is not None:
                path = checkpoint_dir(run) / f"{PREFIX}{step:07d}"
                if not path.is_dir():
                    raise ModelLoadError(f"{run}: no checkpoint at step {step} to guide with ({path})")
                return path
            path = local_model_path(self.guide)
            if not path.exists():
                raise ModelLoadError(f"{path}: no such file or folder")
            return path
        except ModelLoadError as e:
            raise CompareError(f"guide: {e}") from None

    def sampler(self):
        from vit5_sit.transport import SamplerConfig

        try:
            return SamplerConfig(mode=self.mode, method=self.method, steps=self.steps, **self.extra_sampler)
        except (TypeError, ValueError) as e:
            raise CompareError(str(e)) from None

    def tag(self) -> str:
        """The cache folder name under RUN/eval/: every setting that changes the images."""
        parts = [f"n{self.num_samples}", f"seed{self.seed}", self.mode, self.method]
        if self.method in FIXED_STEP_METHODS:
            parts.append(f"{self.steps}steps")
        parts.append(f"cfg{self.cfg_scale:g}" if self.guide is None else f"auto{self.cfg_scale:g}")
        if self.guide is not None:  # 'auto' and 'step:N' name each run's own checkpoint; a folder by its path
            parts.append(self.guide.replace(":", "") if self.guide == "auto" or self.guide.startswith("step:")
                         else "guide-" + _short_hash(str(Path(self.guide).resolve())))
        if tuple(self.guidance_interval) != (0.0, 1.0):
            parts.append(f"gi{self.guidance_interval[0]:g}-{self.guidance_interval[1]:g}")
        if self.extra_sampler:
            parts.append(_short_hash(self.extra_sampler))
        return "_".join(parts)


def _short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _file_key(path: Path) -> dict:
    path = Path(path)
    if path.is_file():
        st = path.stat()
        return {"path": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return {"path": str(path.resolve())}


class Evaluator:
    """The Inception and the reference features, loaded once and only when some metric must be computed."""

    def __init__(self, reference: str | Path | Reference, metrics: tuple[str, ...], inception_weights: str | None,
                 device: str | None, batch_size: int, progress: bool,
                 pr_mode: str = "adm") -> None:  # precision/recall: ADM's float16 distances, or 'exact'
        self.reference_arg, self.metrics, self.pr_mode = reference, metrics, pr_mode
        self.inception_weights, self.device, self.progress = inception_weights, device, progress
        self.batch_size = batch_size
        self._net, self._reference = LazyInception(None, inception_weights, device), None
        location = find_inception_weights(inception_weights)
        ref_path = Path(reference) if isinstance(reference, str | Path) else None
        self.key = {
            "reference": _file_key(ref_path) if ref_path is not None else str(reference),
            "inception": str(location.path or location.url),
            "metrics": list(metrics),
        }
        if "precision" in metrics or "recall" in metrics:  # cached values of the other mode are not these
            self.key["pr_mode"] = pr_mode

    def inception(self):
        return self._net.get()

    def reference(self) -> Reference:
        """The reference with its features (and sFID statistics) computed once, not once per checkpoint, when
        it has images only."""
        if self._reference is None:
            ref = open_reference(self.reference_arg)
            ready = prepare_reference(ref, self.metrics, self._net, self.batch_size, progress=self.progress)
            if ready is not ref:  # computed from images: keep the features and statistics, not the images
                mu, sigma = (ref.mu, ref.sigma) if ref.mu is not None else feature_statistics(ready.features)
                ready = Reference(ref.description, mu, sigma, features=ready.features,
                                  inception_weights=self.inception().describe(), mu_s=ready.mu_s,
                                  sigma_s=ready.sigma_s)
            self._reference = ready
        return self._reference

    def __call__(self, samples: Path) -> dict:
        return evaluate(samples, self.reference(), self.metrics, inception=self.inception(),
                        batch_size=self.batch_size, progress=self.progress, pr_mode=self.pr_mode)


def run_sampler(runs, mode: str | None = None, method: str | None = None, steps: int | None = None):
    """The sampler of a comparison: the first run's configured sampler (as sample.py uses for that run) with
    the --sampler/--method/--steps flags applied. Returns (SamplerConfig, where it came from)."""
    from vit5_sit.config import ConfigError, load_config
    from vit5_sit.sampling.generate import sampler_settings

    configs = []
    for run in (_local_run(r)[0] for r in runs):
        if not run.is_dir():
            raise CompareError(_not_a_run(run))
        if not (run / "config.yaml").is_file():
            raise CompareError(f"{run}: not a run folder (no config.yaml); give the folder that train.py wrote")
        try:
            configs.append(load_config(run / "config.yaml").sampler)
        except ConfigError as e:
            raise CompareError(f"{run / 'config.yaml'}: {e}") from None
    kinds = {c.mode == "meanflow" for c in configs}
    if len(kinds) > 1:  # one sampler serves every run of a comparison
        one = [str(r) for r, c in zip(runs, configs) if c.mode == "meanflow"]
        raise CompareError(f"{', '.join(one)}: MeanFlow model(s) beside flow models; a comparison samples every run "
                           "with one sampler, and the two kinds take different ones: compare them in two calls")
    try:
        sampler = sampler_settings(configs[0], mode, method, steps)
    except ValueError as e:
        raise CompareError(f"--sampler/--method/--steps: {e}") from None
    if (sampler.mode == "meanflow") not in kinds:
        what = "MeanFlow models" if sampler.mode != "meanflow" else "flow models"
        raise CompareError(f"--sampler {sampler.mode}: the runs are {what}; leave --sampler out (their config's "
                           "sampler) or give " + ("--sampler meanflow" if what == "MeanFlow models" else "ode or sde"))
    flags = [f for f, v in (("--sampler", mode), ("--method", method), ("--steps", steps)) if v is not None]
    source = f"{Path(runs[0]) / 'config.yaml'}" + (f" with {', '.join(flags)}" if flags else "")
    if any(c != configs[0] for c in configs[1:]) and len(flags) < 3:
        source += "; the runs configure different samplers, the first one's is used for all"
    return sampler, source


def _local_run(spec) -> tuple[Path, str | None]:
    """(folder, Hub repo id or None): a Hub repo id that is not a local path is downloaded (or found in
    the cache) as a model folder."""
    from vit5_sit.hub.files import parse_repo_spec, resolve_model_path
    from vit5_sit.hub.model_files import ModelLoadError

    if Path(spec).exists() or parse_repo_spec(str(spec)) is None:
        return Path(spec), None
    try:
        return resolve_model_path(spec), str(spec)
    except ModelLoadError as e:
        raise CompareError(str(e)) from None


def _is_model_folder(path: Path) -> bool:
    """An exported model (config.yaml beside its weights, no checkpoints/): one checkpoint at its step."""
    return (path / "config.yaml").is_file() and not (path / "checkpoints").is_dir() and any(
        (path / name).is_file() for name in ("ema.safetensors", "model.safetensors",
                                             "transformer/diffusion_pytorch_model.safetensors"))


def _not_a_run(run: Path) -> str:
    if run.exists():  # a file: an official .pt, a reference .npz, ...
        return (f"{run}: is a file, not a run folder; compare takes run folders, model folders or Hub repo ids (an "
                "official .pt file samples with sample.py --ckpt FILE)")
    return f"{run}: no such run folder"


def _run_checkpoints(run: Path, log, every: int | None = None) -> list:
    from vit5_sit.config import load_config
    from vit5_sit.train.checkpoint import Checkpoint, CheckpointError, list_checkpoints, verify_checkpoint

    if not run.is_dir():
        raise CompareError(_not_a_run(run))
    if not (run / "config.yaml").is_file():
        raise CompareError(f"{run}: not a run folder (no config.yaml); give the folder that train.py wrote, "
                           "a model folder or a Hub repo id")
    if _is_model_folder(run):  # its config's train.max_steps is the step of these weights (see demo export)
        return [Checkpoint(load_config(run / "config.yaml").train.max_steps, run)]
    found = []
    for ckpt in list_checkpoints(run):
        try:
            verify_checkpoint(ckpt.path)
        except CheckpointError as e:
            log(f"warning: skipping {ckpt.path}: {e}")
            continue
        found.append(ckpt)
    if not found:
        raise CompareError(f"{run}: no valid checkpoints in {run / 'checkpoints'}")
    if every:
        kept = [c for c in found if c.step % every == 0]
        if not kept:
            raise CompareError(f"--every {every}: no checkpoint of {run} is at a multiple of {every} (it has steps "
                               f"{', '.join(str(c.step) for c in found)})")
        found = kept
    return found


def compare_runs(runs, reference, out_dir, settings: CompareSettings | None = None, *,
                 inception_weights=None,          # Inception weights file; None searches (see eval.inception)
                 device=None,                     # None: this process's device
                 inception_batch_size: int = 64,  # images per Inception forward
                 progress: bool = True,
                 log=print,
                 every: int | None = None,        # only checkpoints at multiples of this step
                 pr_mode: str = "adm",            # precision/recall: ADM's float16 distances, or 'exact'
                 ) -> list[dict]:
    """Evaluate every checkpoint of every run (or those at multiples of ``every``); write compare.md,
    compare.json and fid_vs_step.png. A model folder or Hub repo id counts as a run of one checkpoint (at
    its config's ``train.max_steps``), its samples cached under ``out_dir/eval/``.

    Collective under `accelerate launch`: the processes share the sampling; the main process evaluates
    and writes. Returns the rows (run, run_dir, step, metrics, skipped), also on the other processes
    (without metrics there).
    """
    import torch

    from vit5_sit.common import distributed as dist
    from vit5_sit.config import load_config
    from vit5_sit.hub.model_files import ModelLoadError, check_model

    settings = settings or CompareSettings()
    metrics = parse_metrics(settings.metrics)
    settings.sampler()  # a bad sampler setting fails here, before any work
    if not runs:
        raise CompareError("no runs given")
    repo_of = dict(_local_run(r) for r in runs)  # local folder -> Hub repo id (None: a local path)
    runs = list(repo_of)
    names = {run: repo_of[run] or name for run, name in _run_names(runs).items()}
    plan = [(run, names[run], _run_checkpoints(run, log, every)) for run in runs]
    for _, _, checkpoints in plan:  # weights of a wrong dtype or shape, NaN, inf: refused before any sampling
        for ckpt in checkpoints:
            try:
                check_model(ckpt.path)
            except ModelLoadError as e:
                raise CompareError(str(e)) from None
    # Metrics that mean nothing at these sizes are refused before any sampling (on every process alike).
    for warning in check_sizes(metrics, settings.num_samples, open_reference(reference)):
        if dist.is_main():
            log(f"warning: {warning}")
    evaluator = None
    if dist.is_main():
        evaluator = Evaluator(reference, metrics, inception_weights, device, inception_batch_size, progress,
                              pr_mode)
    device = torch.device(device) if device is not None else dist.device()

    rows = []
    for run, name, checkpoints in plan:
        cfg = load_config(run / "config.yaml")
        # A model folder (a Hub snapshot: not ours to write into) keeps its cache under the output folder.
        cache = Path(out_dir) / "eval" / name.replace("/", "--") if _is_model_folder(run) else None
        for ckpt in checkpoints:
            rows.append(evaluate_checkpoint(run, name, cfg, ckpt, settings, evaluator, device=device,
                                            progress=progress, log=log, cache=cache, shown_as=repo_of[run]))
    if dist.is_main():
        write_outputs(rows, Path(out_dir), settings, evaluator.key)
    dist.barrier()
    return rows


def evaluate_checkpoint(run: Path, name: str, cfg, ckpt, settings: CompareSettings, evaluator: Evaluator | None,
                        *, device, progress: bool = True, log=print,
                        cache: Path | None = None,     # where the samples are cached; None = RUN/eval
                        shown_as: str | None = None,   # the row's run_dir (a Hub repo id); None = the folder
                        cached_only: bool = False,     # compute nothing: None unless samples and metrics are cached
                        ) -> dict | None:
    """Sample one checkpoint (cached in RUN/eval/<settings>/) and, on the main process, its metrics (cached).

    The row: run, run_dir, step, samples (the .npz), and the metrics on the main process. With
    ``cached_only``, None when the samples or the metrics are not cached yet (nothing is sampled or scored).
    """
    from vit5_sit.common import distributed as dist
    from vit5_sit.hub.model_files import load_for_sampling, model_identity, model_vae
    from vit5_sit.sampling.generate import manifest_path, npz_is_complete, sample_to_npz, sampling_manifest
    from vit5_sit.transport import Transport

    sampler = settings.sampler()
    samples = (cache or run / "eval") / settings.tag() / f"{ckpt.path.name}.npz"
    options = dict(num_samples=settings.num_samples, seed=settings.seed, cfg_scale=settings.cfg_scale,
                   guidance_interval=tuple(settings.guidance_interval),
                   vae=model_vae(ckpt.path, cfg) if cfg.data.kind == "latents" else None,  # a folder's vae/ first
                   identity=model_identity(ckpt.path), part_size=settings.part_size,
                   batch_size=settings.batch_size)
    guide = settings.guide_path(run)
    guide_identity = None if guide is None else model_identity(guide)
    manifest = sampling_manifest(cfg.model_config(), cfg.transport, sampler, guide=guide_identity, **options)
    if cached_only:
        if not npz_is_complete(samples, manifest):
            return None
        metrics = _cached_metrics(samples, manifest_path(samples), evaluator, log, compute=False)
        if metrics is None:
            return None
        return {"run": name, "run_dir": shown_as or str(run), "step": ckpt.step, "samples": str(samples), **metrics}
    if dist.is_main():
        log(f"{name} step {ckpt.step}: {samples}")
    if not npz_is_complete(samples, manifest):  # else cached: no need to load the model
        model, _ = load_for_sampling(ckpt.path, device=device)
        if guide is not None:
            from vit5_sit.transport import GuidanceError, check_guide

            options["guide"], guide_cfg = load_for_sampling(guide, device=device)
            options["guide_identity"] = guide_identity
            try:
                check_guide(model.cfg, options["guide"].cfg, cfg.transport,
                            guide_cfg.transport if guide_cfg is not None else None)
            except GuidanceError as e:
                raise CompareError(f"{name} step {ckpt.step}: guide {guide}: {e}") from None
        from vit5_sit.transport.guidance import GuidanceError, check_second_guidance, trained_guidance

        try:  # a model with guidance trained in takes none on top (sample_to_npz holds the same rule)
            check_second_guidance(trained_guidance(cfg), options.get("cfg_scale", 1.0), options.get("guide"))
        except GuidanceError as e:
            raise CompareError(f"{name} step {ckpt.step}: {e}") from None
        sample_to_npz(model, Transport(cfg.transport), sampler, samples, progress=progress, device=device,
                      trained_guidance=trained_guidance(cfg), **options)
        del model
    row = {"run": name, "run_dir": shown_as or str(run), "step": ckpt.step, "samples": str(samples)}
    if dist.is_main():
        row.update(_cached_metrics(samples, manifest_path(samples), evaluator, log))
    return row


def _cached_metrics(samples: Path, manifest: Path, evaluator: Evaluator, log, compute: bool = True) -> dict | None:
    key = {**evaluator.key, "samples": hashlib.sha256(manifest.read_bytes()).hexdigest()}
    path = samples.with_name(f"{samples.stem}.metrics-{_short_hash(key)}.json")
    if path.is_file():
        try:
            cached = json.loads(path.read_bytes())
        except (OSError, ValueError):  # damaged: computed again
            cached = None
        if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("result"), dict) \
                and not any(metric_problem(k, v) for k, v in cached["result"].items()):  # a negative FID: damaged
            return cached["result"]
    if not compute:
        return None
    result = evaluator(samples)
    keep = {k: result[k] for k in (*TABLE_METRICS, "is_std", "kid", "kid_std", "pr_mode", "num_samples",
                                   "num_reference", "inception_weights", "skipped") if k in result}
    atomic_write_text(path, json.dumps({"key": key, "result": keep}, indent=1))
    log("  " + ", ".join(f"{m} {keep[m]:.4g}" for m in TABLE_METRICS if m in keep))
    return keep


def _run_names(runs: list[Path]) -> dict[Path, str]:
    """Folder names, or longer paths where two runs share a folder name."""
    names = {}
    for run in runs:
        name = run.name or str(run)
        if sum(r.name == run.name for r in runs) > 1:
            name = str(run)
        names[run] = name
    return names


# ----------------------------------------------------------------------------------------------------------
# Outputs.

def _fmt(row: dict, metric: str) -> str:
    value = row.get(metric)
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if metric == "is" and "is_std" in row:
        return f"{value:.2f} ± {row['is_std']:.2f}"
    return f"{value:.2f}" if metric in ("fid", "sfid", "is") else f"{value:.3f}"


def _shown_path(path: str) -> str:
    """A path as the outputs show it: relative to the working folder, or from site-packages, when it can be."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    return str(Path(*p.parts[p.parts.index("site-packages"):])) if "site-packages" in p.parts else path


def _shown_key(key: dict) -> dict:
    ref = key["reference"]
    ref = {**ref, "path": _shown_path(ref["path"])} if isinstance(ref, dict) else ref
    return {**key, "reference": ref, "inception": _shown_path(key["inception"])}


def format_table(rows: list[dict], settings: CompareSettings, key: dict) -> str:
    """The markdown of compare.md: settings, one table row per (run, step), notes on n/a metrics."""
    shown = [m for m in TABLE_METRICS if m in settings.metrics]
    key = _shown_key(key)
    labels = {"fid": "FID", "sfid": "sFID", "is": "IS", "precision": "precision", "recall": "recall"}
    s = settings
    interval = tuple(s.guidance_interval)
    guided = f", guidance interval {list(interval)}" if interval != (0.0, 1.0) else ""
    steps = f" {s.steps} steps" if s.method in FIXED_STEP_METHODS else ""
    ref = key["reference"]["path"] if isinstance(key["reference"], dict) else key["reference"]
    lines = [
        "# Runs compared checkpoint by checkpoint",
        "",
        f"{s.num_samples} samples per checkpoint (seeds {s.seed}..{s.seed + s.num_samples - 1}, classes "
        f"balanced); sampler {s.mode}/{s.method}{steps}, cfg scale {s.cfg_scale:g}{guided}.",
        f"Reference: {ref}; Inception weights: {key['inception']}.",
        "",
        "| run | step | " + " | ".join(labels[m] for m in shown) + " |",
        "|---|---:|" + "---:|" * len(shown),
    ]
    for row in rows:
        lines.append(f"| {row['run']} | {row['step']} | " + " | ".join(_fmt(row, m) for m in shown) + " |")
    notes = {}
    for row in rows:
        for metric, reason in row.get("skipped", {}).items():
            notes.setdefault(metric, reason)
    if notes:
        lines.append("")
        for metric, reason in notes.items():
            lines.append(f"- {labels.get(metric, metric)} n/a: {reason}")
    return "\n".join(lines) + "\n"


def plot_fid(rows: list[dict], path: Path, title: str) -> None:
    """FID against training step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name in dict.fromkeys(r["run"] for r in rows):
        points = sorted((r["step"], r["fid"]) for r in rows if r["run"] == name and r.get("fid") is not None)
        if points:
            steps, fids = zip(*points)
            ax.plot(steps, fids, marker="o", label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel("FID")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_write_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_outputs(rows: list[dict], out_dir: Path, settings: CompareSettings, key: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    table = format_table(rows, settings, key)
    atomic_write_text(out_dir / "compare.md", table)
    shown = _shown_key(key)
    payload = {"settings": dataclasses.asdict(settings), "reference": shown["reference"],
               "inception": shown["inception"], "rows": rows}
    atomic_write_text(out_dir / "compare.json", json.dumps(payload, indent=1, default=_json_default) + "\n")
    title = (f"FID-{settings.num_samples}, {settings.mode}/{settings.method}"
             + (f" {settings.steps} steps" if settings.method in FIXED_STEP_METHODS else "")
             + f", cfg {settings.cfg_scale:g}")
    plot_fid(rows, out_dir / "fid_vs_step.png", title)
    print(table)
    print(f"wrote {out_dir / 'compare.md'}, {out_dir / 'compare.json'} and {out_dir / 'fid_vs_step.png'}")


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
