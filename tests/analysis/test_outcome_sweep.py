"""The short outcome sweep end to end (``outcome_sweep`` in tests/conftest.py: ``gkd-train -m experiment=outcome``,
original and fp32 × seeds 1, 2 × 4 steps on model=tiny_distill, evaluation every 2 steps and at the end):

- every run's ``eval/*`` records against an independent FP64 recomputation from its saved final student
  (``checkpoint-4``), the cached teacher and the validation file it was given, with the BF16 teacher cast of
  model=tiny;
- the held-out split is disjoint from the training rows, and the same file for every run (the pairing needs it);
- ``gkd-analyze`` on the sweep reports ``patched_not_worse`` with the first-screen sentence, whose numbers match a
  hand computation from the run folders' final ``eval/jsd`` (Student t with 1 degree of freedom, closed form).
"""

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from gkd_harness.harness.contract import (
    EVAL_FORWARD_KL,
    EVAL_JSD,
    EVAL_REVERSE_KL,
    EVAL_TOKENS,
    EVAL_TOP1_AGREEMENT,
    METRICS_FILE,
    VALIDATION_FILE,
)
from gkd_harness.harness.loss.reference import reference_jsd
from tests.conftest import OUTCOME_EVAL_EVERY, OUTCOME_SEEDS, OUTCOME_STEPS, entry_point

pytestmark = pytest.mark.slow

BETA, TEMPERATURE = 0.5, 0.9  # experiment=outcome's gkd.beta / gkd.temperature (asserted from each run's config)


def _runs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())


def _argv(run: Path) -> list[str]:
    return json.loads((run / "command.json").read_text())["argv"]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _config(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["config"]


def _evals(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / METRICS_FILE).read_text().splitlines() if x.strip()]
    return [r for r in rows if EVAL_JSD in r]


def _prompts(path: Path) -> list[str]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows]


def _active_logits(student_dir: Path, teacher_dir: Path, val: Path):
    """Student (FP32) and teacher (BF16, model.teacher_dtype of model=tiny) logits ``[N, V]`` at the active positions
    of the validation rows, encoded with ms-swift's own template as the trainer encodes them (one row at a time:
    eval batch 1, no padding)."""
    from swift import get_processor, get_template
    from transformers import AutoModelForCausalLM

    proc = get_processor(str(teacher_dir), model_type="qwen3", use_hf=True)
    template = get_template(proc, template_type="qwen3_nothinking", max_length=512)
    template.set_mode("train")
    student = AutoModelForCausalLM.from_pretrained(student_dir).eval()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    s_rows, t_rows = [], []
    with torch.no_grad():
        for line in val.read_text().splitlines():
            enc = template.encode({"messages": json.loads(line)["messages"]})
            ids = torch.tensor([enc["input_ids"]])
            labels = torch.roll(torch.tensor([enc["labels"]]), -1, 1)
            labels[:, -1] = -100
            keep = labels[0] != -100
            s_rows.append(student(ids).logits[0][keep].float())
            t_rows.append(teacher(ids).logits[0][keep].to(torch.bfloat16))
    return torch.cat(s_rows), torch.cat(t_rows)


def test_the_sweep_is_the_short_outcome_design(outcome_sweep):
    runs = _runs(outcome_sweep)
    design = sorted((_config(r)["loss.precision"], _config(r)["run.seed"]) for r in runs)
    assert design == sorted((p, s) for p in ("native", "fp32") for s in OUTCOME_SEEDS)
    for run in runs:
        cfg = _config(run)
        assert (cfg["gkd.beta"], cfg["gkd.temperature"], cfg["model.embedded.teacher"]) == (
            BETA,
            TEMPERATURE,
            "trained",
        )
        assert [r["step"] for r in _evals(run)] == list(
            range(OUTCOME_EVAL_EVERY, OUTCOME_STEPS + 1, OUTCOME_EVAL_EVERY)
        )
        # distillation has something to learn: the held-out JSD falls between the first and the final evaluation
        first, final = _evals(run)[0][EVAL_JSD], _evals(run)[-1][EVAL_JSD]
        assert final < first, (run.name, first, final)


