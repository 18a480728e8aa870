"""gkd_harness.harness.loss.candidate: loading a candidate fix from a file or a module, its refusals, its hash and its per-position
terms; and the config side (loss=candidate refused before any model loads)."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from swift.rlhf_trainers import gkd_loss as upstream

from gkd_harness.harness.loss.candidate import (
    CandidateError,
    candidate_terms,
    copy_into_run_folder,
    load_candidate,
    loss_provenance,
    loss_source_path,
    loss_source_sha256,
)
from tests.loss_cases import make_case

REPO = Path(__file__).resolve().parents[3]
GOOD = REPO / "examples" / "candidates" / "good_promote_first.py"


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _refusal(source) -> str:
    with pytest.raises(CandidateError) as e:
        load_candidate(str(source))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_file_is_refused_naming_it(tmp_path):
    msg = _refusal(tmp_path / "gkd_loss.py")
    assert str(tmp_path / "gkd_loss.py") in msg and "no such file" in msg


def test_file_without_gkd_loss_is_refused(tmp_path):
    p = _write(
        tmp_path,
        "nothing.py",
        "def jsd_loss(s_logits, t_logits, beta, log_softmax_fn=None, kl_div_fn=None, chunk_size=512):\n    return 0\n",
    )
    msg = _refusal(p)
    assert str(p) in msg and "no gkd_loss" in msg


@pytest.mark.parametrize(
    "params,what",
    [
        ("student_logits, teacher_output, labels, beta", "missing parameter 'temperature'"),
        (
            "student_logits, teacher_output, labels, temperature, beta, gather_fn=None, log_softmax_fn=None, "
            "kl_div_fn=None, chunk_size=512",
            "parameter 4 is 'temperature', expected 'beta'",
        ),
        (
            "student_logits, teacher_output, labels, beta, temperature, gather_fn, log_softmax_fn=None, kl_div_fn=None, "
            "chunk_size=512",
            "parameter 'gather_fn' has no default",
        ),
        (
            "student_logits, teacher_output, labels, beta, temperature, gather_fn=None, log_softmax_fn=None, "
            "kl_div_fn=None, chunk_size=512, *, extra",
            "required keyword-only parameter(s) extra",
        ),
    ],
)
def test_wrong_signature_is_refused_saying_what_differs(tmp_path, params, what):
    p = _write(tmp_path, "cand.py", f"def gkd_loss({params}):\n    return 0, 0\n")
    msg = _refusal(p)
    assert str(p) in msg and "gkd_loss signature differs" in msg and what in msg


def test_wrong_jsd_loss_signature_is_refused_too(tmp_path):
    p = _write(
        tmp_path,
        "cand.py",
        "from swift.rlhf_trainers.gkd_loss import gkd_loss\ndef jsd_loss(s_logits, t_logits):\n    return 0\n",
    )
    assert "jsd_loss signature differs" in _refusal(p)


def test_import_error_is_refused_naming_the_file_and_the_error(tmp_path):
    p = _write(tmp_path, "cand.py", "import no_such_module_for_gkd\n")
    msg = _refusal(p)
    assert str(p) in msg and "import failed: ModuleNotFoundError" in msg and "no_such_module_for_gkd" in msg


def test_module_refusals(tmp_path):
    assert "import failed" in _refusal("no_such_pkg_gkd.mod")
    assert "has no attribute 'nope'" in _refusal("swift.rlhf_trainers.gkd_loss:nope")
    assert "no gkd_loss" in _refusal("gkd_harness.harness.contract")


def test_good_example_loads_with_its_hash_and_declarations():
    cand = load_candidate(str(GOOD))
    assert cand.name == "good_promote_first"
    assert cand.sha256 == hashlib.sha256(GOOD.read_bytes()).hexdigest()
    assert cand.path == str(GOOD) and cand.jsd_loss is not None
    assert cand.unchanged == ("float32/float32",)
    assert load_candidate(str(GOOD), "pr-1234").name == "pr-1234"


def test_module_candidates_upstream_and_attr():
    mod = load_candidate("swift.rlhf_trainers.gkd_loss")
    assert mod.gkd_loss is upstream.gkd_loss and mod.jsd_loss is upstream.jsd_loss
    assert mod.sha256 == loss_source_sha256("native")
    attr = load_candidate("swift.rlhf_trainers.gkd_loss:gkd_loss")
    assert attr.gkd_loss is upstream.gkd_loss and attr.jsd_loss is None


def test_native_provenance_is_the_installed_upstream_file():
    path = Path(upstream.__file__)
    assert loss_source_path("native") == str(path)
    assert loss_source_sha256("native") == hashlib.sha256(path.read_bytes()).hexdigest()
    prov = loss_provenance("candidate", str(GOOD))
    assert prov == {
        "name": "good_promote_first",
        "path": str(GOOD),
        "sha256": hashlib.sha256(GOOD.read_bytes()).hexdigest(),
    }
    assert loss_source_sha256("fp32") == loss_source_sha256("fp64") is not None  # the harness's own loss code


def test_copy_into_run_folder_keeps_the_bytes(tmp_path):
    dest = copy_into_run_folder(str(GOOD), str(tmp_path))
    assert Path(dest).parent == tmp_path / "candidate"
    assert hashlib.sha256(Path(dest).read_bytes()).hexdigest() == loss_source_sha256("candidate", str(GOOD))


def test_keep_in_run_folder_records_name_hash_and_copy(tmp_path):
    from gkd_harness.harness.loss.candidate import keep_in_run_folder

    rec = keep_in_run_folder(str(GOOD), "pr-7", str(tmp_path))
    sha = hashlib.sha256(GOOD.read_bytes()).hexdigest()
    assert rec == {
        "name": "pr-7",
        "source": str(GOOD),
        "path": str(GOOD),
        "sha256": sha,
        "copy": "candidate/good_promote_first.py",
    }
    assert hashlib.sha256((tmp_path / rec["copy"]).read_bytes()).hexdigest() == sha
    mod = keep_in_run_folder("swift.rlhf_trainers.gkd_loss", None, str(tmp_path / "m"))
    assert mod["copy"] == "candidate/gkd_loss.py" and mod["sha256"] == loss_source_sha256("native")


@pytest.mark.parametrize("mode", ["full", "topk"])
def test_candidate_terms_are_the_candidates_own_values(mode):
    """total / num_valid are the candidate's (graph kept); per_position is the candidate row by row."""
    fn = load_candidate(str(GOOD)).gkd_loss
    case = make_case("fp32", "bf16", mode, True, 3, seq=10)
    s = case.student.clone().requires_grad_(True)
    terms = candidate_terms(fn, max_positions=5)(s, case.teacher, case.labels, 0.5, 0.9)
    total, n = fn(case.student, case.teacher, case.labels, 0.5, 0.9)
    assert torch.equal(terms.total.detach(), total) and int(terms.num_valid) == int(n) == 14
    assert terms.per_position.shape == (5,) and not terms.per_position.requires_grad
    assert float(terms.per_position.sum()) == pytest.approx(float(total) * 5 / 14, rel=0.5)
    assert terms.total.requires_grad


