"""gkd-replay on the seed recipe and on capture files."""

import subprocess

import pytest
import torch
from safetensors.torch import save_file

from gkd_harness.analysis.replay.cli import main
from gkd_harness.analysis.replay.variants import evaluate_variants, replay_table, synthetic_inputs
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import GRAD_REL_L2_FP32_STUDENT, loss_tol
from gkd_harness.harness.store.captures import save_capture
from tests.conftest import entry_point
from tests.loss_cases import make_case

SEED_FP64 = 7.975079402659209e-05  # report 000's FP64 value for its recipe


def _parse(out: str):
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("native", "fp32", "fp64"):
            rows[parts[0]] = (float(parts[1]), float(parts[2]))
    return rows


def test_cli_seed_recipe_prints_negative_native_and_fp32_within_tolerance():
    # Through the installed console script, as a user runs it.
    out = subprocess.run([entry_point("gkd-replay"), "synthetic"], capture_output=True, text=True, check=True).stdout
    rows = _parse(out)
    assert rows["native"][0] < -1e-3  # about -1.9e-3 on this CPU
    assert rows["fp64"][0] == pytest.approx(SEED_FP64, rel=1e-9)
    assert abs(rows["fp32"][0] - SEED_FP64) * 3 <= loss_tol(SEED_FP64 * 3, 3)
    assert rows["fp32"][1] <= GRAD_REL_L2_FP32_STUDENT
    assert rows["native"][1] > 0.05


@pytest.mark.parametrize(
    "args",
    [
        [
            "--beta",
            "0.9",
            "--temperature",
            "2",
            "--topk",
            "16",
            "--vocab",
            "128",
            "--rows",
            "33",
            "--beta-form",
            "continuous",
        ],
        ["--student-dtype", "bfloat16", "--teacher-dtype", "bfloat16", "--seed", "4"],
    ],
)
def test_synthetic_flags_against_reference(capsys, args):
    assert main(["synthetic", *args]) == 0
    rows = _parse(capsys.readouterr().out)
    get = lambda flag, default: args[args.index(flag) + 1] if flag in args else default  # noqa: E731
    s, t, labels = synthetic_inputs(
        int(get("--seed", 0)),
        int(get("--rows", 3)),
        int(get("--vocab", 64)),
        student_dtype=get("--student-dtype", "float32"),
        teacher_dtype=get("--teacher-dtype", "bfloat16"),
        topk=int(get("--topk", 0)) or None,
    )
    kw = dict(teacher_topk=(t.topk_logprobs, t.topk_indices)) if t.is_topk_mode else dict(teacher_full=t.full_logits)
    ref_total, n, _ = reference_gkd(
        s, labels, float(get("--beta", 0.5)), float(get("--temperature", 0.9)), get("--beta-form", "paper"), **kw
    )
    assert rows["fp64"][0] == pytest.approx(ref_total / n, rel=1e-9)
    assert abs(rows["fp32"][0] - ref_total / n) * n <= loss_tol(ref_total, n)


@pytest.mark.parametrize(
    "argv", [["synthetic", "--beta", "1.5"], ["synthetic", "--temperature", "0"], ["synthetic", "--topk", "999"]]
)
def test_bad_synthetic_flags_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "--" in capsys.readouterr().err


def test_captures_of_a_sweep_rank_averaged(tmp_path, capsys):
    for rank in (0, 1):
        case = make_case("fp32", "bf16", "full", True, 10 + rank)
        save_capture(
            tmp_path / "runA" / "captures" / f"step2_rank{rank}.safetensors",
            case.student,
            case.teacher,
            case.labels,
            0.5,
            0.9,
            meta=dict(step=2, rank=rank, beta_form="paper"),
        )
    per_capture, averaged = replay_table([str(tmp_path)])
    assert len(per_capture) == 6 and set(per_capture["rank"]) == {"0", "1"}
    nat = averaged[averaged.variant == "native"].iloc[0]
    assert nat.ranks == 2 and nat.run == "runA"
    # Each capture's fp64 row equals the independent reference.
    case = make_case("fp32", "bf16", "full", True, 10)
    ref_total, n, _ = reference_gkd(case.student, case.labels, 0.5, 0.9, "paper", teacher_full=case.teacher.full_logits)
    row = per_capture[(per_capture["rank"] == "0") & (per_capture.variant == "fp64")].iloc[0]
    assert row.loss == pytest.approx(ref_total / n, rel=1e-9)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mean over ranks" in out and "step2_rank1.safetensors" in out


def test_a_run_folder_replays_its_captures_not_its_checkpoints(tmp_path):
    """A run that saved checkpoints holds model safetensors under swift/; only captures/ is read."""
    case = make_case("fp32", "bf16", "topk", True, 12)
    save_capture(
        tmp_path / "runA" / "captures" / "step1_rank0.safetensors",
        case.student,
        case.teacher,
        case.labels,
        0.5,
        0.9,
        meta=dict(step=1, rank=0, beta_form="paper"),
    )
    ckpt = tmp_path / "runA" / "swift" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    save_file({"lm_head.weight": torch.zeros(4, 4)}, str(ckpt / "model.safetensors"))
    for folder in (tmp_path, tmp_path / "runA", tmp_path / "runA" / "captures"):
        per_capture, _ = replay_table([str(folder)])
        assert set(per_capture["capture"]) == {"step1_rank0.safetensors"}
    ref_total, n, _ = reference_gkd(case.student, case.labels, 0.5, 0.9, "paper", **case.ref_kwargs)
    fp64 = per_capture[per_capture.variant == "fp64"].iloc[0]
    assert fp64.loss == pytest.approx(ref_total / n, rel=1e-9) and fp64.num_valid == n


def test_unreadable_capture_exits_2(tmp_path, capsys):
    (tmp_path / "x.safetensors").write_bytes(b"nope")
    assert main([str(tmp_path / "x.safetensors")]) == 2
    assert "x.safetensors" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2


def test_evaluate_variants_fp64_gradient_is_exact_reference():
    s, t, labels = synthetic_inputs()
    res = evaluate_variants(s, t, labels, 0.5, 0.9)
    assert res["fp64"]["grad_rel_l2"] == 0.0 and res["fp32"]["num_valid"] == 3
    assert torch.isfinite(torch.tensor(res["native"]["loss"]))
