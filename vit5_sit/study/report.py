"""A study's results: mean ± standard deviation over training seeds per arm and checkpoint, the sampling noise
beside it, the FID-vs-step plot with error bands, and one sample grid per arm.

A cell with fewer seeds than the arm asks for says so ("2/3 seeds, missing s2"): partial results are never
averaged silently as if they were complete.

The committed ``study.json`` is the durable record: the run folders (checkpoints, evaluation caches) stay out of
git and may be gone (a new machine, a cleaned disk), so a report keeps every score of the earlier ``study.json``
that the evaluations at hand do not redo, provided it was made under the same evaluation settings (sampler,
sample count, reference; each row carries its own sample seed and guidance scale, and a row of an earlier file
without a guidance scale was scored at that file's ``eval.cfg_scale``). A metric added to the study later (sFID,
digit accuracy) is simply absent from the earlier rows, and the tables say "not measured" for them.

Every table, the component table, the sampling noise and the decision are given per guidance scale
(``eval.cfg_scales``: unguided and guided are decided separately).

Beside the sds, FID gets 95% intervals over training seeds (`vit5_sit.study.intervals`): a percentile bootstrap
(fixed seed, so the report is reproducible) and the t-interval, for each arm's mean, for each component's paired
change, and for the decision's comparisons, with the bootstrap probability of the ordering in plain words.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from vit5_sit.common.contract import metric_problem
from vit5_sit.common.utils import atomic_write_file, atomic_write_text

from . import intervals as iv
from .spec import StudyError, StudySpec

_KEY = ("arm", "seed", "step", "sample_seed", "cfg_scale")  # one evaluation
KEPT = "kept_from"  # the row field that marks a score taken from the earlier study.json
METRIC_LABELS = {"fid": "FID", "sfid": "sFID", "precision": "precision", "recall": "recall", "is": "IS",
                 "kid": "KID", "digit_accuracy": "digit accuracy"}
_DIGITS = {"fid": 1, "sfid": 1, "is": 2}  # decimals shown; 3 for the others (shares, KID)
# The evaluation settings a saved score depends on besides its own row's sample seed and guidance scale: scores
# made under others are not mixed in. (The metric list is not one: a metric added later is absent from old rows.)
SCORE_SETTINGS = ("num_samples", "mode", "method", "steps", "reference_data")  # the guide: checked per row


def row_cfg(spec: StudySpec, row: dict) -> float:
    """The guidance scale a row was scored at (a row without one: the study's first scale)."""
    return float(row.get("cfg_scale", spec.eval.cfg_scales[0]))


def guidance_label(scale: float, guide: str | None = None) -> str:
    """The report's name of a guidance scale; ``guide``: the study's autoguidance guide (`StudySpec.guide_text`)."""
    if scale == 1:
        return "unguided (cfg 1)"
    return f"guided (cfg {scale:g})" if guide is None else f"autoguided (weight {scale:g}, guide {guide})"


def _scale(spec: StudySpec, cfg_scale: float | None) -> float:
    return spec.eval.cfg_scales[0] if cfg_scale is None else float(cfg_scale)


def _main_rows(spec: StudySpec, rows: list[dict], scale: float) -> list[dict]:
    """The rows of the main sample seed at one guidance scale: the training-seed scores."""
    return [r for r in rows if r["sample_seed"] == spec.eval.sample_seed and row_cfg(spec, r) == scale]


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1 in the denominator; None for one value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else None)


def aggregate(spec: StudySpec, rows: list[dict], metric: str = "fid", cfg_scale: float | None = None) -> list[dict]:
    """One entry per (arm, step) at one guidance scale (default: the first): mean, sd, n over training seeds (main
    sample seeds only), the missing seeds and the ``unmeasured`` ones (scored, but before the metric was added)."""
    scale = _scale(spec, cfg_scale)
    mine = _main_rows(spec, rows, scale)
    out = []
    for arm in spec.arms:
        for step in spec.steps:
            cell = [r for r in mine if r["arm"] == arm.name and r["step"] == step]
            by_seed = {r["seed"]: r[metric] for r in cell if _finite(r.get(metric))}
            unmeasured = {r["seed"] for r in cell if r.get(metric) is None}
            values = [by_seed[s] for s in arm.seeds if s in by_seed]
            entry = {"arm": arm.name, "label": arm.label, "step": step, "metric": metric, "cfg_scale": scale,
                     "n": len(values), "of": len(arm.seeds), "seeds": [s for s in arm.seeds if s in by_seed],
                     "missing": [s for s in arm.seeds if s not in by_seed and s not in unmeasured],
                     "unmeasured": [s for s in arm.seeds if s in unmeasured and s not in by_seed], "values": values,
                     "mean": None, "sd": None}
            if values:
                entry["mean"], entry["sd"] = mean_sd(values)
            out.append(entry)
    return out


def mean_intervals(spec: StudySpec, rows: list[dict], cfg_scale: float | None = None) -> list[dict]:
    """Per (arm, step) at one guidance scale: the mean FID over training seeds with its 95% percentile bootstrap
    and t-intervals (None below 2 seeds), and how many distinct resamples the bootstrap has."""
    return [{"arm": a["arm"], "step": a["step"], "cfg_scale": a["cfg_scale"], "n": a["n"], "mean": a["mean"],
             "bootstrap": iv.bootstrap_interval(a["values"]), "t": iv.t_interval(a["values"]),
             "distinct": iv.distinct_resamples(a["n"])} for a in aggregate(spec, rows, "fid", cfg_scale)]