# ------------------------------------------------------------------------------------------------ config side
def _validate(overrides):
    from gkd_harness.harness.config.validate import validate_config
    from gkd_harness.harness.launcher.compose import point_config

    cfg, _ = point_config(overrides + ["run.output_dir=/tmp/gkd-candidate-test"])
    validate_config(cfg)
    return cfg


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["loss=candidate"], "loss.source"),
        (["loss=candidate", "loss.source=/no/such/gkd_loss.py"], "loss.source: /no/such/gkd_loss.py: no such file"),
        (["loss=candidate", "loss.source=gkd_harness.harness.contract"], "no gkd_loss"),
        (["loss=candidate", "loss.source=no_such_pkg_gkd.mod:fn"], "no module named 'no_such_pkg_gkd'"),
    ],
)
def test_config_refusals_before_any_model_loads(overrides, message):
    from gkd_harness.harness.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        _validate(overrides + ["run.dry_run=true"])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_other_precisions_ignore_loss_source():
    """`loss=original,candidate loss.source=X` sets the source on the original point too."""
    cfg = _validate(["loss=original", "loss.source=/no/such/file.py", "run.dry_run=true"])
    assert cfg.loss.precision == "native"


def test_config_refuses_a_syntax_error_naming_the_file(tmp_path):
    from gkd_harness.harness.config.schema import ConfigError

    p = _write(tmp_path, "cand.py", "def gkd_loss(:\n")
    with pytest.raises(ConfigError, match=f"loss.source: {p}: does not parse"):
        _validate(["loss=candidate", f"loss.source={p}", "run.dry_run=true"])


