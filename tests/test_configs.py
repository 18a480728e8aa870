"""The config tree: every config composes; every experiment runs (tiny ones for real, seed-scale to argv).

* Every YAML file under ``configs/`` that git would commit is composed with Hydra's compose API
  (``gkd_harness.harness.launcher.compose``), through ``train.yaml`` when it belongs to one of its groups (``hydra/launcher`` options
  are also instantiated); the job's typed config is validated by ``gkd_harness.harness.config.validate`` and turned into the ms-swift
  argv of its launch plan (``gkd_harness.harness.launcher.run.make_plan``, dry run). The sign-off criteria file is loaded through its
  own schema (``gkd_harness.analysis.signoff.criteria_file``).
* Every experiment is expanded into its sweep points exactly as Hydra's basic sweeper does; every point is
  validated and built to the argument level (names unique, one group per sweep).
* The tiny experiments run for real through ``gkd-train -m`` and ms-swift (marked slow): ``smoke`` is the
  session's shared sweep (``tests/conftest.py::smoke_sweep``), run once more here to show the resume, and
  ``beta_sweep`` (one valid and one invalid point) with the submitit_local launcher.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gkd_harness.harness.config.schema import EMBEDDED
from gkd_harness.harness.config.validate import validate_config
from gkd_harness.harness.launcher.run import make_plan
from gkd_harness.harness.launcher.sweep_points import point_name, sweep_points
from tests.launch.helpers import (
    compose,
    harness_env,
    read_metrics,
    read_summary,
    run_gkd_train,
    tail,
    task_config,
    wandb_offline_run,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TRAIN_GROUPS = ("model", "loss", "gkd", "backend", "rollout", "tracking", "monitor", "local", "experiment")
TINY_EXPERIMENTS = ("smoke", "beta_sweep", "outcome")
SEED_EXPERIMENTS = ("seed", "seed_hf", "precision_ab")
DATASET = "org/gkd-prompts"  # a hub-style id: nothing is downloaded at the argument level
HELD_OUT = "org/gkd-held-out"  # monitor.eval.dataset where a preset with its own dataset turns the evaluation on
NEEDS_HELD_OUT = ("precision_ab",)


@pytest.fixture(autouse=True)
def hub_ids_not_fetched(monkeypatch):
    """At the argument level a hub id (``Qwen/Qwen3.5-9B``) is only named, never fetched: the offline-cache check
    of ``gkd_harness.harness.config.validate`` (tested in tests/harness/config/test_validate.py) must not depend on this machine's cache."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def committed_yaml() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "configs"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = {p for p in out if p.endswith(".yaml")}
    files |= {str(p.relative_to(REPO)) for p in CONFIGS.glob("local/*.example.yaml")}  # examples are docs
    return sorted(files)


def argv_of(cfg, run_dir="/tmp/run"):
    """The ms-swift argv of ``cfg``'s launch plan on a plain node (dry run: embedded assets named, not built)."""
    return make_plan(cfg, Path(run_dir), base_env={}, dry_run=True).argv


def _case(rel: str):
    """(overrides, config_name) that loads the file ``configs/<rel>``."""
    parts = Path(rel).relative_to("configs").with_suffix("").parts
    if parts == ("train",) or parts == ("hydra", "default"):
        return [], "train"
    if parts[:2] == ("hydra", "launcher"):
        return [f"hydra/launcher={parts[2]}"], "train"
    if parts[:2] == ("hydra", "job_logging"):  # chosen by hydra/default.yaml: composed with train.yaml
        return [f"hydra/job_logging={parts[2]}"], "train"
    if parts[0] == "rollout" and parts[1] != "none":  # on-policy engines need on-policy batches (+ their inputs)
        extra = {
            "vllm_colocate": ["model=tiny_vllm"],
            "vllm_server": ["model=tiny_vllm", "rollout.vllm.server.base_url=http://127.0.0.1:8000"],
        }.get(parts[1], [])
        return [f"rollout={parts[1]}", "gkd.lmbda=0.5", *extra], "train"
    if parts[0] == "backend" and parts[1].startswith("megatron"):  # the tiny model's BF16 teacher cast: HF only
        return [f"backend={parts[1]}", "model.student_dtype=null", "model.teacher_dtype=null"], "train"
    if parts == ("loss", "candidate"):  # loss.source is required: the worked example
        return ["loss=candidate", f"loss.source={REPO}/examples/candidates/good_promote_first.py"], "train"
    if parts[0] in TRAIN_GROUPS and len(parts) == 2:
        return [f"{parts[0]}={parts[1]}"], "train"
    return [], "/".join(parts)  # not part of train.yaml (e.g. signoff criteria): composed on its own