def sampling_noise(spec: StudySpec, rows: list[dict], metric: str = "fid",
                   cfg_scale: float | None = None) -> list[dict]:
    """Per (arm, step) at one guidance scale: the same checkpoints scored with two sets of sample seeds; the
    pooled per-estimate standard deviation sqrt(mean(d^2) / 2) of their differences d."""
    out = []
    if spec.eval.noise_seed is None:
        return out
    scale = _scale(spec, cfg_scale)
    for arm in spec.arms:
        for step in spec.steps:
            pairs = []
            for seed in arm.seeds:
                got = {r["sample_seed"]: r.get(metric) for r in rows
                       if r["arm"] == arm.name and r["seed"] == seed and r["step"] == step
                       and row_cfg(spec, r) == scale}
                a, b = got.get(spec.eval.sample_seed), got.get(spec.eval.noise_seed)
                if _finite(a) and _finite(b):
                    pairs.append((seed, a, b))
            if pairs:
                d = np.array([a - b for _, a, b in pairs])
                out.append({"arm": arm.name, "step": step, "cfg_scale": scale, "pairs": pairs,
                            "sd": float(np.sqrt(np.mean(d**2) / 2))})
    return out


def base_arm(spec: StudySpec, arm) -> str | None:
    """The arm another arm changes: the one with the same config and no overrides (None for such an arm itself,
    or when the study has no plain arm of that config)."""
    if not arm.overrides:
        return None
    return next((a.name for a in spec.arms if a.config == arm.config and not a.overrides), None)


def component_deltas(spec: StudySpec, rows: list[dict], metric: str = "fid",
                     cfg_scale: float | None = None) -> list[dict]:
    """Per (arm with overrides, step): the change against its base arm (`base_arm`), paired by training seed:
    d_s = metric(arm, seed s) - metric(base, seed s) over the seeds both have scored (main sample seed), with
    the mean and sample sd of the d_s, their 95% bootstrap and t-intervals and ``p_lower``, the share of
    bootstrap resamples in which the arm's FID is the lower (ties half). An ablation with fewer seeds than its
    base is so compared on its own seeds, not against the base's mean over others; and where the seed fixes the
    data order and noise draws of both runs, pairing also takes out the part of the seed-to-seed spread the two
    share. Seeds the base lacks are named. At one guidance scale (default: the first)."""
    scored = _main_rows(spec, rows, _scale(spec, cfg_scale))

    def scores(name: str, step: int) -> dict[int, float]:
        return {r["seed"]: float(r[metric]) for r in scored
                if r["arm"] == name and r["step"] == step and _finite(r.get(metric))}

    out = []
    for arm in spec.arms:
        base = base_arm(spec, arm)
        if base is None:
            continue
        for step in spec.steps:
            mine, theirs = scores(arm.name, step), scores(base, step)
            shared = [s for s in arm.seeds if s in mine and s in theirs]
            diffs = [(s, mine[s] - theirs[s]) for s in shared]
            entry = {"arm": arm.name, "base": base, "step": step, "diffs": diffs, "mean": None, "sd": None,
                     "unpaired": [s for s in arm.seeds if s in mine and s not in theirs],
                     "bootstrap": None, "t": None, "p_lower": None}
            if diffs:
                entry["mean"], entry["sd"] = mean_sd([d for _, d in diffs])
            if len(diffs) > 1:  # one seed: nothing to resample
                paired = iv.compare({s: mine[s] for s in shared}, {s: theirs[s] for s in shared})
                entry.update(bootstrap=paired.interval, t=iv.t_interval([d for _, d in diffs]),
                             p_lower=paired.p_ahead)
            out.append(entry)
    return out


def _delta_cell(entry: dict) -> str:
    if entry["mean"] is None:
        return "pending"
    text = f"{entry['mean']:+.1f}"
    if entry["sd"] is not None:
        text += f" ± {entry['sd']:.1f}"
    text += f" ({len(entry['diffs'])} seed{'s' if len(entry['diffs']) > 1 else ''})"
    if entry["unpaired"]:
        text += f"; base lacks {', '.join(f's{s}' for s in entry['unpaired'])}"
    return text


def _span(interval: tuple[float, float] | None, sign: str = "") -> str:
    return f"[{interval[0]:{sign}.1f}, {interval[1]:{sign}.1f}]"


def _seeds_note(n: int) -> str:
    """'(3 seeds†)': the dagger where a bootstrap over n seeds has too few resamples to be read as 95%."""
    return f"({n} seed{'s' * (n > 1)}{'†' * iv.few_seeds(n)})"


def _few_seeds_text() -> str:
    return (f"† fewer than {iv.FEW_SEEDS} training seeds: a bootstrap of n seeds has only C(2n-1, n) distinct "
            f"resamples ({iv.distinct_resamples(2)} for 2 seeds, {iv.distinct_resamples(3)} for 3, "
            f"{iv.distinct_resamples(4)} for 4; {iv.distinct_resamples(5)} for 5), its interval never reaches beyond "
            "the seeds' own range and covers less than 95%: read the t-interval there, which is wider (t has n - 1 "
            f"degrees of freedom: {iv.t_quantile(2):.2f} x sd / sqrt(3) either side of the mean of 3 seeds).")


def _interval_settings_text() -> str:
    return (f"95% intervals over training seeds: the percentile bootstrap ({iv.RESAMPLES:,} resamples of the "
            f"training seeds with replacement, RNG seed {iv.SEED}, so the report is reproducible) and the t-interval "
            "(mean ± t(n-1) sd / sqrt(n)). Both are over training seeds: each seed's score carries its own sampling "
            "noise too, small beside the seed spread (the sampling-noise table).")


