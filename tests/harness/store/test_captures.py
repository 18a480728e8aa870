"""harness.store.captures: round trip and clear errors on bad files."""
import pytest
import torch
from safetensors.torch import save_file

from harness.store.captures import CaptureError, load_capture, save_capture
from tests.loss_cases import make_case


@pytest.mark.parametrize("mode", ["full", "topk"])
def test_round_trip_keeps_values_and_dtypes(tmp_path, mode):
    case = make_case("fp32", "bf16", mode, True, 1)
    path = save_capture(tmp_path / "captures" / "step3_rank1.safetensors", case.student, case.teacher, case.labels,
                        0.5, 0.9, meta=dict(step=3, rank=1, precision="fp32", beta_form="paper"))
    cap = load_capture(path)
    assert torch.equal(cap["student_logits"], case.student) and cap["student_logits"].dtype == torch.float32
    assert torch.equal(cap["labels"], case.labels)
    t = cap["teacher_output"]
    if mode == "full":
        assert torch.equal(t.full_logits, case.teacher.full_logits) and t.full_logits.dtype == torch.bfloat16
    else:
        assert torch.equal(t.topk_logprobs, case.teacher.topk_logprobs)
        assert torch.equal(t.topk_indices, case.teacher.topk_indices)
    assert cap["beta"] == 0.5 and cap["temperature"] == 0.9
    assert cap["meta"]["step"] == "3" and cap["meta"]["rank"] == "1" and cap["meta"]["beta_form"] == "paper"
    assert not list(tmp_path.rglob("*.tmp"))


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


@pytest.mark.parametrize("meta,match", [({"temperature": "0.9"}, "beta"), ({"beta": "2", "temperature": "1"}, "beta"),
                                        ({"beta": "0.5", "temperature": "0"}, "temperature")])
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
    tensors = {"student_logits": case.student, "labels": case.labels, "teacher_topk_logprobs":
               case.teacher.topk_logprobs, "teacher_topk_indices": idx}
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata={"beta": "0.5", "temperature": "0.9"})
    with pytest.raises(CaptureError, match="outside the student vocabulary"):
        load_capture(tmp_path / "c.safetensors")
    tensors = {"student_logits": case.student[:, :5].contiguous(), "labels": case.labels, "teacher_full_logits": case.student.contiguous()}
    save_file(tensors, str(tmp_path / "d.safetensors"), metadata={"beta": "0.5", "temperature": "0.9"})
    with pytest.raises(CaptureError, match="does not match labels"):
        load_capture(tmp_path / "d.safetensors")


def test_teacher_labels_sharing_storage_with_labels(tmp_path):
    case = make_case("fp32", "bf16", "full", True, 2)
    teacher = type(case.teacher)(full_logits=case.teacher.full_logits, labels=case.labels.view_as(case.labels))
    cap = load_capture(save_capture(tmp_path / "c.safetensors", case.student, teacher, case.labels, 0.5, 0.9))
    assert torch.equal(cap["teacher_output"].labels, case.labels)
