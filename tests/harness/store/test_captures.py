"""gkd_harness.harness.store.captures: the rows the loss saw, round trip, the cap, and clear errors on bad files."""

import pytest
import torch
from safetensors.torch import save_file
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.losses import make_gkd_loss
from gkd_harness.harness.store.captures import CaptureError, load_capture, save_capture
from tests.loss_cases import make_case


def _active(x, labels):
    return x[labels != -100]


@pytest.mark.parametrize("mode", ["full", "topk"])
def test_round_trip_keeps_the_rows_the_loss_saw(tmp_path, mode):
    """A capture holds the active rows (top-k: the student gathered at the teacher's ids), in their dtypes, and
    the loss on the loaded inputs is the call's loss (FP64 variant, against the independent reference)."""
    case = make_case("fp32", "bf16", mode, True, 1)
    path = save_capture(
        tmp_path / "captures" / "step3_rank1.safetensors",
        case.student,
        case.teacher,
        case.labels,
        0.5,
        0.9,
        meta=dict(step=3, rank=1, precision="fp32", beta_form="paper"),
    )
    cap = load_capture(path)
    rows = _active(case.student, case.labels)
    n = rows.shape[0]
    assert cap["student_logits"].dtype == torch.float32 and cap["student_logits"].shape[:2] == (1, n)
    assert torch.equal(cap["token_ids"], _active(case.labels, case.labels))
    t = cap["teacher_output"]
    if mode == "full":
        assert cap["meta"]["format"] == "rows"
        assert torch.equal(cap["student_logits"][0], rows)
        assert torch.equal(t.full_logits[0], _active(case.teacher.full_logits, case.labels))
        assert t.full_logits.dtype == torch.bfloat16
    else:
        ids = _active(case.teacher.topk_indices, case.labels)
        assert cap["meta"]["format"] == "topk_gathered" and cap["meta"]["student_vocab"] == "96"
        assert torch.equal(cap["student_logits"][0], torch.gather(rows, -1, ids))  # [n, K], not [B, S, V]
        assert torch.equal(cap["vocab_ids"], ids)
        assert torch.equal(t.topk_logprobs[0], _active(case.teacher.topk_logprobs, case.labels))
        assert torch.equal(t.topk_indices[0], torch.arange(16).expand(n, 16))
    assert cap["beta"] == 0.5 and cap["temperature"] == 0.9 and cap["meta"]["rows_active"] == str(n)
    assert cap["meta"]["step"] == "3" and cap["meta"]["rank"] == "1" and cap["meta"]["beta_form"] == "paper"
    total, m = make_gkd_loss("fp64", "paper")(cap["student_logits"], t, cap["labels"], 0.5, 0.9)
    ref_total, ref_n, _ = reference_gkd(case.student, case.labels, 0.5, 0.9, "paper", **case.ref_kwargs)
    assert int(m) == ref_n == n and float(total) == pytest.approx(ref_total, rel=1e-12)
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("mode", ["full", "topk"])
def test_max_tokens_keeps_the_first_active_rows(tmp_path, mode):
    case = make_case("fp32", "bf16", mode, True, 2)
    cap = load_capture(
        save_capture(tmp_path / "c.safetensors", case.student, case.teacher, case.labels, 0.5, 0.9, max_tokens=5)
    )
    rows = _active(case.student, case.labels)
    assert cap["meta"]["rows_active"] == str(rows.shape[0]) and cap["student_logits"].shape[1] == 5
    if mode == "full":
        assert torch.equal(cap["student_logits"][0], rows[:5])
    else:
        assert torch.equal(cap["vocab_ids"], _active(case.teacher.topk_indices, case.labels)[:5])


def test_uncovered_topk_rows_are_dropped_before_the_cap(tmp_path):
    """Rows whose top-k log-probs are all -inf are not loss rows upstream; the cap counts loss rows only."""
    case = make_case("fp32", "bf16", "topk", True, 3)
    lp = case.teacher.topk_logprobs.clone()
    lp[0, 3:6] = float("-inf")  # the first three active rows of sequence 0
    teacher = TeacherOutput(topk_logprobs=lp, topk_indices=case.teacher.topk_indices, labels=case.labels)
    cap = load_capture(
        save_capture(tmp_path / "c.safetensors", case.student, teacher, case.labels, 0.5, 0.9, max_tokens=4)
    )
    assert torch.equal(cap["vocab_ids"], case.teacher.topk_indices[0, 6:10])
    assert cap["meta"]["rows_active"] == str(int((case.labels != -100).sum()) - 3)