def _mean_interval_lines(spec: StudySpec, rows: list[dict], scale: float) -> list[str]:
    cells = {(m["arm"], m["step"]): m for m in mean_intervals(spec, rows, scale)}
    if not any(m["n"] > 1 for m in cells.values()):
        return []
    lines = [f"### FID with 95% intervals, {guidance_label(scale, spec.guide_text)}", "",
             "Each cell: the mean FID, its bootstrap interval, then its t-interval. " + _interval_settings_text(),
             "", "| arm | " + " | ".join(f"step {s:,}" for s in spec.steps) + " |", "|---|" + "---:|" * len(spec.steps)]
    for arm in spec.arms:
        row = []
        for step in spec.steps:
            m = cells[arm.name, step]
            if m["n"] == 0:
                row.append("pending")
            elif m["n"] == 1:
                row.append(f"{m['mean']:.1f} (1 seed: no interval)")
            else:
                row.append(f"{m['mean']:.1f} {_span(m['bootstrap'])} t {_span(m['t'])} {_seeds_note(m['n'])}")
        lines.append(f"| {arm.label or arm.name} | " + " | ".join(row) + " |")
    if any(1 < m["n"] and iv.few_seeds(m["n"]) for m in cells.values()):
        lines += ["", _few_seeds_text()]
    return lines + [""]


def _delta_interval_cell(entry: dict) -> str:
    n = len(entry["diffs"])
    if n == 0:
        return "pending"
    if n == 1:
        return f"{entry['mean']:+.1f} (1 seed: no interval)"
    return (f"{entry['mean']:+.1f} {_span(entry['bootstrap'], '+')} t {_span(entry['t'], '+')}; lower in "
            f"{iv.percent(entry['p_lower'])} {_seeds_note(n)}")


def _component_interval_lines(spec: StudySpec, deltas: list[dict], scale: float) -> list[str]:
    if not any(len(d["diffs"]) > 1 for d in deltas):
        return []
    lines = [f"### Components, {guidance_label(scale, spec.guide_text)}: 95% intervals of the paired change", "",
             "Each cell: the mean paired change FID(arm, seed) - FID(base, seed), its bootstrap interval, its "
             "t-interval, and the share of bootstrap resamples (the seeds resampled as pairs) in which the arm's mean "
             "FID is the lower, a tie counted half. " + _interval_settings_text(), "",
             "| arm | base | " + " | ".join(f"step {s:,}" for s in spec.steps) + " |",
             "|---|---|" + "---:|" * len(spec.steps)]
    labels = {a.name: a for a in spec.arms}
    for name in dict.fromkeys(d["arm"] for d in deltas):
        mine = [d for d in deltas if d["arm"] == name]
        lines.append(f"| {labels[name].label or name} | `{mine[0]['base']}` | "
                     + " | ".join(_delta_interval_cell(d) for d in mine) + " |")
    if any(1 < len(d["diffs"]) and iv.few_seeds(len(d["diffs"])) for d in deltas):
        lines += ["", _few_seeds_text()]
    return lines + [""]


def _component_lines(spec: StudySpec, rows: list[dict], scale: float) -> list[str]:
    deltas = component_deltas(spec, rows, cfg_scale=scale)
    if not deltas:
        return []
    lines = [f"### Components, {guidance_label(scale, spec.guide_text)}: FID change against the base arm, paired by "
             "training seed", "",
             "Each arm that changes a base arm (same config, no overrides): the mean ± sd over training seeds of "
             "FID(arm, seed) - FID(base, seed), on the seeds both have. Negative: the change lowers FID (better).",
             "", "| arm | change | base | " + " | ".join(f"step {s:,}" for s in spec.steps) + " |",
             "|---|---|---|" + "---:|" * len(spec.steps)]
    labels = {a.name: a for a in spec.arms}
    for name in dict.fromkeys(d["arm"] for d in deltas):
        cells = [_delta_cell(d) for d in deltas if d["arm"] == name]
        arm = labels[name]
        base = next(d["base"] for d in deltas if d["arm"] == name)
        lines.append(f"| {arm.label or arm.name} | {' '.join(f'`{o}`' for o in arm.overrides)} | `{base}` | "
                     + " | ".join(cells) + " |")
    return lines + [""] + _component_interval_lines(spec, deltas, scale)