def test_eval_metrics_recompute_from_each_saved_final_student(outcome_sweep):
    """The final eval/* record of every run against FP64 from its checkpoint of the last step: the same FP32
    forward on the same rows, so what can differ is FP32 rounding of the trainer's trimmed lm_head
    (logits_to_keep): measured rel 4.4e-9 (issue 20), asserted to 1e-6."""
    for run in _runs(outcome_sweep):
        argv = _argv(run)
        val, teacher = Path(_flag(argv, "--val_dataset")), Path(_flag(argv, "--teacher_model"))
        s, t = _active_logits(run / "swift" / f"checkpoint-{OUTCOME_STEPS}", teacher, val)
        n = s.shape[0]
        final = _evals(run)[-1]
        assert final["step"] == OUTCOME_STEPS and final[EVAL_TOKENS] == n
        ref = {
            EVAL_JSD: float(reference_jsd(s, t, BETA, "paper", TEMPERATURE).sum()) / n,
            EVAL_FORWARD_KL: float(reference_jsd(s, t, 0.0, "paper", TEMPERATURE).sum()) / n,  # KL(T||S)
            EVAL_REVERSE_KL: float(reference_jsd(s, t, 1.0, "paper", TEMPERATURE).sum()) / n,
        }  # KL(S||T)
        for key, value in ref.items():
            assert final[key] == pytest.approx(value, rel=1e-6), (run.name, key)
        agree = float((s.argmax(-1) == t.argmax(-1)).double().mean())
        assert abs(final[EVAL_TOP1_AGREEMENT] - agree) <= 2 / n, run.name


def test_held_out_split_is_disjoint_from_the_training_rows_and_shared(outcome_sweep):
    vals, datasets = set(), set()
    for run in _runs(outcome_sweep):
        argv = _argv(run)
        val, train = Path(_flag(argv, "--val_dataset")), Path(_flag(argv, "--dataset"))
        assert val.name == VALIDATION_FILE.format(n=32) and val.parent == train.parent
        held, trained = _prompts(val), _prompts(train)
        assert len(held) == 32 and len(set(held)) == 32
        assert not set(held) & set(trained), run.name
        vals.add(val.read_text())
        datasets.add(train.read_text())
    assert len(vals) == 1 and len(datasets) == 1  # one split for every variant and seed


# t(0.975, 1): with 1 degree of freedom Student's t is Cauchy, F(t) = 1/2 + atan(t)/pi, so t = tan(0.475 pi)
T1 = math.tan(0.475 * math.pi)


def test_gkd_analyze_reports_patched_not_worse_with_the_first_screen_sentence(outcome_sweep, tmp_path):
    finals = {}
    for run in _runs(outcome_sweep):
        cfg = _config(run)
        finals[(cfg["loss.precision"], cfg["run.seed"])] = _evals(run)[-1][EVAL_JSD]
    rels = [(finals[("fp32", s)] - finals[("native", s)]) / finals[("native", s)] for s in OUTCOME_SEEDS]
    assert len(rels) == 2
    mean = sum(rels) / 2
    sd = math.sqrt(sum((r - mean) ** 2 for r in rels))  # n - 1 = 1
    lo, hi = mean - T1 * sd / math.sqrt(2), mean + T1 * sd / math.sqrt(2)
    decimals = int(min(9, max(2, math.ceil(-math.log10((hi - lo) / 2)))))  # last digit <= half the width
    tail = "; no difference resolved" if lo <= 0 <= hi else ""
    sentence = (
        f"fp32/paper ends at {1 + mean:.{decimals}f}× the original's held-out JSD (95% t interval "
        f"{1 + lo:.{decimals}f}–{1 + hi:.{decimals}f}, 2 seeds{tail})."
    )

    report = tmp_path / "report"
    proc = subprocess.run(
        [entry_point("gkd-analyze"), str(outcome_sweep), "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    verdict = json.loads((report / "verdict.json").read_text())
    criterion = next(c for c in verdict["criteria"] if c["name"] == "patched_not_worse")
    expected = "pass" if hi <= 0.05 else "fail"
    assert criterion["status"] == expected, criterion
    assert "required" in criterion["applies"]  # the sweep's group is outcome
    assert f"{hi:+.3%}" in criterion["measured"] and sentence in criterion["measured"]
    first_screen = (report / "report.md").read_text().split("**Contents**")[0]
    assert f"Held-out outcome: {sentence}" in first_screen, first_screen
    assert proc.returncode == verdict["exit_code"] and proc.returncode in (0, 1), proc.stderr[-2000:]
