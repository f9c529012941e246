"""The study report's intervals (issue #46): the statistics of `vit5_sit.study.intervals` against analytic values,
and the report's new lines on a tiny synthetic study, with 3 seeds and with arms of 5 and 3 seeds."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from vit5_sit.study import Arm, DecisionSpec, EvalSpec, StudySpec, component_deltas, decide
from vit5_sit.study import intervals as iv
from vit5_sit.study.report import format_report, write_report


def _exact_p_ahead(d: list[float]) -> float:
    """P(mean of a resample of the paired differences d < 0), ties half, over all n^n equally likely draws."""
    means = [np.mean(pick) for pick in itertools.product(d, repeat=len(d))]
    return (sum(m < 0 for m in means) + 0.5 * sum(m == 0 for m in means)) / len(means)


def test_percentile_bootstrap_of_a_constant_sample_is_that_constant():
    assert iv.bootstrap_interval([55.0, 55.0, 55.0]) == (55.0, 55.0)
    low, high = iv.bootstrap_interval([0.1] * 5)
    assert low == pytest.approx(0.1, abs=1e-15) and high == pytest.approx(0.1, abs=1e-15)
    assert iv.bootstrap_interval([3.0]) is None  # one seed: no interval


def test_bootstrap_interval_stays_within_the_values_and_matches_the_exact_resample_distribution():
    # Two values 0 and 1: the resampled mean is 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and
    # 97.5% percentiles are 0 and 1 (every one of the 10,000 draws has both tails well populated).
    assert iv.bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    values = [53.6, 58.1, 55.2]
    low, high = iv.bootstrap_interval(values)
    assert min(values) <= low < np.mean(values) < high <= max(values)


def test_bootstrap_is_reproducible_with_its_seed_and_changes_with_another():
    values = [57.9, 62.9, 58.5, 61.0, 55.3]
    assert iv.bootstrap_interval(values) == iv.bootstrap_interval(values)
    assert np.array_equal(iv.bootstrap_means(values, seed=1), iv.bootstrap_means(values, seed=1))
    assert not np.array_equal(iv.bootstrap_means(values, seed=1), iv.bootstrap_means(values, seed=2))
    a, b = {0: 1.0, 1: 5.0, 2: 2.0}, {0: 3.0, 1: 2.0, 2: 4.0}
    assert iv.compare(a, b) == iv.compare(a, b)


@pytest.mark.parametrize("df,quantile", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042),
                                         (35, 2.042), (1000, 1.980)])
def test_t_quantile_table(df, quantile):
    assert iv.t_quantile(df) == pytest.approx(quantile, abs=5e-4)


def test_t_quantile_table_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in list(range(1, 31)) + [40, 60, 120]:
        assert iv.t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=6e-4)
    for df in (31, 45, 100, 1000):  # between the tabulated df: never narrower than the exact interval
        assert iv.t_quantile(df) >= stats.t.ppf(0.975, df) - 6e-4
    with pytest.raises(ValueError, match="df must be >= 1"):
        iv.t_quantile(0)


def test_t_interval_of_three_values():
    low, high = iv.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1
    half = 4.303 / math.sqrt(3)
    assert low == pytest.approx(2 - half) and high == pytest.approx(2 + half)
    assert iv.t_interval([4.0]) is None
    assert iv.t_interval([7.0, 7.0]) == (7.0, 7.0)


def test_distinct_resamples_counts_multisets():
    for n in range(1, 6):
        multisets = {tuple(sorted(p)) for p in itertools.product(range(n), repeat=n)}
        assert iv.distinct_resamples(n) == len(multisets)
    assert (iv.distinct_resamples(3), iv.distinct_resamples(5)) == (10, 126)


def test_identical_arms_are_level_a_tie_counted_half():
    a = {0: 57.9, 1: 62.9, 2: 58.5}
    c = iv.compare(a, dict(a))
    assert c.diff == 0 and c.interval == (0.0, 0.0)
    assert c.ties == 1.0 and c.p_ahead == 0.5 and c.paired


def test_paired_differences_that_cancel_tie_in_half_the_resamples():
    # d = (-1, +1): the resampled mean is -1, 0, +1 with probabilities 1/4, 1/2, 1/4, so P(ahead) = 1/4 + 1/2 / 2.
    c = iv.compare({0: 10.0, 1: 12.0}, {0: 11.0, 1: 11.0})
    assert c.ties == pytest.approx(0.5, abs=0.02)
    assert _exact_p_ahead([-1.0, 1.0]) == 0.5 and c.p_ahead == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize("d", [[0.2, -9.3, -3.3], [-3.0, -1.0, 2.0], [-2.0, 1.0], [-1.0, -2.0, 4.0, 0.5, -0.5]])
def test_paired_probability_matches_the_exact_resample_distribution(d):
    b = {s: 50.0 + 3 * s for s in range(len(d))}
    a = {s: b[s] + d[s] for s in b}
    c = iv.compare(a, b)
    assert c.paired and c.distinct == iv.distinct_resamples(len(d))
    assert c.diff == pytest.approx(np.mean(d))
    assert c.p_ahead == pytest.approx(_exact_p_ahead(d), abs=0.015)  # 10,000 draws: sd of the estimate < 0.005


def test_pairing_takes_out_what_the_seed_shares():
    # Arm a is 1 FID worse than b on every seed, and the seeds spread by 100: paired, a is never ahead.
    b = {0: 0.0, 1: 100.0, 2: 200.0}
    a = {s: v + 1 for s, v in b.items()}
    assert iv.compare(a, b).p_ahead == 0.0
    # b has a fourth seed a lacks: the shared seeds are drawn as pairs, b's own seed within b. With S the sum of a
    # resample of the shared b-values, mean(a) = (S + 3) / 3 and mean(b) = (S + 100) / 4, so a is ahead when S < 288,
    # i.e. when the three draws from (0, 100, 200) sum to at most 200: 10 of the 27 equally likely draws.
    c = iv.compare(a, {**b, 3: 100.0})
    assert c.shared == (0, 1, 2) and c.only_b == (3,) and not c.paired
    assert c.p_ahead == pytest.approx(10 / 27, abs=0.015)


def test_few_seeds_and_percent_words():
    assert iv.few_seeds(3) and iv.few_seeds(4) and not iv.few_seeds(5)
    assert [iv.percent(p) for p in (0.0, 0.004, 0.93, 0.9963, 1.0)] == ["0%", "< 1%", "93%", "> 99%", "100%"]


# The report on a tiny synthetic study.

def _row(arm, seed, step, fid, cfg=1.0):
    return {"arm": arm, "seed": seed, "step": step, "sample_seed": 0, "cfg_scale": cfg, "fid": fid}


def _study(ref_seeds=(0, 1, 2), rope_seeds=(0, 1, 2)) -> StudySpec:
    arms = (Arm("sit", "sit.yaml", seeds=(0, 1, 2), label="SiT (vanilla)"),
            Arm("ref", "ref.yaml", seeds=ref_seeds, label="ViT5G (no LayerScale)"),
            Arm("rope", "sit.yaml", ("model.rope=true",), seeds=rope_seeds, label="SiT + 2D RoPE"),
            Arm("noreg", "ref.yaml", ("model.num_registers=0",), seeds=(0, 1, 2), label="no registers"))
    return StudySpec(name="t", output_dir="runs", results_dir="out", steps=(100,), arms=arms,
                     eval=EvalSpec(noise_seed=None, metrics=("fid",)),
                     decision=DecisionSpec(reference="ref", candidates=("ref", "sit", "rope", "noreg"), baseline="sit",
                                           min_seeds=3))


# FID by seed: the generation study's at 3,600 steps, unguided.
FID = {"sit": [66.8, 77.7, 63.3], "ref": [57.9, 62.9, 58.5], "rope": [58.1, 53.6, 55.2], "noreg": [57.5, 55.4, 56.2]}


def _rows(fid=FID) -> list[dict]:
    return [_row(arm, s, 100, v) for arm, values in fid.items() for s, v in enumerate(values)]


def test_report_gives_intervals_and_the_probability_of_the_ordering_in_words():
    spec, rows = _study(), _rows()
    d = decide(spec, rows)
    assert d["resolved"] and d["winner"] == "rope"  # the rule as before
    head = next(c for c in d["comparisons"] if c["arm"] == "rope" and c["against"] == "ref")
    assert head["p_ahead"] == pytest.approx(26 / 27, abs=0.015)  # only the draw s0, s0, s0 has rope behind
    assert head["paired_mean"] == pytest.approx(-4.1333, abs=1e-3)
    assert {(c["arm"], c["against"]) for c in d["comparisons"]} == {
        ("sit", "ref"), ("rope", "ref"), ("noreg", "ref"), ("rope", "sit"), ("noreg", "sit")}
    text = format_report(spec, rows)
    verdict = text.split("## Verdict")[1].split("##")[0]
    assert ("- Unguided (cfg 1): `rope` replaces `ref`: 4.1 FID ahead" in verdict
            and "SiT + 2D RoPE (`rope`) is ahead of ViT5G (`ref`) in 96% of bootstrap resamples of the 3 training "
            "seeds, paired by seed" in verdict)
    low, high = head["paired_t"]
    assert f"t 95% [{low:+.1f}, {high:+.1f}]" in verdict and low < 0 < high
    assert "only 10 distinct resamples" in verdict and "the t-interval" in verdict
    assert "(it includes 0: 3 seeds do not establish the ordering at 95%)" in verdict
    # Every arm's mean with both intervals, marked as resting on few seeds, and the note that says why.
    b, t = iv.bootstrap_interval(FID["ref"]), iv.t_interval(FID["ref"])
    assert (f"| ViT5G (no LayerScale) | 59.8 [{b[0]:.1f}, {b[1]:.1f}] t [{t[0]:.1f}, {t[1]:.1f}] (3 seeds†) |"
            in text)
    assert "† fewer than 5 training seeds" in text and "10 for 3" in text
    # The component table's paired change with its intervals and probability: rope lowers FID on every seed.
    assert "| SiT + 2D RoPE | `sit` | -13.6 [" in text and "lower in 100% (3 seeds†) |" in text
    assert "`rope` | `ref` | 3 / 3† | -4.1 |" in text


def test_every_seed_ahead_is_said_to_be_a_sign_not_a_certainty():
    spec = _study()
    text = format_report(spec, _rows({**FID, "rope": [70.0, 71.0, 72.0]}))  # rope now last; noreg leads on each seed
    assert ("no registers (`noreg`) is ahead of ViT5G (`ref`) in 100% of bootstrap resamples of the 3 training "
            "seeds, paired by seed (every seed has it ahead, so every resample does)") in text
    # the reference ahead of the best other: the sentence is said from the arm that leads
    fid = {**FID, "ref": [50.0, 51.0, 52.0]}
    d = decide(spec, _rows(fid))
    assert d["winner"] == "ref" and d["ranking"][0][0] == "ref"
    assert "ViT5G (`ref`) is ahead of SiT + 2D RoPE (`rope`) in 100%" in format_report(spec, _rows(fid))


def test_report_works_unchanged_with_five_seeds_for_some_arms(tmp_path):
    spec = _study(ref_seeds=(0, 1, 2, 3, 4), rope_seeds=(0, 1, 2, 3, 4))
    fid = {**FID, "ref": FID["ref"] + [60.0, 61.5], "rope": FID["rope"] + [57.0, 54.5]}
    rows = _rows(fid)
    d = decide(spec, rows)
    comps = {(c["arm"], c["against"]): c for c in d["comparisons"]}
    five = comps["rope", "ref"]
    assert five["shared"] == (0, 1, 2, 3, 4) and five["distinct"] == 126 and five["n"] == 5
    mixed = comps["noreg", "ref"]  # 3 seeds against 5: the 3 shared paired, seeds 3 and 4 of ref within ref
    assert mixed["shared"] == (0, 1, 2) and mixed["only_b"] == (3, 4)
    assert mixed["diff"] == pytest.approx(np.mean(FID["noreg"]) - np.mean(fid["ref"]))
    assert mixed["paired_mean"] == pytest.approx(np.mean(np.subtract(FID["noreg"], FID["ref"])))
    text = format_report(spec, rows)
    assert "`rope` | `ref` | 5 / 5 |" in text  # no dagger at 5 seeds
    assert "`noreg` | `ref` | 3 / 5 (3 shared)† |" in text
    sentence = next(line for line in text.splitlines() if line.startswith("- Unguided"))
    assert "SiT + 2D RoPE (`rope`) is ahead of ViT5G (`ref`) in" in sentence and "of the 5 training seeds" in sentence
    assert "distinct resamples" not in sentence  # 5 seeds: no longer marked as too few
    assert "(5 seeds) |" in text and "(3 seeds†) |" in text
    # study.json carries the intervals, and a report from it alone (no run folders) is the same text
    write_report(spec, rows, tmp_path, log=lambda *_: None)
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["intervals"]["resamples"] == iv.RESAMPLES and saved["intervals"]["seed"] == iv.SEED
    assert {m["arm"]: m["n"] for m in saved["intervals"]["fid_means"]} == {"sit": 3, "ref": 5, "rope": 5, "noreg": 3}
    assert saved["decisions"][0]["comparisons"][0]["p_ahead"] == d["comparisons"][0]["p_ahead"]
    first = (tmp_path / "study.md").read_text()
    write_report(spec, [], tmp_path, log=lambda *_: None)
    again = (tmp_path / "study.md").read_text()
    assert again.split("## Verdict")[1] == first.split("## Verdict")[1]


def test_components_with_two_seeds_get_intervals_and_one_seed_none():
    spec = _study()
    rows = [_row("sit", 0, 100, 60.0), _row("sit", 1, 100, 70.0), _row("rope", 0, 100, 50.0),
            _row("rope", 1, 100, 64.0), _row("ref", 0, 100, 55.0), _row("noreg", 0, 100, 51.0)]
    deltas = {d["arm"]: d for d in component_deltas(spec, rows)}
    rope = deltas["rope"]  # d = (-10, -6): mean -8, sd 2.83, t half-width 12.706 * 2.83 / sqrt(2)
    assert rope["t"] == pytest.approx((-8 - 12.706 * 2, -8 + 12.706 * 2), abs=1e-3)
    assert rope["bootstrap"] == (-10.0, -6.0) and rope["p_lower"] == 1.0
    assert deltas["noreg"]["bootstrap"] is None and deltas["noreg"]["p_lower"] is None
    text = format_report(spec, rows)
    assert "| SiT + 2D RoPE | `sit` | -8.0 [-10.0, -6.0] t [-33.4, +17.4]; lower in 100% (2 seeds†) |" in text
    assert "| no registers | `ref` | -4.0 (1 seed: no interval) |" in text
    assert "Not decidable yet" in text  # the rule needs 3 seeds: no comparison is made up
