"""Seed statistics of the held-out evaluation (gkd_harness.analysis.signoff.outcome) and the patched_not_worse criterion, on synthetic run
folders (gkd_harness.bench.synthetic.write_run plus eval/* rows), checked against a hand computation."""

import json
import math

import pytest

from gkd_harness.analysis.signoff.criteria import evaluate
from gkd_harness.analysis.signoff.criteria_file import load_criteria
from gkd_harness.analysis.signoff.outcome import final_values, paired_differences, pooled, t_interval, variant_table
from gkd_harness.analysis.sweep.runs import load_sweep
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import EVAL_FORWARD_KL, EVAL_JSD, EVAL_REVERSE_KL, EVAL_TOP1_AGREEMENT, METRICS_FILE

STEPS = 10
#: final eval/jsd by (precision, seed); an earlier evaluation at step 5 is 2x larger (must not be the one used)
FINAL = {
    ("native", 1): 0.010,
    ("native", 2): 0.012,
    ("native", 3): 0.011,
    ("fp32", 1): 0.0095,
    ("fp32", 2): 0.0118,
    ("fp32", 3): 0.0104,
}
# t(0.975, 2), the 97.5% quantile of Student's t with 2 degrees of freedom, in closed form: with 2 degrees of freedom
# the CDF is 1/2 + t / (2 sqrt(2 + t^2)), so F(t) = 0.975 gives t^2 = 2 * 0.95^2 / (1 - 0.95^2) (tables: 4.303)
T2 = math.sqrt(2 * 0.95**2 / (1 - 0.95**2))


def _add_eval(folder, final_jsd):
    with open(folder / METRICS_FILE, "a") as f:
        for step, jsd in ((5, 2 * final_jsd), (STEPS, final_jsd)):
            f.write(
                json.dumps(
                    {
                        "step": step,
                        EVAL_JSD: jsd,
                        EVAL_FORWARD_KL: 4 * jsd,
                        EVAL_REVERSE_KL: 3 * jsd,
                        EVAL_TOP1_AGREEMENT: 0.9,
                    }
                )
                + "\n"
            )


def _declare_eval(folder, every=5):
    """The run's config as gkd-train records it with the held-out evaluation on (monitor.eval.every_n_steps)."""
    s = json.loads((folder / "summary.json").read_text())
    s["config"]["monitor.eval.every_n_steps"] = every
    (folder / "summary.json").write_text(json.dumps(s))


def _sweep(root, values=FINAL, with_eval=True, declare_eval=True, **kw):
    for (prec, seed), v in values.items():
        folder = write_run(
            root / f"loss={prec},run.seed={seed}",
            beta=0.5,
            beta_form="paper",
            precision=prec,
            seed=seed,
            steps=STEPS,
            spot_every=5,
            **kw,
        )
        if with_eval:
            _add_eval(folder, v)
        if declare_eval:
            _declare_eval(folder)
    return load_sweep(root)


def _hand_mean_ci(xs):
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, m - T2 * sd / math.sqrt(n), m + T2 * sd / math.sqrt(n)


def test_t_interval_matches_hand_computation():
    m, lo, hi, n = t_interval([1.0, 2.0, 4.0])
    hm, hlo, hhi = _hand_mean_ci([1.0, 2.0, 4.0])
    assert n == 3 and (m, lo, hi) == pytest.approx((hm, hlo, hhi), rel=1e-12)
    assert math.isnan(t_interval([1.0])[1]) and t_interval([])[3] == 0


def test_variant_means_and_paired_differences_match_hand_computation(tmp_path):
    sweep = _sweep(tmp_path)
    finals = final_values(sweep)
    assert sorted(finals["step"]) == [STEPS] * 6  # the final evaluation, not the one at step 5
    table = variant_table(finals).set_index(["variant", "metric"])
    for prec, variant in (("native", "native/paper"), ("fp32", "fp32/paper")):
        xs = [FINAL[(prec, s)] for s in (1, 2, 3)]
        row = table.loc[(variant, EVAL_JSD)]
        assert row["n"] == 3
        assert (row["mean"], row["low"], row["high"]) == pytest.approx(_hand_mean_ci(xs), rel=1e-12)
        assert table.loc[(variant, EVAL_FORWARD_KL), "mean"] == pytest.approx(4 * sum(xs) / 3, rel=1e-12)
    pairs = paired_differences(finals).set_index("seed")
    for s in (1, 2, 3):
        d = FINAL[("fp32", s)] - FINAL[("native", s)]
        assert pairs.loc[s, f"{EVAL_JSD}:diff"] == pytest.approx(d, rel=1e-12)
        assert pairs.loc[s, f"{EVAL_JSD}:rel"] == pytest.approx(d / FINAL[("native", s)], rel=1e-12)
    pool = pooled(pairs.reset_index()).set_index("metric").loc[EVAL_JSD]
    diffs = [FINAL[("fp32", s)] - FINAL[("native", s)] for s in (1, 2, 3)]
    rels = [d / FINAL[("native", s)] for d, s in zip(diffs, (1, 2, 3))]
    assert (pool["diff_mean"], pool["diff_low"], pool["diff_high"]) == pytest.approx(_hand_mean_ci(diffs), rel=1e-9)
    assert (pool["rel_mean"], pool["rel_low"], pool["rel_high"]) == pytest.approx(_hand_mean_ci(rels), rel=1e-9)


