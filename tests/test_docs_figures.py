"""The study figures that the README and the docs quote are the studies' durable records (issue #53: the README gave
SiT + RoPE as 55.1 and 55.6 and ViT5G as 61.9 and 60.7, 5-seed beside older 3/4-seed figures, and
docs/meanflow.md predated the five seeds). Each quoted figure is checked against the study.json it comes from, at
the seed count the page states: the tables row by row, the prose sentence by sentence. A new seed or a re-scored
cell makes the page's sentence fail here with the text it should now say."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vit5_sit.study.figures import Cell, cell, load_record

ROOT = Path(__file__).parent.parent
STUDY = ROOT / "docs" / "study"
GENERATION = load_record(STUDY / "generation" / "study.json")  # #28: Euler 6, unguided and cfg 6, 3,600 steps
COMPONENTS = load_record(STUDY / "study.json")                 # the first study: Heun 15, the component ablations
MEANFLOW = {1: load_record(STUDY / "meanflow" / "study.json"), 2: load_record(STUDY / "meanflow-2nfe" / "study.json")}
MEANFLOW_LONG = {1: load_record(STUDY / "meanflow-long" / "study.json"),
                 2: load_record(STUDY / "meanflow-long-2nfe" / "study.json")}
MEANFLOW_WIDE = load_record(STUDY / "meanflow-wide" / "study.json")
FLOW_STEP = {750: 1200, 1500: 2400, 2250: 3600}  # MeanFlow steps -> flow steps of equal training CPU time (1.6x)


def _page(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())  # sentences wrap anywhere


def _fid(record: dict, arm: str, step: int, cfg: float = 1.0, seeds=None) -> Cell:
    return cell(record, arm, step, cfg_scale=cfg, seeds=seeds)


def _said(page: str, sentence: str) -> None:
    text = _page(page)
    assert sentence in text, f"{page} should say, from the study records:\n{sentence}"


# ----------------------------------------------------------------------------------------------------------
# The README's Results

def test_readme_component_study_figures():
    nols, paper, sit = ((_fid(COMPONENTS, arm, 1200, seeds=3), _fid(COMPONENTS, arm, 2400, seeds=3))
                        for arm in ("vit5-nols", "vit5", "sit"))
    _said("README.md", f"{nols[0].n} training seeds, FID-1000): ViT-5 without LayerScale {nols[0].text()} at 1,200 "
                       f"steps and {nols[1].text()} at 2,400, the paper's ViT-5 {paper[0].text()} and "
                       f"{paper[1].text()}, SiT {sit[0].text()} and {sit[1].text()}.")


def _unguided_pair() -> tuple[int, int, float, tuple[float, float]]:
    """SiT + RoPE against ViT5G unguided at 3,600, paired by seed: seeds ahead, seeds paired, mean, 95% t."""
    decision = next(d for d in GENERATION["decisions"] if d["cfg_scale"] == 1.0)
    pair = next(c for c in decision["comparisons"] if (c["arm"], c["against"]) == ("sit-rope", "vit5-nols"))
    rope, nols = _fid(GENERATION, "sit-rope", 3600, seeds=pair["shared"]), _fid(GENERATION, "vit5-nols", 3600,
                                                                                seeds=pair["shared"])
    ahead = sum(a < b for a, b in zip(rope.values, nols.values))
    return ahead, len(pair["shared"]), pair["paired_mean"], tuple(pair["paired_t"])


def test_readme_generation_study_figures():
    sit_u, sit_g = _fid(GENERATION, "sit", 3600), _fid(GENERATION, "sit", 3600, 6)
    _said("README.md", f"all lead SiT ({sit_u.n} training seeds: {sit_u.text()} unguided, {sit_g.text()} guided)")
    rope, nols = _fid(GENERATION, "sit-rope", 3600), _fid(GENERATION, "vit5-nols", 3600)
    assert rope.n == nols.n
    ahead, paired, diff, (lo, hi) = _unguided_pair()
    _said("README.md", f"**Unguided, SiT + RoPE wins** ({rope.n} training seeds: {rope.text()} against ViT5G's "
                       f"{nols.text()}; ahead on {ahead} of {paired} seeds, paired difference {diff:.1f} with a 95% "
                       f"t-interval of [{lo:.1f}, {hi:.1f}])")
    rope_g, nols_g, noreg_g = (_fid(GENERATION, arm, 3600, 6) for arm in ("sit-rope", "vit5-nols", "nols-no-registers"))
    assert rope_g.n == nols_g.n
    _said("README.md", f"(ViT5G {nols_g.text()} and SiT + RoPE {rope_g.text()} level at {nols_g.n} seeds, ViT5G "
                       f"without registers {noreg_g.text()} at {noreg_g.n} seeds within the noise;")
    _said("README.md", f"four arms, {sit_u.n} training seeds ({rope.n} for SiT + RoPE and ViT5G), 3,600 steps")


def test_readme_guided_verdict_at_the_default_guidance_is_the_guidance_records():
    """SiT + RoPE against ViT5G at the default guidance (issue #52's records, paired by training seed)."""
    import statistics

    from guidance_records import default_guidance_fids

    from vit5_sit.study.intervals import t_interval

    fid = default_guidance_fids()
    rope, nols = list(fid["sit-rope"].values()), list(fid["vit5-nols"].values())
    seeds = sorted(set(fid["sit-rope"]) & set(fid["vit5-nols"]))
    diffs = [fid["sit-rope"][s] - fid["vit5-nols"][s] for s in seeds]
    lo, hi = t_interval(diffs)
    assert len(rope) == len(nols) == len(seeds)
    _said("README.md", f"SiT + RoPE {statistics.mean(rope):.1f} ± {statistics.stdev(rope):.1f} against ViT5G's "
                       f"{statistics.mean(nols):.1f} ± {statistics.stdev(nols):.1f} ({len(seeds)} training seeds; "
                       f"ahead on {sum(d < 0 for d in diffs)} of {len(seeds)} seeds, paired 95% t-interval "
                       f"[{lo:.1f}, {hi:.1f}])")


def test_readme_meanflow_figures_are_against_every_flow_seed():
    """The MeanFlow paragraph compares with the flow study's every seed (not the 3 / 4 it had when written)."""
    one = {s: (_fid(MEANFLOW[1], "meanflow-sit-rope", s), _fid(MEANFLOW[1], "meanflow-vit5g", s)) for s in FLOW_STEP}
    flow = {s: (_fid(GENERATION, "sit-rope", f), _fid(GENERATION, "vit5-nols", f)) for s, f in FLOW_STEP.items()}
    (r1, v1), (r2, v2), (r3, v3) = (one[s] for s in FLOW_STEP)
    (fr1, fv1), (fr2, fv2), (fr3, fv3) = (flow[s] for s in FLOW_STEP)
    _said("README.md", f"{r1.n} MeanFlow seeds against the flow models' {fr1.n}), 1 network call against the flow "
                       f"models' 6 (Euler, unguided): FID-1000 {r1.mean:.1f} vs {fr1.mean:.1f} (SiT + RoPE) and "
                       f"{v1.mean:.1f} vs {fv1.mean:.1f} (ViT5G) at the flow study's 1,200-step budget, "
                       f"{r2.mean:.1f} vs {fr2.mean:.1f} and {v2.mean:.1f} vs {fv2.mean:.1f} at 2,400, {r3.mean:.1f} "
                       f"vs {fr3.mean:.1f} ({r3.mean / fr3.mean:.2f}x) and {v3.mean:.1f} vs {fv3.mean:.1f} "
                       f"({v3.mean / fv3.mean:.2f}x) at 3,600")
    two_r, two_v = _fid(MEANFLOW[2], "meanflow-sit-rope", 2250), _fid(MEANFLOW[2], "meanflow-vit5g", 2250)
    _said("README.md", f"**Two MeanFlow steps reach it**: {two_r.mean:.1f} vs {fr3.mean:.1f} (SiT + RoPE) and "
                       f"{two_v.mean:.1f} vs {fv3.mean:.1f} (ViT5G) at 3,600")


# ----------------------------------------------------------------------------------------------------------
# docs/meanflow.md: its table, row by row, and the figures its text derives from the table

def _rows(page: str) -> list[list[str]]:
    """The page's table rows, as cells without the markdown emphasis."""
    rows = []
    for line in (ROOT / page).read_text().splitlines():
        if line.startswith("|") and not re.match(r"^\|[-: |]+\|$", line):
            rows.append([c.strip().replace("**", "") for c in line.strip().strip("|").split("|")])
    return rows


def _both(record: dict, arm: str, step: int, metric: str, digits: int, seeds, sd: bool = False) -> str:
    """'unguided / guided' as the table prints them."""
    cells = [cell(record, arm, step, cfg_scale=c, metric=metric, seeds=seeds) for c in (1.0, 6.0)]
    return " / ".join(c.text(digits) if sd else f"{c.mean:.{digits}f}" for c in cells)


def _metrics(record: dict, arm: str, step: int, seeds=None) -> list[str]:
    """FID (mean ± sd), sFID, precision, recall and digit accuracy (means) of one unguided cell."""
    c = {m: cell(record, arm, step, metric=m, seeds=seeds) for m in ("fid", "sfid", "precision", "recall",
                                                                      "digit_accuracy")}
    fid = c["fid"].text() if c["fid"].n > 1 else f"{c['fid'].mean:.1f}"
    return [fid, f"{c['sfid'].mean:.1f}", *(f"{c[m].mean:.3f}" for m in ("precision", "recall", "digit_accuracy"))]


MEANFLOW_ARMS = {"SiT + RoPE": "meanflow-sit-rope", "ViT5G": "meanflow-vit5g"}
FLOW_ARMS = {"SiT + RoPE": "sit-rope", "ViT5G": "vit5-nols"}


def test_meanflow_table_is_the_study_records():
    checked, budget = 0, None
    for row in _rows("docs/meanflow.md"):
        if " / " in row[0] and row[0].replace(",", "").replace(" / ", "").isdigit():
            budget = tuple(int(x.replace(",", "")) for x in row[0].split(" / "))  # (flow steps, MeanFlow steps)
        model = row[1] if len(row) > 1 else ""
        if m := re.match(r"flow (SiT \+ RoPE|ViT5G), Euler 6, unguided / guidance 6 \((\d+) seeds\)$", model):
            arm, n = FLOW_ARMS[m.group(1)], int(m.group(2))
            assert n == len(_fid(GENERATION, arm, budget[0]).seeds), f"{model}: the flow study has more seeds"
            want = [_both(GENERATION, arm, budget[0], "fid", 1, n, sd=True),
                    _both(GENERATION, arm, budget[0], "sfid", 1, n),
                    *(_both(GENERATION, arm, budget[0], k, 3, n) for k in ("precision", "recall", "digit_accuracy"))]
        elif m := re.match(r"MeanFlow (SiT \+ RoPE|ViT5G), (\d) steps? \((\d) seeds: ([\d., ]+)\)$", model):
            arm, nfe, n = MEANFLOW_ARMS[m.group(1)], int(m.group(2)), int(m.group(3))
            fid = _fid(MEANFLOW[nfe], arm, budget[1])
            assert n == fid.n and m.group(4) == ", ".join(f"{v:.1f}" for v in fid.values), model
            want = _metrics(MEANFLOW[nfe], arm, budget[1])
        elif m := re.match(r"MeanFlow SiT \+ RoPE, (\d) steps?(, the last 750 steps with the wide time sampler)?",
                           model):
            if budget != (4800, 3000):
                continue
            record = MEANFLOW_WIDE if m.group(2) else MEANFLOW_LONG[int(m.group(1))]
            arm = "meanflow-wide" if m.group(2) else "meanflow-sit-rope"
            want = _metrics(record, arm, 3000)
        else:
            continue
        assert row[2:7] == want, f"docs/meanflow.md, {budget} {model}: the record says {want}"
        checked += 1
    assert checked == 6 + 12 + 3  # every flow and MeanFlow row of the table


def test_meanflow_text_ratios_and_flow_figures_are_the_tables():
    flow = {f: (_fid(GENERATION, "sit-rope", f), _fid(GENERATION, "vit5-nols", f)) for f in FLOW_STEP.values()}
    guided = {f: (_fid(GENERATION, "sit-rope", f, 6), _fid(GENERATION, "vit5-nols", f, 6)) for f in FLOW_STEP.values()}
    one = {FLOW_STEP[s]: (_fid(MEANFLOW[1], "meanflow-sit-rope", s), _fid(MEANFLOW[1], "meanflow-vit5g", s))
           for s in FLOW_STEP}
    two = {FLOW_STEP[s]: (_fid(MEANFLOW[2], "meanflow-sit-rope", s), _fid(MEANFLOW[2], "meanflow-vit5g", s))
           for s in FLOW_STEP}

    def ratios(step: int, i: int) -> str:
        return f"{one[step][i].mean / flow[step][i].mean:.2f}x ({one[step][i].mean / guided[step][i].mean:.2f}x)"

    (r, v), (fr, fv) = one[3600], flow[3600]
    bold = [ratios(3600, i).replace(" (", "** (") for i in (0, 1)]  # the 3,600 ratios in bold
    _said("docs/meanflow.md", f"at the 1,200-step budget {ratios(1200, 0)} for SiT + RoPE and {ratios(1200, 1)} for "
                              f"ViT5G; at 2,400 {ratios(2400, 0)} and {ratios(2400, 1)}; at 3,600 "
                              f"**{bold[0]} and **{bold[1]}: "
                              f"{r.text()} and {v.text()} against {fr.text()} and {fv.text()} ({r.n} MeanFlow seeds, "
                              f"{fr.n} flow seeds)")
    _said("docs/meanflow.md", "the flow models' FID keeps falling (" + " -> ".join(
        f"{flow[f][0].mean:.1f}" for f in (1200, 2400, 3600)) + " for SiT + RoPE)")
    digits = [cell(GENERATION, a, 3600, cfg_scale=6, metric="digit_accuracy").mean for a in ("sit-rope", "vit5-nols")]
    _said("docs/meanflow.md", f"(flow, guided: {100 * digits[0]:.1f}% / {100 * digits[1]:.1f}%)")
    (t_r, t_v), (g_r, g_v) = two[3600], guided[3600]
    _said("docs/meanflow.md", f"2 calls give FID {t_r.text()} (SiT + RoPE, {t_r.mean / fr.mean:.2f}x) and "
                              f"{t_v.text()} (ViT5G, {t_v.mean / fv.mean:.2f}x) against the flow models' 6 calls "
                              f"({fr.mean:.1f}, {fv.mean:.1f}) and 12 guided ({g_r.mean:.1f}, {g_v.mean:.1f})")
    _said("docs/meanflow.md", f"at 2,400 {two[2400][0].text()} / {two[2400][1].text()} against "
                              f"{flow[2400][0].mean:.1f} / {flow[2400][1].mean:.1f}.")
    _said("docs/meanflow.md", f"to **59.5**, {59.5 / fr.mean:.2f}x the flow model's {fr.mean:.1f}:")


def test_meanflow_backbone_figures_are_the_record():
    one = [_fid(MEANFLOW[1], arm, 2250) for arm in ("meanflow-sit-rope", "meanflow-vit5g")]
    two = [_fid(MEANFLOW[2], arm, 2250) for arm in ("meanflow-sit-rope", "meanflow-vit5g")]
    pair = next(c for d in MEANFLOW[1]["decisions"] for c in d["comparisons"])
    assert (pair["arm"], pair["against"]) == ("meanflow-sit-rope", "meanflow-vit5g")
    lo, hi = (-x for x in reversed(pair["paired_t"]))  # ViT5G against SiT + RoPE, as the page says it
    _said("docs/meanflow.md", f"level in one step ({one[0].text()} against {one[1].text()} at 3,600: ViT5G ahead by "
                              f"{pair['paired_mean']:.1f}, paired t-interval [{lo:.1f}, {hi:+.1f}],")
    _said("docs/meanflow.md", f"ViT5G is {two[0].mean - two[1].mean:.1f} ahead in two ({two[1].text()} against "
                              f"{two[0].text()}, {two[0].n} seeds)")


# ----------------------------------------------------------------------------------------------------------
# docs/study/README.md: the generation study's table and verdict, the component study's first decision

GENERATION_LABELS = {"SiT (vanilla) (`sit`)": "sit", "ViT5G (ViT-5 no LayerScale) (`vit5-nols`)": "vit5-nols",
                     "ViT5G no registers (`nols-no-registers`)": "nols-no-registers",
                     "SiT + 2D RoPE (`sit-rope`)": "sit-rope"}


def test_generation_results_table_is_the_record():
    checked = 0
    for row in _rows("docs/study/README.md"):
        if row[0] not in GENERATION_LABELS or len(row) != 6:
            continue
        arm, seed = GENERATION_LABELS[row[0]], row[1].replace("\\*", "").replace("†", "").strip()
        if seed.isdigit():
            s = [int(seed)]
            want = [" / ".join(f"{_fid(GENERATION, arm, step, c, s).mean:.1f}" for c in (1.0, 6.0))
                    for step in GENERATION["steps"]]
            want.append(f"{cell(GENERATION, arm, 3600, cfg_scale=6, metric='digit_accuracy', seeds=s).mean:.3f}")
        else:
            m = re.match(r"mean ± sd(?:, (\d) seeds)?$", seed)
            assert m, row
            n = int(m.group(1) or 3)  # the plain rows are the first 3 seeds; "5 seeds" rows every seed
            want = [_both(GENERATION, arm, step, "fid", 1, n, sd=True) for step in GENERATION["steps"]] + [""]
        assert row[2:] == want, f"docs/study/README.md, {arm} {row[1]}: the record says {want}"
        checked += 1
    assert checked == 3 * 4 + 4 + 2 * 3  # 3 seeds and their mean for 4 arms, 2 more seeds and their mean for 2


def test_generation_verdict_figures_are_the_record():
    ahead, paired, diff, (lo, hi) = _unguided_pair()
    rope, nols = _fid(GENERATION, "sit-rope", 3600), _fid(GENERATION, "vit5-nols", 3600)
    _said("docs/study/README.md", f"{rope.text()} against ViT5G's {nols.text()} ({rope.n} seeds each): a lead of "
                                  f"{nols.mean - rope.mean:.1f} FID")
    _said("docs/study/README.md", f"the paired difference {diff:.1f} ±")
    _said("docs/study/README.md", f"**95% t-interval of [{lo:.1f}, {hi:.1f}]**")
    assert ahead == 4 and paired == 5
    rope_g, nols_g = _fid(GENERATION, "sit-rope", 3600, 6), _fid(GENERATION, "vit5-nols", 3600, 6)
    _said("docs/study/README.md", f"{nols_g.text()} (ViT5G) against {rope_g.text()} (SiT + RoPE)")
    guided = next(d for d in GENERATION["decisions"] if d["cfg_scale"] == 6.0)
    pair = next(c for c in guided["comparisons"] if (c["arm"], c["against"]) == ("sit-rope", "vit5-nols"))
    t_lo, t_hi = pair["paired_t"]
    _said("docs/study/README.md", f"paired {pair['paired_mean']:+.1f} ± {pair['paired_sd']:.1f} with a t-interval "
                                  f"of [{t_lo:.1f}, {t_hi:+.1f}], SiT + RoPE ahead in {100 * pair['p_ahead']:.0f}% "
                                  "of resamples")
    sit_u, sit_g = _fid(GENERATION, "sit", 3600), _fid(GENERATION, "sit", 3600, 6)
    _said("docs/study/README.md", f"**SiT (vanilla) is last both ways** ({sit_u.text()} / {sit_g.text()}, "
                                  f"{sit_u.n} seeds)")


COMPONENT_LABELS = {"SiT (vanilla)": "sit", "ViT-5 (paper, LayerScale 1e-4)": "vit5",
                    "ViT-5 without LayerScale": "vit5-nols"}


def test_component_decision_tables_are_the_record():
    """The first study's two decision tables (1,200 and 2,400 steps, 3 seeds, unguided FID-1000, Heun 15)."""
    tables = (ROOT / "docs/study/README.md").read_text().split("| arm | seed 0 | seed 1 | seed 2 | mean ± sd |")[1:]
    assert len(tables) == 2
    for step, table in zip((1200, 2400), tables):
        lines = table.strip().splitlines()[1:]  # after the |---| line, up to the table's end
        lines = lines[:next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
        rows = [[c.strip().replace("**", "") for c in line.strip("|").split("|")] for line in lines]
        assert [r[0] for r in rows] == list(COMPONENT_LABELS)
        for label, *figures in rows:
            fid = _fid(COMPONENTS, COMPONENT_LABELS[label], step, seeds=3)
            assert figures == [f"{v:.1f}" for v in fid.values] + [fid.text()], (step, label, fid)


def test_component_study_summary_and_ablations_are_the_record():
    """docs/study/README.md's summary of the first study (3 seeds) and its single-component ablations (2 seeds
    each, against the same two seeds of the base arm, paired by seed in the component table)."""
    nols, paper, sit = ((_fid(COMPONENTS, arm, 1200, seeds=3), _fid(COMPONENTS, arm, 2400, seeds=3))
                        for arm in ("vit5-nols", "vit5", "sit"))
    _said("docs/study/README.md", f"ViT-5 without LayerScale {nols[0].text()}, the paper's ViT-5 {paper[0].text()}, "
                                  f"SiT {sit[0].text()} (FID-1000;")
    _said("docs/study/README.md", f"**at 2,400 steps** ({nols[1].n} seeds each) {nols[1].text()}, {paper[1].text()} "
                                  f"and {sit[1].text()}")
    fig = {arm: [_fid(COMPONENTS, arm, step, seeds=2).text() for step in (1200, 2400)] for arm in (
        "nols-no-rope", "nols-no-registers", "nols-no-qknorm", "nols-layernorm", "nols-qkv-bias", "nols-learned-ape")}
    base = [f"{_fid(COMPONENTS, 'vit5-nols', step, seeds=2).mean:.1f}" for step in (1200, 2400)]
    for sentence in (
            f"without 2D RoPE {fig['nols-no-rope'][0]} at 1,200 and {fig['nols-no-rope'][1]} at 2,400",
            f"without the 4 registers {fig['nols-no-registers'][0]} and, at 2,400, {fig['nols-no-registers'][1]}",
            f"without QK-norm {fig['nols-no-qknorm'][0]} at 1,200 and {fig['nols-no-qknorm'][1]} at 2,400",
            f"instead of RMSNorm {fig['nols-layernorm'][0]} at 1,200 and {fig['nols-layernorm'][1]} at 2,400, against "
            f"{base[0]} and {base[1]} for the same two seeds",
            f"QKV bias back on {fig['nols-qkv-bias'][0]} and learned APE {fig['nols-learned-ape'][0]} at 1,200 (both "
            f"seeds), at 2,400 {fig['nols-qkv-bias'][1]} and {fig['nols-learned-ape'][1]}"):
        _said("docs/study/README.md", sentence)
    deltas = []
    for arm, name in (("nols-no-rope", "no 2D RoPE"), ("nols-no-registers", "no registers"),
                      ("nols-no-qknorm", "no QK-norm"), ("nols-layernorm", "LayerNorm"),
                      ("nols-qkv-bias", "QKV bias"), ("nols-learned-ape", "learned APE")):
        paired = Cell((0, 1), tuple(a - b for a, b in zip(_fid(COMPONENTS, arm, 2400, seeds=2).values,
                                                          _fid(COMPONENTS, "vit5-nols", 2400, seeds=2).values)))
        deltas.append((name, f"{paired.mean:+.1f} ± {paired.sd:.1f}"))
    (first, delta), *others = deltas  # the largest, RoPE's, in bold
    _said("docs/study/README.md", f"At 2,400 steps, 2 seeds each: {first} **{delta}**, "
                                  + ", ".join(f"{name} {d}" for name, d in others))


def test_which_preset_sentence_is_the_record():
    """The plain-words pick (five seeds): the guided sFID, precision and recall of ViT5G against SiT + RoPE."""
    (s_n, s_r), (p_n, p_r), (r_n, r_r) = ([cell(GENERATION, a, 3600, cfg_scale=6, metric=m)
                                           for a in ("vit5-nols", "sit-rope")] for m in ("sfid", "precision", "recall"))
    _said("docs/study/README.md", f"(sFID {s_n.text()} against {s_r.text()}, precision {p_n.mean:.3f} against "
                                  f"{p_r.mean:.3f}, recall {r_n.mean:.3f} against {r_r.mean:.3f}, {s_n.n} seeds each)")


def test_one_step_demo_repa_and_layerscale_figures_are_the_record():
    """The single-seed figures: the old one-step demo (MeanFlow SiT + RoPE seed 0 trained on to 3,000 steps), REPA's
    first comparison and the LayerScale placements (seed 0 at 1,200 steps)."""
    def one(record: dict, arm: str, step: int, metric: str = "fid") -> float:
        return cell(record, arm, step, metric=metric, seeds=[0]).mean

    fid1, acc1 = one(MEANFLOW_LONG[1], "meanflow-sit-rope", 3000), one(MEANFLOW_LONG[1], "meanflow-sit-rope", 3000,
                                                                         "digit_accuracy")
    fid2 = one(MEANFLOW_LONG[2], "meanflow-sit-rope", 3000)
    before = one(MEANFLOW_LONG[1], "meanflow-sit-rope", 2250, "digit_accuracy")
    _said("docs/demo.md", f"guidance 3 trained in) had FID-1K {fid1:.1f} in one step")  # the one-step demo before #51
    _said("docs/meanflow.md", f"the one-step FID stays put ({one(MEANFLOW_LONG[1], 'meanflow-sit-rope', 2250):.1f} -> "
                              f"{fid1:.1f}) while the digits go {100 * before:.1f}% -> {100 * acc1:.1f}% and 2 steps "
                              f"{one(MEANFLOW_LONG[2], 'meanflow-sit-rope', 2250):.1f} -> {fid2:.1f}")
    repa, plain = one(COMPONENTS, "vit5-repa", 1200), one(COMPONENTS, "vit5", 1200)
    _said("README.md", f"FID-1000 {repa:.1f} with vs {plain:.1f} without, one seed")
    _said("docs/repa/README.md", f"| ViT5-T/4 (paper preset) | {plain:.1f} |")
    _said("docs/repa/README.md", f"| ViT5-T/4 + REPA (block 2, weight 0.5, the MNIST encoder) | {repa:.1f} |")
    ls1, gate1, nols = (one(COMPONENTS, arm, 1200) for arm in ("ls1", "ls-gate1", "vit5-nols"))
    _said("docs/study/README.md", f"initialised at 1 **{ls1:.1f}**, level with no LayerScale ({nols:.1f} on the same "
                                  f"seed), and LayerScale 1e-4 with gates initialised at 1 **{gate1:.1f}**, level "
                                  f"with the paper preset ({plain:.1f})")


# ----------------------------------------------------------------------------------------------------------
# The reports themselves: each committed study.md is what the report writes from its study.json today

@pytest.mark.parametrize("spec_file", sorted((ROOT / "configs" / "study").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_committed_report_is_its_records_report(spec_file, monkeypatch):
    from vit5_sit.study.report import format_report, saved_rows
    from vit5_sit.study.spec import load_study

    monkeypatch.chdir(ROOT)  # the specs name their results folder relative to the repository
    spec = load_study(spec_file)
    results = Path(spec.results_dir)
    assert (results / "study.json").is_file(), f"{spec_file.name}: no committed record in {results}"
    rows = saved_rows(spec, results / "study.json", log=lambda *_: None)
    command = f"python -m vit5_sit.study report {spec_file.relative_to(ROOT)}"
    assert format_report(spec, rows) == (results / "study.md").read_text(), f"{results}/study.md: run {command}"


# ----------------------------------------------------------------------------------------------------------
# The helper itself

def test_cell_takes_every_seed_the_first_n_or_named_seeds_and_names_a_missing_one():
    every, first3 = _fid(GENERATION, "sit-rope", 3600), _fid(GENERATION, "sit-rope", 3600, seeds=3)
    assert every.seeds == (0, 1, 2, 3, 4) and first3.seeds == (0, 1, 2) and first3.values == every.values[:3]
    assert _fid(GENERATION, "sit-rope", 3600, seeds=[4, 0]).values == (every.values[4], every.values[0])
    one = _fid(MEANFLOW_WIDE, "meanflow-wide", 3000)
    assert one.n == 1 and one.sd is None and one.text() == f"{one.mean:.1f}"
    main = [r["fid"] for r in GENERATION["rows"] if (r["arm"], r["step"], r["cfg_scale"], r["sample_seed"]) ==
            ("sit", 3600, 1.0, 0)]
    assert sorted(_fid(GENERATION, "sit", 3600).values) == sorted(main)  # the sampling-noise rows left out
    with pytest.raises(KeyError, match=r"no fid of sit at step 3600, cfg 1, seeds \[3\] \(scored: \[0, 1, 2\]\)"):
        _fid(GENERATION, "sit", 3600, seeds=[3])
    with pytest.raises(KeyError, match="seeds"):
        _fid(GENERATION, "sit", 3600, seeds=4)


def test_included_tables_are_their_generated_files():
    """Every `<!-- include FILE -->` block of a page is FILE's generated table (benchmarks/include_tables.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("include_tables", ROOT / "benchmarks" / "include_tables.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"]
    for page in pages:
        text = page.read_text()
        for m in tool.BLOCK.finditer(text):
            assert m.group("body") == tool.body(m.group("path")), f"{page.name}: {m.group('path')} (run " \
                "python benchmarks/include_tables.py on it)"
        assert tool.refreshed(text) == text, page.name


# Figures quoted from bench_guidance.py records other than the demo's frontier (docs/study/meanflow-convert/*.json,
# docs/study/guidance/*.json), written "`RECORD CELL`: FID-1K F, D% of digits, speckle S%", each checked against
# the record's sample-seed-0 row (RECORD: the file's path below docs/study without .json).
RECORD_QUOTE = re.compile(r"`(?P<record>[\w./-]+) (?P<cell>(?:cfg|auto:\w+)@[\d.]+(?:@[\d.]+-[\d.]+)?)`: FID-1K "
                          r"(?P<fid>[\d.]+), (?P<digits>[\d.]+)% of digits, speckle (?P<speckle>[\d.]+)%")


def test_quoted_record_figures_are_the_records():
    found = 0
    for page in ("README.md", "docs/meanflow.md", "docs/demo.md", "docs/sampling.md", "benchmarks/README.md"):
        text = re.sub(r"\s+", " ", (ROOT / page).read_text())  # a quote broken over two lines is still one
        looks = re.findall(r"`[\w./-]+/[\w.-]+ (?:cfg|auto)[^`]*`: FID", text)
        quotes = list(RECORD_QUOTE.finditer(text))
        assert len(looks) == len(quotes), f"{page}: a record quote not in the checked form: {looks}"
        for m in quotes:
            rows = {r["cell"]: r for r in json.loads((ROOT / "docs" / "study" / f"{m['record']}.json").read_text())[
                "rows"] if r["seed"] == 0}
            row = rows[m["cell"]]
            assert (float(m["fid"]), float(m["digits"]), float(m["speckle"])) == (
                round(row["fid"], 1), round(100 * row["digit_accuracy"], 1), round(100 * row["speckle"], 2)), \
                f"{page}: {m.group(0)}"
            found += 1
    assert found >= 4, "docs/meanflow.md quotes the converted models' figures"


def test_the_one_step_speed_up_quoted_is_the_sampling_benchmarks():
    """README and docs/demo.md quote how much faster the one-step demo samples than the flow demo's default: the
    ratio of the two rows of `bench_meanflow.py --sampling` in benchmarks/README.md (to its printed rounding)."""
    bench = (ROOT / "benchmarks" / "README.md").read_text()
    rows = dict(re.findall(r"^\| (demo|demo-1step) \| [^|]+ \| \d+ \| ([\d.]+) \|", bench, re.M))
    ratio = float(rows["demo"]) / float(rows["demo-1step"])
    for page in ("README.md", "docs/demo.md", "benchmarks/README.md"):
        quoted = re.findall(r"([\d.]+)x faster than the flow demo", _page(page))
        assert quoted, f"{page}: says how much faster the one-step demo samples"
        assert abs(float(quoted[0]) - ratio) <= 0.06, f"{page}: {quoted[0]}x, the benchmark's rows give {ratio:.2f}x"


def _tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_conversion_summary_is_generated_from_the_records():
    """docs/study/meanflow-convert/summary.md (issue #51 (b), included in docs/meanflow.md) is what
    benchmarks/convert_summary.py writes from the committed records, and marks a missed target in italics."""
    tool = _tool("convert_summary")
    assert (ROOT / "docs/study/meanflow-convert/summary.md").read_text() == tool.table(), \
        "run python benchmarks/convert_summary.py --md docs/study/meanflow-convert/summary.md"
    flow = {"fid": 50.0, "digit_accuracy": 0.9, "speckle": 0.001}
    assert tool.scored({"fid": 60.0, "digit_accuracy": 0.99, "speckle": 0.003}, flow) == \
        "60.0 (1.20x) / 99.0% / 0.30% (3.0x)"  # each target met at its bound
    assert tool.scored({"fid": 60.1, "digit_accuracy": 0.989, "speckle": 0.0031}, flow) == \
        "*60.1 (1.20x)* / *98.9%* / *0.31% (3.1x)*"


def test_the_scratch_comparison_is_generated_from_the_records():
    """docs/study/imf-scratch/summary.md (issue #51 (a), included in docs/meanflow.md) is what
    benchmarks/scratch_summary.py writes from the MeanFlow study's records and the iMF runs' records; its MeanFlow
    rows are the figures the page's main table quotes (160.7 ± 0.8 at 750 steps, SiT + RoPE, one step)."""
    tool = _tool("scratch_summary")
    text = tool.table()
    assert (ROOT / "docs/study/imf-scratch/summary.md").read_text() == text, \
        "run python benchmarks/scratch_summary.py --md docs/study/imf-scratch/summary.md"
    assert "| SiT + RoPE | 1 | MeanFlow (750) | 3, trained in | 160.1, 161.3 | **160.7 ± 0.8** | 28.8% |  |" in text
    assert "**160.7 ± 0.8**" in _page("docs/meanflow.md")