def decide(spec: StudySpec, rows: list[dict], cfg_scale: float | None = None) -> dict | None:
    """Apply the study's pre-registered decision rule (`DecisionSpec`) to the FID rows of one guidance scale
    (default: the first); None without a rule.

    The step is the last one at which the reference arm and at least one other candidate have ``min_seeds``
    scored training seeds; candidates with fewer seeds there are listed as not included. The best candidate
    (lowest mean) replaces the reference only if its lead exceeds sqrt(sd_best^2 + sd_reference^2).
    Returns {"cfg_scale", "step", "ranking": [(arm, mean, sd, n)], "winner", "resolved", "lead", "margin",
    "excluded": [arm], "baseline": (arm, mean, sd, n) | None, "last_step", "needs": [(arm, n)],
    "too_few_planned": [(arm, seeds planned)], "intervals": {arm: (bootstrap, t)}, "comparisons": [dict]}; "step"
    is None when no step qualifies yet. "needs": the candidates
    with fewer than ``min_seeds`` seeds at the study's last step (with the seeds they have): while it is not
    empty, the verdict is not the final one. "too_few_planned": candidates whose arm lists fewer training seeds
    than ``min_seeds``: never compared until the study file gives them more. "intervals": each ranked
    arm's 95% bootstrap and t-intervals of its mean. "comparisons": every other ranked arm against the reference,
    and against the baseline, by `comparison` (the bootstrap probability of the ordering among them); the rule
    itself does not use them.
    """
    rule = spec.decision
    if rule is None:
        return None
    scale = _scale(spec, cfg_scale)
    agg = {(a["arm"], a["step"]): a for a in aggregate(spec, rows, "fid", scale)}
    enough = {(arm, step) for (arm, step), a in agg.items() if a["n"] >= rule.min_seeds}
    steps = [st for st in spec.steps if (rule.reference, st) in enough
             and any((c, st) in enough for c in rule.candidates if c != rule.reference)]
    last = spec.max_steps
    planned = {a.name: len(a.seeds) for a in spec.arms}
    out = {"cfg_scale": scale, "step": None, "reference": rule.reference, "min_seeds": rule.min_seeds,
           "ranking": [], "winner": rule.reference, "resolved": False, "lead": None, "margin": None, "excluded": [],
           "baseline": None, "last_step": last,
           "needs": [(c, agg[c, last]["n"]) for c in rule.candidates
                     if (c, last) not in enough and planned[c] >= rule.min_seeds],
           "too_few_planned": [(c, planned[c]) for c in rule.candidates if planned[c] < rule.min_seeds],
           "intervals": {}, "comparisons": []}
    if not steps:
        out["excluded"] = list(rule.candidates)
        return out
    step = steps[-1]

    def summary(arm: str) -> tuple[str, float, float, int]:
        a = agg[arm, step]
        return arm, a["mean"], a["sd"], a["n"]

    ranking = sorted((summary(c) for c in rule.candidates if (c, step) in enough), key=lambda r: r[1])
    best, ref = ranking[0], summary(rule.reference)
    lead, margin = ref[1] - best[1], math.hypot(best[2], ref[2])
    resolved = best[0] != rule.reference and lead > margin
    out.update(step=step, ranking=ranking, lead=lead, margin=margin, resolved=resolved,
               winner=best[0] if resolved else rule.reference,
               excluded=[c for c in rule.candidates if (c, step) not in enough])
    if rule.baseline and (rule.baseline, step) in enough:
        out["baseline"] = summary(rule.baseline)
    against = [rule.reference] + ([rule.baseline] if out["baseline"] else [])
    scores = {arm: dict(zip(agg[arm, step]["seeds"], agg[arm, step]["values"]))
              for arm in dict.fromkeys([*(r[0] for r in ranking), *against])}
    out["intervals"] = {arm: (iv.bootstrap_interval(list(v.values())), iv.t_interval(list(v.values())))
                        for arm, v in scores.items()}
    out["comparisons"] = [comparison(arm, other, scores[arm], scores[other]) for other in against
                          for arm, *_ in ranking if arm not in (other, rule.reference)]
    return out


def comparison(arm: str, other: str, a: dict[int, float], b: dict[int, float]) -> dict:
    """``arm`` against ``other`` from their FID by training seed: the difference of means with its bootstrap
    interval and the probability that ``arm`` is ahead (`intervals.compare`: paired where the seeds are shared),
    and the paired difference on the shared seeds with its t-interval."""
    c = iv.compare(a, b)
    d = [a[s] - b[s] for s in c.shared]
    return {"arm": arm, "against": other, "n": len(a), "n_against": len(b), **dataclasses.asdict(c),
            "paired_mean": float(np.mean(d)) if d else None, "paired_sd": mean_sd(d)[1] if d else None,
            "paired_t": iv.t_interval(d)}


def _needs_text(d: dict) -> str:
    if not d["needs"]:
        return f"not decided yet: no candidate lists {d['min_seeds']} training seeds"
    return (f"not decided yet: needs {d['min_seeds']} seeds at step {d['last_step']:,} of "
            + ", ".join(f"`{arm}` (has {n})" for arm, n in d["needs"]))


def verdict(spec: StudySpec, d: dict) -> str:
    """The decision of one guidance scale in plain words, with what is still missing for the final one."""
    ref = d["reference"]
    if d["step"] is None:
        return f"{guidance_label(d['cfg_scale'], spec.guide_text).capitalize()}: {_needs_text(d)}."
    best = d["ranking"][0][0]
    where = f"at step {d['step']:,} ({len(d['ranking'])} candidates with ≥ {d['min_seeds']} seeds)"
    if best == ref:
        text = f"`{ref}` stays the preset: the lowest mean FID {where}"
    elif d["resolved"]:
        text = (f"`{best}` replaces `{ref}`: {d['lead']:.1f} FID ahead {where}, more than the combined "
                f"training-seed sd {d['margin']:.1f}")
    else:
        text = (f"`{ref}` stays the preset: `{best}` is {d['lead']:.1f} FID ahead {where}, within the combined "
                f"training-seed sd {d['margin']:.1f}")
    if d["needs"]:
        text += f"; provisional, {_needs_text(d)}"
    head = _headline(d)
    ordering = f" {ordering_text(spec, head)}." if head else ""
    return f"{guidance_label(d['cfg_scale'], spec.guide_text).capitalize()}: {text}.{ordering}{_planned_text(d)}"


def _arm_words(spec: StudySpec, name: str) -> str:
    """'SiT + 2D RoPE (`sit-rope`)'; a label's own parenthesis is left out: 'ViT5G (`vit5-nols`)'."""
    label = next((a.label for a in spec.arms if a.name == name), "").split(" (")[0]
    return f"{label} (`{name}`)" if label and label != name else f"`{name}`"


def _headline(d: dict) -> dict | None:
    """The comparison the verdict rests on: the best candidate against the reference, or, where the reference is
    the best, the runner-up against it."""
    if len(d["ranking"]) < 2:
        return None
    best = d["ranking"][0][0] if d["ranking"][0][0] != d["reference"] else d["ranking"][1][0]
    return next((c for c in d["comparisons"] if c["arm"] == best and c["against"] == d["reference"]), None)


def _flip(span: tuple[float, float] | list | None) -> tuple[float, float] | None:
    return None if span is None else (-span[1], -span[0])


def _mirror(c: dict) -> dict:
    """A `comparison` seen from the other arm."""
    return {**c, "arm": c["against"], "against": c["arm"], "n": c["n_against"], "n_against": c["n"],
            "only_a": c["only_b"], "only_b": c["only_a"], "diff": -c["diff"], "interval": _flip(c["interval"]),
            "p_ahead": 1 - c["p_ahead"], "paired_mean": None if c["paired_mean"] is None else -c["paired_mean"],
            "paired_t": _flip(c["paired_t"])}