def test_config_import_check_runs_in_a_fresh_process(tmp_path):
    """The real import (and signature check) runs before any model loads, in a subprocess: this process never
    imports the candidate's dependencies for validation."""
    from gkd_harness.harness.config.schema import ConfigError

    p = _write(
        tmp_path,
        "cand.py",
        "import no_such_module_for_gkd\ndef gkd_loss(student_logits, teacher_output, "
        "labels, beta, temperature, gather_fn=None, log_softmax_fn=None, kl_div_fn=None, chunk_size=512):\n"
        "    pass\n",
    )
    with pytest.raises(ConfigError) as e:
        _validate(["loss=candidate", f"loss.source={p}"])
    assert f"loss.source: {p}: import failed: ModuleNotFoundError" in str(e.value)
    cfg = _validate(["loss=candidate", f"loss.source={GOOD}", "loss.name=pr"])
    assert cfg.loss.precision == "candidate" and cfg.loss.name == "pr"


def test_role_of_a_candidate_is_patched():
    from gkd_harness.harness.contract import role_of

    assert role_of("candidate") == "patched"


def test_check_command_exit_codes(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "gkd_harness.harness.loss.candidate", str(GOOD)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert ok.returncode == 0 and ok.stdout.startswith("ok good_promote_first ")
    bad = subprocess.run(
        [sys.executable, "-m", "gkd_harness.harness.loss.candidate", str(tmp_path / "x.py")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_run_provenance_hashes_the_candidates_file():
    """summary.json's provenance (gkd_harness.harness.store.provenance, torch-free) agrees with loss_source_sha256."""
    from gkd_harness.harness.store.provenance import provenance

    prov = provenance("candidate", str(GOOD))
    assert prov["loss_code"] == str(GOOD) and prov["loss_sha256"] == loss_source_sha256("candidate", str(GOOD))
    mod = provenance("candidate", "swift.rlhf_trainers.gkd_loss")
    assert mod["loss_sha256"] == provenance("native")["loss_sha256"] == loss_source_sha256("native")
    assert provenance("fp32")["loss_sha256"] == loss_source_sha256("fp32")


def test_wandb_tags_name_the_candidate_and_its_hash():
    from gkd_harness.harness.launcher.wandb_env import wandb_env
    from gkd_harness.harness.loss.candidate import candidate_tags

    tags = candidate_tags("candidate", str(GOOD), None)
    sha = loss_source_sha256("candidate", str(GOOD))
    assert tags == ("candidate:good_promote_first", f"sha256:{sha[:12]}")
    assert candidate_tags("fp32", None, None) == ()
    env = wandb_env(
        {"group": "g", "tags": ["mine"]},
        "offline",
        Path("/tmp/r"),
        "r",
        precision="candidate",
        beta_form="paper",
        loss_tags=tags,
    )
    assert env["WANDB_TAGS"].split(",") == ["patched", "candidate", "paper", "g", *tags, "mine"]


def test_ranks_load_the_run_folders_copy(tmp_path):
    from gkd_harness.harness.loss.candidate import keep_in_run_folder, run_source

    assert run_source(str(GOOD), str(tmp_path)) == str(GOOD)  # no copy yet
    keep_in_run_folder(str(GOOD), None, str(tmp_path))
    assert run_source(str(GOOD), str(tmp_path)) == str(tmp_path / "candidate" / GOOD.name)
    assert run_source("swift.rlhf_trainers.gkd_loss", str(tmp_path)) == "swift.rlhf_trainers.gkd_loss"
    assert load_candidate(run_source(str(GOOD), str(tmp_path))).sha256 == load_candidate(str(GOOD)).sha256


def test_plugin_installs_the_candidate_behind_the_boundary_and_the_instrument(tmp_path):
    """The rank side: build_loss loads the run folder's copy, the dtype boundary and the instrument wrap it, and
    rebind_gkd_loss puts it where ms-swift's trainers call gkd_loss; the value is the candidate's own."""
    import dataclasses

    from gkd_harness.harness.contract import LOSS_CALLS_TOTAL, SPOT_LOSS_FP64
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import plugin_settings
    from gkd_harness.harness.loss.candidate import keep_in_run_folder
    from gkd_harness.harness.losses import DTYPES_BY_NAME
    from gkd_harness.harness.rank.plugin import build_loss, rebind_gkd_loss

    cfg, run_dir = point_config(
        ["loss=candidate", f"loss.source={GOOD}", "monitor.spot_check.every_n_steps=1"], run_dir=tmp_path
    )
    keep_in_run_folder(str(GOOD), None, str(run_dir))
    boundary, inst = build_loss(plugin_settings(cfg, run_dir), cfg)
    case = make_case("fp32", "fp32", "full", True, 5, seq=8)
    s = case.student.clone().requires_grad_(True)
    total, n = boundary(s, case.teacher, case.labels, 0.5, 0.9)
    cast = DTYPES_BY_NAME.get(cfg.model.teacher_dtype) or case.teacher.full_logits.dtype
    t = dataclasses.replace(case.teacher, full_logits=case.teacher.full_logits.to(cast))
    want, want_n = load_candidate(str(GOOD)).gkd_loss(case.student, t, case.labels, 0.5, 0.9)
    assert torch.equal(total.detach(), want) and int(n) == int(want_n)
    inst.flush()  # the calls are read at the logging step
    assert inst.calls == 1 and inst.metrics[LOSS_CALLS_TOTAL].value == 1
    assert inst.metrics[SPOT_LOSS_FP64].count == 1  # the FP64 spot check ran on the candidate's call
    import swift.rlhf_trainers.gkd_trainer as hf

    before = hf.gkd_loss
    try:
        assert rebind_gkd_loss(boundary, modules=(hf.__name__,)) == {hf.__name__: "rebound"}
        assert hf.gkd_loss is boundary
    finally:
        hf.gkd_loss = before


def test_wandb_config_carries_the_candidates_hash(tmp_path, monkeypatch):
    """attach_to_wandb_run (inside ms-swift, on the rank owning the wandb run) adds the candidate's name, source
    and sha256 to the run's config."""
    import wandb

    from gkd_harness.harness.config.schema import to_dict
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.rank.wandb_run import attach_to_wandb_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg, _ = point_config(["loss=candidate", f"loss.source={GOOD}", "loss.name=pr-9"], run_dir=tmp_path)
    run = wandb.init(dir=str(tmp_path), mode="offline", project="t")
    try:
        assert attach_to_wandb_run(to_dict(cfg))
        from gkd_harness.harness.config.flat import flatten

        conf = flatten(dict(run.config))  # the harness config is logged nested under "harness"
        assert conf["harness.provenance.loss_sha256"] == loss_source_sha256("candidate", str(GOOD))
        assert conf["harness.loss.name"] == "pr-9" and conf["harness.loss.source"] == str(GOOD)
    finally:
        wandb.finish()