@pytest.mark.parametrize("rel", committed_yaml())
def test_every_config_composes(rel):
    overrides, name = _case(rel)
    if name != "train":
        cfg = compose(overrides, name)
        assert OmegaConf.to_container(cfg, resolve=True)
        if name == "signoff/default":
            from gkd_harness.analysis.signoff.criteria_file import load_criteria

            assert load_criteria() is not None  # typed through its own schema
        return
    master = compose(overrides)
    if overrides and overrides[0].startswith("hydra/job_logging="):  # no log file opened in a run folder
        handlers = OmegaConf.to_container(master.hydra.job_logging, resolve=True)["handlers"]
        assert [h["class"] for h in handlers.values()] == ["logging.StreamHandler"]
    if overrides and overrides[0].startswith("hydra/launcher="):
        from hydra.utils import instantiate

        launcher = instantiate(OmegaConf.to_container(master.hydra.launcher, resolve=True))
        assert type(launcher).__name__ in ("BasicLauncher", "LocalLauncher", "SlurmLauncher")
    task = task_config(overrides)  # every interpolation resolves, every value has its schema's type
    if task.model.student != EMBEDDED and task.run.dataset is None:
        task = task_config(
            [
                *overrides,
                f"run.dataset={DATASET}",
                *([f"monitor.eval.dataset={HELD_OUT}"] if task.monitor.eval.every_n_steps else []),
            ]
        )
    if rel.endswith(".example.yaml"):  # placeholder paths of a site that is not this machine
        with pytest.raises(ValueError, match=r"^model\.student: model folder /shared/models/\S+ does not exist"):
            validate_config(task)
        return
    validate_config(task)
    argv = argv_of(task)
    assert argv[:4] in (["swift", "rlhf", "--rlhf_type", "gkd"], ["megatron", "rlhf", "--rlhf_type", "gkd"])