def test_legacy_capture_still_loads(tmp_path):
    """Files of the first format (the call's [B, S, V] tensors) replay as they were."""
    case = make_case("fp32", "bf16", "topk", True, 1)
    tensors = {
        "student_logits": case.student,
        "labels": case.labels,
        "teacher_topk_logprobs": case.teacher.topk_logprobs,
        "teacher_topk_indices": case.teacher.topk_indices,
    }
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata={"beta": "0.5", "temperature": "0.9"})
    cap = load_capture(tmp_path / "c.safetensors")
    assert torch.equal(cap["student_logits"], case.student) and torch.equal(cap["labels"], case.labels)
    assert torch.equal(cap["teacher_output"].topk_indices, case.teacher.topk_indices)


def test_missing_file(tmp_path):
    with pytest.raises(CaptureError, match="no such capture"):
        load_capture(tmp_path / "nope.safetensors")


def test_corrupt_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(CaptureError, match="bad.safetensors"):
        load_capture(bad)


@pytest.mark.parametrize("drop,match", [("student_logits", "student_logits"), ("teacher_full_logits", "teacher")])
def test_missing_tensor(tmp_path, drop, match):
    case = make_case("fp32", "bf16", "full", True, 1)
    tensors = {"student_logits": case.student, "labels": case.labels, "teacher_full_logits": case.teacher.full_logits}
    del tensors[drop]
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata={"beta": "0.5", "temperature": "0.9"})
    with pytest.raises(CaptureError, match=match):
        load_capture(tmp_path / "c.safetensors")


@pytest.mark.parametrize(
    "meta,match",
    [
        ({"temperature": "0.9"}, "beta"),
        ({"beta": "2", "temperature": "1"}, "beta"),
        ({"beta": "0.5", "temperature": "0"}, "temperature"),
    ],
)
def test_bad_metadata(tmp_path, meta, match):
    case = make_case("fp32", "bf16", "full", True, 1)
    tensors = {"student_logits": case.student, "labels": case.labels, "teacher_full_logits": case.teacher.full_logits}
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata=meta)
    with pytest.raises(CaptureError, match=match):
        load_capture(tmp_path / "c.safetensors")


def test_inconsistent_shapes_and_ids(tmp_path):
    case = make_case("fp32", "bf16", "topk", True, 1)
    idx = case.teacher.topk_indices.clone()
    idx[0, 0, 0] = case.student.shape[-1] + 5
    tensors = {
        "student_logits": case.student,
        "labels": case.labels,
        "teacher_topk_logprobs": case.teacher.topk_logprobs,
        "teacher_topk_indices": idx,
    }
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata={"beta": "0.5", "temperature": "0.9"})
    with pytest.raises(CaptureError, match="outside the student vocabulary"):
        load_capture(tmp_path / "c.safetensors")
    tensors = {
        "student_logits": case.student[:, :5].contiguous(),
        "labels": case.labels,
        "teacher_full_logits": case.student.contiguous(),
    }
    save_file(tensors, str(tmp_path / "d.safetensors"), metadata={"beta": "0.5", "temperature": "0.9"})
    with pytest.raises(CaptureError, match="does not match labels"):
        load_capture(tmp_path / "d.safetensors")


def test_teacher_rows_paired_by_the_teacher_labels(tmp_path):
    """OPSD: the teacher's active positions differ from the student's (same count); rows pair in order."""
    case = make_case("fp32", "bf16", "full", True, 2)
    t_labels = case.labels.roll(-1, dims=1)  # the teacher's positions one earlier
    teacher = TeacherOutput(full_logits=case.teacher.full_logits, labels=t_labels)
    cap = load_capture(save_capture(tmp_path / "c.safetensors", case.student, teacher, case.labels, 0.5, 0.9))
    assert torch.equal(cap["teacher_output"].full_logits[0], _active(case.teacher.full_logits, t_labels))
    assert torch.equal(cap["student_logits"][0], _active(case.student, case.labels))


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(meta={"format": "zip"}), "format='zip'"),
        (dict(meta={"student_vocab": "10"}), "outside the student vocabulary"),
        (dict(meta={"student_vocab": None}), "student_vocab"),
        (dict(drop="teacher_topk_indices"), "teacher_topk_indices"),
        (dict(shape=True), "are not"),
    ],
)
def test_bad_gathered_captures_name_the_problem(tmp_path, change, match):
    case = make_case("fp32", "bf16", "topk", True, 4)
    path = save_capture(tmp_path / "c.safetensors", case.student, case.teacher, case.labels, 0.5, 0.9)
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    for k, v in change.get("meta", {}).items():
        meta.pop(k) if v is None else meta.update({k: v})
    tensors.pop(change.get("drop", ""), None)
    if change.get("shape"):
        tensors["labels"] = tensors["labels"][:-1].contiguous()
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(CaptureError, match=match) as e:
        load_capture(tmp_path / "bad.safetensors")
    assert "bad.safetensors" in str(e.value)