def ordering_text(spec: StudySpec, c: dict) -> str:
    """One comparison in plain words, from the arm ahead in most resamples: 'SiT + 2D RoPE (`sit-rope`) is ahead of
    ViT5G (`vit5-nols`) in 96% of bootstrap resamples of the 3 training seeds (paired by seed); ...', with the
    intervals and what the seed count allows."""
    if c["p_ahead"] < 0.5:
        c = _mirror(c)
    if c["shared"] and not c["only_a"] and not c["only_b"]:
        seeds = f"the {len(c['shared'])} training seeds, paired by seed"
    else:
        seeds = (f"the training seeds ({c['n']} of `{c['arm']}`, {c['n_against']} of `{c['against']}`"
                 + (f", the {len(c['shared'])} both have paired" if c["shared"] else ", none shared") + ")")
    text = (f"{_arm_words(spec, c['arm'])} is ahead of {_arm_words(spec, c['against'])} in "
            f"{iv.percent(c['p_ahead'])} of bootstrap resamples of {seeds}")
    if c["ties"]:
        text += f" (level in {iv.percent(c['ties'])}, counted half)"
    elif c["p_ahead"] == 1 and c["distinct"] > 1 and c["paired_mean"] is not None and not (
            c["only_a"] or c["only_b"]):
        text += " (every seed has it ahead, so every resample does)"
    if c["interval"] is None:
        return text + "; one seed each: no interval"
    text += (f"; FID(`{c['arm']}`) - FID(`{c['against']}`) = {c['diff']:+.1f}, bootstrap 95% "
             f"{_span(c['interval'], '+')}")
    if c["paired_t"] is not None:
        what = ("t 95%" if len(c["shared"]) == c["n"] == c["n_against"]
                else f"t 95% over the {len(c['shared'])} shared seeds")
        text += f", {what} {_span(c['paired_t'], '+')}"
    fewest = min(c["n"], c["n_against"])
    if iv.few_seeds(fewest):
        text += (f". With {fewest} seeds the bootstrap has only {c['distinct']} distinct resamples: its probability "
                 "is coarse and its interval narrower than the t-interval, which is the one to read")
        if c["paired_t"] is not None and c["paired_t"][0] < 0 < c["paired_t"][1]:
            text += f" (it includes 0: {fewest} seeds do not establish the ordering at 95%)"
    return text


def _planned_text(d: dict) -> str:
    if not d["too_few_planned"]:
        return ""
    return (f" Not compared at all (their arms list fewer than {d['min_seeds']} training seeds; add seeds to compare "
            f"them): {', '.join(f'`{arm}` ({n})' for arm, n in d['too_few_planned'])}.")


def _decision_lines(spec: StudySpec, d: dict) -> list[str]:
    rule = spec.decision
    lines = [f"### Decision, {guidance_label(d['cfg_scale'], spec.guide_text)} (the pre-registered rule, applied to "
             "the table)", "",
             f"Candidates: {', '.join(rule.candidates)}; the default stays `{rule.reference}` unless the best "
             f"candidate's lead in mean FID exceeds sqrt(sd_best² + sd_{rule.reference}²), at the last step where "
             f"`{rule.reference}` and another candidate have ≥ {rule.min_seeds} training seeds.", ""]
    if d["step"] is None:
        return lines + [f"**Not decidable yet**: no step has ≥ {rule.min_seeds} seeds for `{rule.reference}` "
                        f"and another candidate; {_needs_text(d)}.{_planned_text(d)}", ""]
    lines += [f"Step {d['step']:,}:", "", "| rank | arm | FID mean ± sd | seeds | bootstrap 95% | t 95% |",
              "|---:|---|---:|---:|---:|---:|"]
    for i, (arm, mean, sd, n) in enumerate(d["ranking"], 1):
        boot, t = d["intervals"][arm]
        lines.append(f"| {i} | `{arm}` | {mean:.1f} ± {sd:.1f} | {n}{'†' * iv.few_seeds(n)} | {_span(boot)} | "
                     f"{_span(t)} |")
    best = d["ranking"][0][0]
    if best == rule.reference:
        text = f"**`{rule.reference}` stays**: it has the lowest mean FID."
    elif d["resolved"]:
        text = (f"**`{best}` wins**: {d['lead']:.1f} FID ahead of `{rule.reference}`, more than the combined "
                f"training-seed sd {d['margin']:.1f}.")
    else:
        text = (f"**Not resolved**: `{best}` is {d['lead']:.1f} FID ahead of `{rule.reference}`, within the "
                f"combined training-seed sd {d['margin']:.1f}; `{rule.reference}` stays the default.")
    lines += ["", text]
    if d["baseline"]:
        arm, mean, sd, n = d["baseline"]
        lines.append(f"Baseline `{arm}` at the same step: {mean:.1f} ± {sd:.1f} ({n} seeds).")
    lines += ["", *_comparison_lines(spec, d), ""]
    if d["excluded"]:
        lines.append(f"Not included (fewer than {rule.min_seeds} seeds at step {d['step']:,}): "
                     f"{', '.join(f'`{c}`' for c in d['excluded'])}.")
    lines.append((f"Final at the study's last step {d['last_step']:,}: every candidate has ≥ {rule.min_seeds} "
                  "seeds there." if not d["needs"] else f"Provisional: {_needs_text(d)}.") + _planned_text(d))
    return lines + [""]