def _criterion(sweep, margin=None):
    plan = {"patched_not_worse": {"margin": margin}} if margin is not None else None
    _, results = evaluate(sweep, load_criteria(None, plan))
    return next(r for r in results if r.name == "patched_not_worse")


def test_patched_not_worse_passes_and_fails_on_the_interval_bound(tmp_path):
    # rel = -5%, -1.67%, -5.45%: mean -4.04%, upper bound -4.04% + 4.303 * 2.14% / sqrt(3) = +1.27%: within a 5%
    # margin, beyond the shipped 1% one
    sweep = _sweep(tmp_path / "good")
    r = _criterion(sweep, margin=0.05)
    assert r.status == "pass", r.measured
    rels = [(FINAL[("fp32", s)] - FINAL[("native", s)]) / FINAL[("native", s)] for s in (1, 2, 3)]
    upper = _hand_mean_ci(rels)[2]
    assert f"{upper:+.3%}" in r.measured and "3 seeds" in r.measured and "margin +5.00%" in r.measured
    assert _criterion(sweep).status == "fail"  # the shipped margin, 1%
    worse = {k: (v * 1.08 if k[0] == "fp32" else v) for k, v in FINAL.items()}  # +8% on every seed
    assert _criterion(_sweep(tmp_path / "bad", worse), margin=0.05).status == "fail"


@pytest.mark.parametrize("n_seeds", [3, 8, 30])
def test_a_2_percent_harm_fails_at_any_number_of_seeds_with_the_shipped_margin(tmp_path, n_seeds):
    """Issue 38 item 5: with the 5% margin a candidate 4.9% worse failed at 3 seeds and passed at 8 or more. The
    shipped margin (1%, from the measured seed spread) fails a 2% harm at any number of seeds, since the interval's
    upper bound is never below its mean; the margin is printed with the measurement."""
    base = {("native", s): 0.010 + 0.0001 * s for s in range(1, n_seeds + 1)}
    values = {**base, **{("fp32", s): v * (1.02 + 0.0001 * (s % 3)) for (_, s), v in base.items()}}
    r = _criterion(_sweep(tmp_path / "harm", values))
    assert r.status == "fail" and "margin +1.00%" in r.measured, r.measured
    assert load_criteria().patched_not_worse.margin == 0.01


def test_every_planned_seed_must_pair_and_without_held_out_evaluation_it_does_not_apply(tmp_path):
    unpaired = {("native", 1): 0.01, ("fp32", 2): 0.01, ("fp32", 3): 0.01}
    r = _criterion(_sweep(tmp_path / "unpaired", unpaired))
    assert r.status == "not_measured" and "seed 1: no fp32/paper run" in r.details, r.details
    assert "seed 2: 0 original runs pair with fp32/paper" in r.measured or any("seed 2" in d for d in r.details)
    r = _criterion(_sweep(tmp_path / "noeval", with_eval=False, declare_eval=False))
    assert r.status == "not_applicable" and "no held-out evaluation" in r.measured


@pytest.mark.parametrize("group", ["outcome", "my-candidate"])
def test_patched_not_worse_is_required_where_the_held_out_evaluation_is_configured(tmp_path, group):
    """Issue 38 item 4: the criterion gated only in groups named outcome or precision_ab. It is required because
    the evaluation is configured (whatever the group's name): without its evidence the sign-off fails."""
    assert not load_criteria().patched_not_worse.required
    sweep = _sweep(tmp_path / group, with_eval=False, group=group)
    verdict, results = evaluate(sweep, load_criteria())
    r = next(r for r in results if r.name == "patched_not_worse")
    assert r.status == "not_measured" and "required" in r.applies and verdict == "fail"
    assert _criterion(_sweep(tmp_path / (group + "-eval"), group=group), margin=0.05).status == "pass"


def test_report_section_states_the_effect_and_plots_the_seed_band(tmp_path):
    from gkd_harness.analysis.signoff.document import Document
    from gkd_harness.analysis.signoff.outcome import headline, ratio_decimals, report_section, seed_band

    sweep = _sweep(tmp_path / "sweep")
    rels = [(FINAL[("fp32", s)] - FINAL[("native", s)]) / FINAL[("native", s)] for s in (1, 2, 3)]
    m, lo, hi = (1 + x for x in _hand_mean_ci(rels))
    line = headline(sweep, "native", ["fp32"])
    assert 0.9 < lo < m < 1 < hi < 1.1  # width 0.07: two decimals, as in 0.93× (0.90–0.96)
    assert line == (
        f"fp32/paper ends at {m:.2f}× the original's held-out JSD (95% t interval {lo:.2f}–{hi:.2f}, "
        "3 seeds; no difference resolved)."
    )
    band = seed_band(sweep, EVAL_JSD).set_index(["variant", "step"])
    xs = [FINAL[("native", s)] for s in (1, 2, 3)]
    assert band.loc[("native/paper", STEPS), "n"] == 3
    assert (band.loc[("native/paper", STEPS), "low"], band.loc[("native/paper", STEPS), "high"]) == (min(xs), max(xs))
    assert band.loc[("native/paper", 5), "mean"] == pytest.approx(2 * sum(xs) / 3, rel=1e-12)
    assert [ratio_decimals(w) for w in (0.06, 8e-5, 0.5, 1e-12, 0.0114, 0.0013)] == [2, 5, 2, 9, 3, 4]
    doc = Document("t")
    report_section(sweep, doc, tmp_path, "native", ["fp32"])
    assert line in doc.to_markdown() and (tmp_path / "eval_jsd_bands.png").stat().st_size > 0