LAUNCHERS = ("basic", "submitit_local", "submitit_slurm")


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("name", TINY_EXPERIMENTS + SEED_EXPERIMENTS)
def test_composing_an_experiment_prints_no_hydra_warning(name, launcher, tmp_path):
    """Issue 33: every submitit sweep printed Hydra's "'hydra/launcher/submitit_local' is validated against
    ConfigStore schema with the same name ... will be removed" (configs/hydra/launcher/ shared the plugin's schema
    names). ``gkd-train --cfg job`` composes the whole tree, the hydra node and its launcher included, as a sweep
    does; Hydra prints its warnings (and anything else) on stderr, which must stay empty."""
    from tests.conftest import entry_point

    proc = subprocess.run(
        [entry_point("gkd-train"), "--cfg", "job", f"experiment={name}", f"hydra/launcher={launcher}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=harness_env(tmp_path / "out"),
    )
    assert proc.returncode == 0, tail(proc.stdout + proc.stderr)
    assert proc.stderr == "", proc.stderr
    assert f"group: {name}" in proc.stdout


def test_every_experiment_file_is_covered():
    found = {p.stem for p in (CONFIGS / "experiment").glob("*.yaml")}
    assert found == set(TINY_EXPERIMENTS) | set(SEED_EXPERIMENTS)


def experiment_points(name: str, extra=()):
    """[(point name, typed config)] of ``gkd-train -m experiment=NAME extra...``."""
    master = compose([f"experiment={name}", *extra])
    points = []
    for job in sweep_points(master):
        pname = point_name(job, master)
        points.append((pname, task_config(job, f"/sweep/{pname}", multirun=True)))
    return master, points


def as_args(argv):
    return dict(zip(argv[2::2], argv[3::2]))


@pytest.mark.parametrize("name", TINY_EXPERIMENTS + SEED_EXPERIMENTS)
def test_experiment_points_to_argument_level(name):
    extra = [f"run.dataset={DATASET}"] if name in SEED_EXPERIMENTS else []
    extra += [f"monitor.eval.dataset={HELD_OUT}"] if name in NEEDS_HELD_OUT else []
    master, points = experiment_points(name, extra)
    names = [p for p, _ in points]
    assert len(set(names)) == len(names), "run names must be unique within a sweep"
    for pname, cfg in points:
        assert cfg.tracking.wandb.group == name  # one group per sweep: wandb runs and run folders
        assert str(master.hydra.sweep.dir).endswith(f"multirun/{name}")
        validate_config(cfg)
        run_dir = Path("/sweep", pname)
        assert cfg.run.output_dir == str(run_dir)
        argv = argv_of(cfg, run_dir)
        assert argv[argv.index("--output_dir") + 1] == str(run_dir / "swift")
    if name in SEED_EXPERIMENTS:
        for _, cfg in points:
            args = as_args(argv_of(cfg))
            assert args["--model"] == "Qwen/Qwen3.5-0.8B" and args["--teacher_model"] == "Qwen/Qwen3.5-9B"
            assert args["--gkd_logits_topk"] == "64" and args["--beta"] == "0.5" and args["--temperature"] == "0.9"
            assert args["--sft_alpha"] == "0.0" and args["--use_vllm"] == "true" and args["--vllm_mode"] == "colocate"
            assert args["--torch_dtype"] == "bfloat16"
            if cfg.backend.name == "megatron":
                assert args["--tensor_model_parallel_size"] == "1" and args["--bf16"] == "true"
                assert cfg.backend.nproc_per_node == 8  # TP1 x 8 GPUs = DP8
                assert args["--global_batch_size"] == "8"  # one node: micro batch 1 x DP8
            else:
                assert args["--deepspeed"] == "zero3" and cfg.backend.nproc_per_node == 8


def test_beta_sweep_grid_and_comparable_points():
    _, points = experiment_points("beta_sweep")
    grid = {(c.loss.precision, c.loss.beta_form, c.gkd.beta) for _, c in points}
    assert grid == {
        (p, f, b) for p in ("native", "fp32") for f in ("paper", "continuous") for b in (0, 0.1, 0.5, 0.9, 0.999, 1)
    }
    # same seed, same data order, same everything but β (the loss variant enters through the plugin settings)
    argvs = []
    for _, cfg in points:
        argv = argv_of(cfg, "/run")
        i = argv.index("--beta")
        argvs.append(argv[: i + 1] + argv[i + 2 :])
    assert all(a == argvs[0] for a in argvs)
    args = as_args(argvs[0])
    assert args["--seed"] == args["--data_seed"] == "42"


def test_precision_ab_is_original_vs_patched_over_seeds():
    _, points = experiment_points("precision_ab", [f"run.dataset={DATASET}"])
    combos = sorted((c.loss.precision, c.run.seed) for _, c in points)
    assert combos == [(p, s) for p in ("fp32", "native") for s in (1, 2, 3)]


@pytest.mark.parametrize("name,value", [("seed", 100), ("seed_hf", 100), ("precision_ab", 200)])
def test_experiment_values_win_over_train_yaml(name, value):
    """An experiment's own values must override train.yaml's (lightning-hydra-template: `_self_` first)."""
    assert task_config([f"experiment={name}"]).run.max_steps == value


# ---------------------------------------------------------------------------------------------- real runs
STEPS = 2
SMOKE_VARIANTS = ("original", "fp32", "continuous")


def smoke_point_names():
    from tests.conftest import SMOKE_STEPS

    return sorted(
        f"loss={v},monitor.capture=True,run.max_steps={SMOKE_STEPS}" for v in SMOKE_VARIANTS
    )  # Hydra writes True


@pytest.fixture(scope="module")
def smoke_rerun(smoke_sweep):
    """The session's smoke sweep command (tests/conftest.py::smoke_sweep) run once more in the same folders: every
    point completed, so every point must be skipped (sweep resume)."""
    from tests.conftest import SMOKE_GROUP, SMOKE_STEPS

    root = smoke_sweep.parents[1]  # <GKD_OUTPUT_ROOT>/multirun/<group>
    env = harness_env(root, WANDB_SILENT="true", WANDB_MODE="offline")
    overrides = [
        "experiment=smoke",
        f"run.max_steps={SMOKE_STEPS}",
        "monitor.capture=true",
        f"tracking.wandb.group={SMOKE_GROUP}",
        "hydra.callbacks.sweep_status.progress_interval_s=0",
    ]
    return run_gkd_train(overrides, env, root, multirun=True)


@pytest.mark.slow
def test_smoke_experiment_runs_and_groups(smoke_sweep):
    from tests.conftest import SMOKE_GROUP, SMOKE_STEPS

    runs = {d.name: d for d in smoke_sweep.iterdir() if (d / "summary.json").exists()}
    assert sorted(runs) == smoke_point_names()
    for name, run_dir in runs.items():
        summary = read_summary(run_dir)
        assert summary["status"] == "completed" and summary["group"] == SMOKE_GROUP and summary["run_name"] == name
        assert summary["config"]["loss.precision"] == ("native" if "original" in name else "fp32")
        assert summary["config"]["loss.beta_form"] == ("continuous" if "continuous" in name else "paper")
        assert read_metrics(run_dir)[-1]["step"] == SMOKE_STEPS
        run, history = wandb_offline_run(run_dir)
        assert run.run_group == SMOKE_GROUP
        assert history and "gkd/neg_loss_calls_total" in history[-1]


@pytest.mark.slow
def test_smoke_wandb_run_names_are_the_readable_point_names(smoke_sweep):
    for run_dir in sorted(p for p in smoke_sweep.iterdir() if (p / "summary.json").exists()):
        run, _ = wandb_offline_run(run_dir)
        assert run.display_name == run_dir.name


@pytest.mark.slow
def test_resume_skips_completed_points(smoke_sweep, smoke_rerun):
    from tests.conftest import SMOKE_GROUP

    out = smoke_rerun.stdout + smoke_rerun.stderr
    assert smoke_rerun.returncode == 0, tail(out)
    assert "3 completed earlier (skipped), 0 failed earlier (rerun), 0 to run" in out
    assert len(re.findall(r"^  completed \(skipped: completed earlier\)", out, flags=re.M)) == 3
    assert f"[sweep {SMOKE_GROUP}] summary, 3 points: 3 completed, 0 failed" in out
    for run_dir in (p for p in smoke_sweep.iterdir() if (p / "summary.json").exists()):
        log = (run_dir / "swift.log").read_text()
        assert log.count("run sh: `") == 1  # ms-swift was started once, by the first command only
        assert len(list((run_dir / "wandb").rglob("run-*.wandb"))) == 1


@pytest.mark.slow
def test_beta_sweep_on_submitit_local_survives_a_failing_point(tmp_path, embedded_cache):
    """One valid and one invalid point of experiment=beta_sweep as parallel local processes; β=2 fails its point."""
    env = harness_env(tmp_path / "out")
    overrides = [
        "experiment=beta_sweep",
        "hydra/launcher=submitit_local",
        "loss.precision=fp32",
        "loss.beta_form=paper",
        "gkd.beta=0.5,2.0",
        f"run.max_steps={STEPS}",
        "tracking.wandb.mode=disabled",
        "hydra.callbacks.sweep_status.progress_interval_s=0",
    ]
    proc = run_gkd_train(overrides, env, tmp_path, multirun=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, tail(out)  # the sweep reports the failure in its exit status ...
    sweep = tmp_path / "out" / "multirun" / "beta_sweep"
    prefix = "gkd.beta={},loss.beta_form=paper,loss.precision=fp32,run.max_steps=%d" % STEPS
    summary = read_summary(sweep / prefix.format("0.5"))  # ... after the valid point completed
    assert summary["status"] == "completed", summary.get("error")
    assert summary["config"]["gkd.beta"] == 0.5
    bad = sweep / prefix.format("2.0")
    verdict = json.loads((bad / ".hydra" / "job_return.json").read_text())
    assert verdict["status"] == "FAILED" and "gkd.beta" in verdict["error"]
    lines = re.findall(r"^  (\w+) .*(gkd\.beta=[\d.]+)", out.split("summary, 2 points")[-1], flags=re.M)
    assert sorted(lines) == [("completed", "gkd.beta=0.5"), ("failed", "gkd.beta=2.0")]
    assert "[sweep beta_sweep] summary, 2 points: 1 completed, 1 failed" in out