def _comparison_lines(spec: StudySpec, d: dict) -> list[str]:
    """The ordering of the ranked arms with its bootstrap: the table, and the verdict's comparison in words."""
    if not d["comparisons"]:
        return []
    lines = ["How firm the ordering is (" + _interval_settings_text() + " The difference of means is each arm's "
             "mean over its own seeds, resampled paired by seed where both arms have the seed; 'ahead' is the share "
             "of resamples in which the arm's mean FID is the lower, a tie counted half):", "",
             "| arm | against | seeds | difference of means | bootstrap 95% | ahead in | paired by seed: mean ± sd | "
             "t 95% |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in d["comparisons"]:
        seeds = f"{c['n']} / {c['n_against']}" + ("" if c["n"] == c["n_against"] == len(c["shared"])
                                                   else f" ({len(c['shared'])} shared)")
        seeds += "†" * iv.few_seeds(min(c["n"], c["n_against"]))
        boot = _span(c["interval"], "+") if c["interval"] else "-"
        paired = (f"{c['paired_mean']:+.1f}" + (f" ± {c['paired_sd']:.1f}" if c["paired_sd"] is not None else "")
                  if c["paired_mean"] is not None else "no shared seed")
        t = _span(c["paired_t"], "+") if c["paired_t"] else "-"
        lines.append(f"| `{c['arm']}` | `{c['against']}` | {seeds} | {c['diff']:+.1f} | {boot} | "
                     f"{iv.percent(c['p_ahead'])} | {paired} | {t} |")
    head = _headline(d)
    lines += ["", *([ordering_text(spec, head) + "."] if head else [])]
    if any(iv.few_seeds(min(c["n"], c["n_against"])) for c in d["comparisons"]):
        lines += ["", _few_seeds_text()]
    return lines


def _seed_list(seeds: list[int]) -> str:
    return ", ".join(f"s{s}" for s in seeds)


def _cell(entry: dict, digits: int) -> str:
    if entry["mean"] is None:
        if entry["unmeasured"]:
            return f"not measured ({_seed_list(entry['unmeasured'])} scored without it)"
        return "pending"
    text = f"{entry['mean']:.{digits}f}"
    if entry["sd"] is not None:
        text += f" ± {entry['sd']:.{digits}f}"
    if entry["n"] < entry["of"]:
        notes = [f"{entry['n']}/{entry['of']} seeds"]
        if entry["missing"]:
            notes.append(f"missing {_seed_list(entry['missing'])}")
        if entry["unmeasured"]:
            notes.append(f"{_seed_list(entry['unmeasured'])} not measured")
        return text + f" ({'; '.join(notes)})"
    return text + f" ({entry['n']} seed{'s' * (entry['n'] > 1)})"


def _metric_tables(spec: StudySpec, rows: list[dict], scale: float) -> list[str]:
    lines = []
    for metric in spec.eval.metrics:
        agg = aggregate(spec, rows, metric, scale)
        lines += [f"### {METRIC_LABELS.get(metric, metric)}, {guidance_label(scale, spec.guide_text)}", "",
                  "| arm | overrides | " + " | ".join(f"step {s:,}" for s in spec.steps) + " |",
                  "|---|---|" + "---:|" * len(spec.steps)]
        for arm in spec.arms:
            cells = [_cell(a, _DIGITS.get(metric, 3)) for a in agg if a["arm"] == arm.name]
            base = Path(arm.config).name
            over = " ".join(f"`{o}`" for o in arm.overrides)
            lines.append(f"| {arm.label} | {base} {over} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def format_report(spec: StudySpec, rows: list[dict]) -> str:
    """The markdown of study.md."""
    e = spec.eval
    ref = spec.reference_path
    scales = ", ".join(guidance_label(c, spec.guide_text) for c in e.cfg_scales)
    lines = [
        f"# Study {spec.name}: mean ± sd over training seeds",
        "",
        f"{e.num_samples} samples per checkpoint (seeds {e.sample_seed}..{e.sample_seed + e.num_samples - 1}, "
        f"classes balanced), sampler {e.mode}/{e.method} {e.steps} steps, each checkpoint at every guidance scale: "
        f"{scales}; reference: every image of `{e.reference_data}` (`{ref.name}`). Metrics: "
        f"{', '.join(METRIC_LABELS.get(m, m) for m in e.metrics)}"
        + (" (digit accuracy: the share of samples the digit classifier reads as the digit asked for)"
           if "digit_accuracy" in e.metrics else "")
        + ". sd is the sample standard deviation over training seeds (n - 1), with the seed count beside it; a cell "
        "with fewer seeds than planned names the missing ones, and a metric added after a cell was scored is "
        "'not measured' there.",
        "",
    ]
    kept = sum(1 for r in rows if r.get(KEPT))
    if kept:
        lines += [f"{kept} of the {len(rows)} scores are kept from the earlier `study.json` (their run folders "
                  "are not on the machine that wrote this report).", ""]
    decisions = [decide(spec, rows, c) for c in e.cfg_scales] if spec.decision is not None else []
    if decisions:
        lines += ["## Verdict", ""] + [f"- {verdict(spec, d)}" for d in decisions] + [""]
    for scale in e.cfg_scales:
        lines += [f"## {guidance_label(scale, spec.guide_text).capitalize()}", ""]
        lines += _metric_tables(spec, rows, scale)
        lines += _mean_interval_lines(spec, rows, scale)
        lines += _component_lines(spec, rows, scale)
        noise = sampling_noise(spec, rows, cfg_scale=scale)
        if noise:
            lines += [f"### Sampling noise (FID), {guidance_label(scale, spec.guide_text)}", "",
                      f"The same checkpoints scored with a second set of sample seeds ({e.noise_seed}.."
                      f"{e.noise_seed + e.num_samples - 1}); sd = sqrt(mean(d^2)/2) of the differences d, to set "
                      "beside the training-seed sd above.", "",
                      "| arm | step | FID, seeds A / B (per training seed) | sampling sd |", "|---|---:|---|---:|"]
            for n in noise:
                pairs = "; ".join(f"s{s}: {a:.1f} / {b:.1f}" for s, a, b in n["pairs"])
                lines.append(f"| {n['arm']} | {n['step']:,} | {pairs} | {n['sd']:.2f} |")
            lines.append("")
        for d in decisions:
            if d["cfg_scale"] == scale:
                lines += _decision_lines(spec, d)
    return "\n".join(lines)


def _suffix(spec: StudySpec, scale: float) -> str:
    """File-name suffix of a guidance scale's plot and grids: none for the first (the names of before)."""
    return "" if scale == spec.eval.cfg_scales[0] else f"_cfg{scale:g}"


def plot_study(spec: StudySpec, rows: list[dict], path: Path, metric: str = "fid",
               cfg_scale: float | None = None) -> None:
    """Mean over training seeds against step, one line per arm, a band of ± one sd, each seed as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = _scale(spec, cfg_scale)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, arm in enumerate(spec.arms):
        agg = [a for a in aggregate(spec, rows, metric, scale) if a["arm"] == arm.name and a["mean"] is not None]
        if not agg:
            continue
        color = plt.cm.tab20(i % 20)
        steps = np.array([a["step"] for a in agg])
        mean = np.array([a["mean"] for a in agg])
        sd = np.array([a["sd"] or 0.0 for a in agg])
        most, fewest = max(agg, key=lambda a: a["n"]), min(agg, key=lambda a: a["n"])
        n = str(most["n"]) if most["n"] == fewest["n"] else f"{most['n']}; {fewest['n']} at {fewest['step']:,}"
        ax.plot(steps, mean, marker="o", color=color, label=f"{arm.label} (n={n})")
        ax.fill_between(steps, mean - sd, mean + sd, color=color, alpha=0.15)
        for a in agg:
            ax.scatter([a["step"]] * len(a["values"]), a["values"], color=color, s=8, alpha=0.6)
    ax.set_xlabel("training step")
    ax.set_ylabel(METRIC_LABELS.get(metric, metric) + f"-{spec.eval.num_samples}")
    ax.set_title(f"{spec.name}, {guidance_label(scale, spec.guide_text)}: mean ± sd over training seeds", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    with atomic_write_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def save_arm_grids(spec: StudySpec, rows: list[dict], out_dir: Path, per_class: int = 8,
                   cfg_scale: float | None = None) -> list[Path]:
    """One grid per arm at one guidance scale (default: the first; grid_<arm>.png, others grid_<arm>_cfg<s>.png):
    the first ``per_class`` evaluation samples of each class at the arm's latest step (first training seed that
    has it), taken from the evaluation .npz (nothing is sampled again)."""
    from vit5_sit.sampling.generate import save_labelled_grid

    scale = _scale(spec, cfg_scale)
    written = []
    for arm in spec.arms:
        mine = [r for r in _main_rows(spec, rows, scale) if r["arm"] == arm.name]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r["step"], -r["seed"]))
        if "samples" not in best:  # a score kept from the earlier study.json: its samples are not here,
            continue               # so the grid already drawn from them stays
        with np.load(best["samples"]) as data:
            images, labels = data["arr_0"], data["arr_1"]
        classes = sorted(set(labels.tolist()))
        picked = np.concatenate([images[labels == c][:per_class] for c in classes])
        path = out_dir / f"grid_{arm.name}{_suffix(spec, scale)}.png"
        save_labelled_grid(picked, path, per_class, [str(c) for c in classes])
        written.append(path)
        best["grid"] = str(path)
    return written


def _valid_row(r) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("arm"), str)
            and all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool) for k in ("seed", "step",
                                                                                          "sample_seed"))
            and (r.get("cfg_scale") is None or _finite(r["cfg_scale"])))


def saved_rows(spec: StudySpec, path: str | Path, log=print) -> list[dict]:
    """The scores of an earlier results file ``path`` (study.json) that belong to this study: its arms, steps,
    training seeds, sample seeds and guidance scales, under the same `SCORE_SETTINGS`; [] if there is no such
    file. Each kept row carries its guidance scale (``cfg_scale``; a row of a file written before the study had
    several takes that file's ``eval.cfg_scale``).

    A file that cannot be read as a results file is refused (`StudyError`): the report would replace it, and
    it may hold the only copy of scores whose runs are gone.
    """
    path = Path(path)
    fix = "repair it (git checkout it) or move it away, then run the command again"
    if path.exists() and not path.is_file():
        raise StudyError(f"{path}: not a file, so not the study's results file; move it away, then run the command "
                         "again")
    if not path.is_file():
        return []
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise StudyError(f"{path}: not a readable study results file ({e}); {fix}") from None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or not all(_valid_row(r) for r in rows):
        raise StudyError(f"{path}: not a study results file (no list of rows with arm, seed, step and "
                         f"sample_seed); {fix}")
    if problem := rows_problem(None, [r for r in rows if r.get("cfg_scale") is not None]):
        raise StudyError(f"{path}: {problem}; {fix}")
    settings = payload.get("eval")
    same = isinstance(settings, dict) and all(settings.get(k) == getattr(spec.eval, k) for k in SCORE_SETTINGS)
    if payload.get("study") != spec.name or not same:
        what = (f"study {payload.get('study')!r}, not {spec.name!r}" if payload.get("study") != spec.name
                else "other evaluation settings")
        if rows:
            log(f"note: the {len(rows)} scores in {path} are of {what}: the new report does not keep them "
                "(git keeps the old file)")
        return []
    legacy = settings.get("cfg_scale", (settings.get("cfg_scales") or [1.0])[0])  # rows without a scale
    if not _finite(legacy):
        legacy = None
    arms = {a.name: a for a in spec.arms}
    sample_seeds = {spec.eval.sample_seed, spec.eval.noise_seed} - {None}
    kept = []
    for r in rows:
        scale = r.get("cfg_scale", legacy)
        arm = arms.get(r["arm"])
        if (arm is not None and r["seed"] in arm.seeds and r["step"] in spec.steps and r["sample_seed"] in sample_seeds
                and scale is not None and float(scale) in spec.eval.cfg_scales
                and r.get("guide") == spec.guide_for(arm, r["seed"], float(scale))):  # guided as this study guides
            kept.append({**r, "cfg_scale": float(scale)})
    if problem := rows_problem(spec, kept):  # rows of an older file, without a scale, take the legacy one
        raise StudyError(f"{path}: {problem}; {fix}")
    if len(kept) < len(rows):
        log(f"note: {len(rows) - len(kept)} scores in {path} are of arms, seeds, steps, sample seeds, guidance "
            "scales or guides this study no longer has: the new report does not keep them")
    return kept


def rows_problem(spec: StudySpec | None, rows: list[dict]) -> str | None:
    """Why ``rows`` cannot be scores, or None: a metric value outside its range (`METRIC_RANGES`: a negative FID,
    a precision above 1, NaN) or an evaluation (arm, seed, step, sample seed, guidance scale) given twice, which
    the arm table and the paired comparisons would each count their own way. Checked wherever rows enter a
    report: the saved study.json (`saved_rows`) and the evaluations (`write_report`)."""
    for r in rows:
        for name, value in r.items():
            if problem := metric_problem(name, value):
                return f"{_row_text(spec, r)}: {name}={value!r}: {problem}"
    seen: dict[tuple, int] = {}
    for r in rows:
        key = _row_key(spec, r)
        seen[key] = seen.get(key, 0) + 1
    twice = [_row_text(spec, dict(zip(_KEY, key, strict=True))) for key, n in seen.items() if n > 1]
    if twice:
        return (f"{len(twice)} evaluation(s) given more than once ({'; '.join(twice[:5])}"
                f"{f'; and {len(twice) - 5} more' if len(twice) > 5 else ''}): keep one row of each")
    return None


def _row_text(spec: StudySpec | None, r: dict) -> str:
    scale = row_cfg(spec, r) if spec is not None else r.get("cfg_scale")
    return f"{r['arm']} seed {r['seed']} step {r['step']} sample seed {r['sample_seed']} cfg {scale}"


def _row_key(spec: StudySpec | None, r: dict) -> tuple:
    scale = row_cfg(spec, r) if spec is not None else r.get("cfg_scale")
    return (r["arm"], r["seed"], r["step"], r["sample_seed"], scale)


def merge_rows(new: list[dict], old: list[dict], spec: StudySpec | None = None) -> list[dict]:
    """``new`` plus every row of ``old`` whose (arm, seed, step, sample_seed, cfg_scale) ``new`` does not have,
    marked with ``kept_from`` (a score computed now replaces the saved one)."""
    have = {_row_key(spec, r) for r in new}
    kept = [{**r, KEPT: r.get(KEPT) or "study.json"} for r in old if _row_key(spec, r) not in have]
    return list(new) + kept


def write_report(spec: StudySpec, rows: list[dict], out_dir: str | Path | None = None, *,
                 keep_saved: bool = True, log=print) -> Path:
    """study.md, study.json, the FID-vs-step plots (fid_vs_step.png; fid_vs_step_cfg<s>.png for the other guidance
    scales) and the grids in the results folder; returns study.md's path.

    ``keep_saved``: the scores of the folder's earlier study.json that ``rows`` does not redo stay in the
    report (`saved_rows`): a run folder that is gone does not take its scores with it."""
    out = Path(out_dir or spec.results_dir)
    rows = [{**r, "cfg_scale": row_cfg(spec, r)} for r in rows]
    if problem := rows_problem(spec, rows):
        raise StudyError(f"the evaluations: {problem}; nothing was written")
    if keep_saved:
        rows = merge_rows(rows, saved_rows(spec, out / "study.json", log), spec)
    order = {a.name: i for i, a in enumerate(spec.arms)}
    rows = sorted(rows, key=lambda r: (order.get(r["arm"], len(order)), *_row_key(spec, r)[1:]))
    out.mkdir(parents=True, exist_ok=True)
    for scale in spec.eval.cfg_scales:
        save_arm_grids(spec, rows, out, cfg_scale=scale)
    atomic_write_text(out / "study.md", format_report(spec, rows))
    scales = spec.eval.cfg_scales
    payload = {"study": spec.name, "steps": list(spec.steps), "eval": spec.eval.__dict__,
               "arms": [{"name": a.name, "label": a.label, "config": a.config, "overrides": list(a.overrides),
                         "seeds": list(a.seeds), **({"guide": a.guide} if a.guide is not None else {})}
                        for a in spec.arms],
               "aggregate": {m: [e for c in scales for e in aggregate(spec, rows, m, c)] for m in spec.eval.metrics},
               "sampling_noise": [n for c in scales for n in sampling_noise(spec, rows, cfg_scale=c)],
               "intervals": {"level": iv.LEVEL, "resamples": iv.RESAMPLES, "seed": iv.SEED, "few_seeds": iv.FEW_SEEDS,
                             "fid_means": [m for c in scales for m in mean_intervals(spec, rows, c)],
                             "components": [e for c in scales for e in component_deltas(spec, rows, cfg_scale=c)]},
               "decisions": [decide(spec, rows, c) for c in scales] if spec.decision is not None else [],
               "rows": [{k: v for k, v in r.items() if k != "samples"} for r in rows]}
    atomic_write_text(out / "study.json", json.dumps(payload, indent=1, default=str) + "\n")
    if "fid" in spec.eval.metrics and rows:
        for scale in scales:
            if _main_rows(spec, rows, scale):
                plot_study(spec, rows, out / f"fid_vs_step{_suffix(spec, scale)}.png", cfg_scale=scale)
    return out / "study.md"
