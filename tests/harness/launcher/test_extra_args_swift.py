"""``run.extra_args`` through ms-swift's own flags, at validation and in the dry run (issue 24, item 2).

Before the fix an unknown flag passed the dry run and failed 25 s into the run with ms-swift's ``remaining_argv``
error; then the dry run parsed the flags with ms-swift's parser, which took 20 to 40 s (importing
``swift.arguments``), printed ms-swift's ``[INFO:swift]`` line above the refusal, accepted abbreviations (``--bet``
set β behind the harness's back) and ``--no_<flag>`` forms of harness-set flags (``--no_gradient_checkpointing``), and crashed on ``megatron rlhf``
where Transformer Engine is missing. Now the flags are a table extracted once from ms-swift's parser (real
ms-swift here, into a private cache) and the check parses against it with plain argparse.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gkd_harness.harness.config.extra_args_rules import harness_key
from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.swift_flags import CACHE_ENV, load_table, refusal, table_path
from gkd_harness.harness.config.validate import validate_config
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.extra_args import flag_table, swift_refusal
from gkd_harness.harness.launcher.run import dry_run
from tests.conftest import entry_point

#: (argv, accepted) - what ms-swift's own parser says, with abbreviations off (a flag is a field's own name)
BATTERY = [
    (["--tuner_type", "lora", "--lora_rank", "8", "--attn_impl", "sdpa"], True),
    (["--lora-rank=8", "--lora_alpha", "16"], True),
    (["--target_modules", "all-linear", "q_proj"], True),
    (["--use_liger_kernel"], True),
    (["--use_liger_kernel", "false"], True),
    (["--debug", "underflow_overflow"], True),
    (["--lora_rnak", "8"], False),
    (["--lora_rank", "eight"], False),
    (["--lora_rank"], False),
    (["--debug", "x"], False),
    (["--use_liger_kernel", "maybe"], False),
    (["--lora_rank", "8", "9"], False),
    (["--optim", "adamw_torch_fused"], True),
    (["--optim", "nope"], False),
]


@pytest.fixture(scope="module")
def table_cache(tmp_path_factory):
    """A private cache with the table built from the installed ms-swift (a subprocess imports it, as on first use)."""
    path = tmp_path_factory.mktemp("swift_flags")
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    assert load_table(False) is None
    assert flag_table(False), "building the table from ms-swift's RLHFArguments failed"
    yield path
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


def test_the_table_parses_as_ms_swifts_own_parser(table_cache):
    from swift.arguments import RLHFArguments
    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser

    with _patch_get_type_hints():
        parser = HfArgumentParser([RLHFArguments], exit_on_error=False)
    parser.allow_abbrev = False

    def swift_accepts(argv):
        try:
            return not parser.parse_known_args(argv)[1]
        except (argparse.ArgumentError, SystemExit):
            return False

    table = load_table(False)
    assert table_path(False).parent == table_cache and len(table) > 400
    for argv, accepted in BATTERY:
        assert swift_accepts(argv) is accepted, argv
        assert (refusal(argv, table, harness_key) is None) is accepted, argv


def test_the_dry_run_refuses_what_ms_swift_refuses(table_cache, tmp_path):
    cfg, run_dir = point_config(["run.extra_args=[--lora_rnak,8]"], run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^run\.extra_args: ms-swift has no flag --lora_rnak$"):
        dry_run(cfg, run_dir)
    assert swift_refusal(["--lora_rank", "eight"]).startswith("ms-swift refuses it: argument --lora_rank")
    assert swift_refusal(["--tuner_type", "lora", "--lora_rank", "8", "--attn_impl", "sdpa"]) is None
    cfg, run_dir = point_config(["run.extra_args=[--lora_rank,8]"], run_dir=tmp_path / "run")
    assert "--lora_rank 8" in dry_run(cfg, run_dir).replace("\\\n", " ")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "extra,why",
    [
        ("[--bet,0.9]", "ms-swift has no flag --bet"),  # an abbreviation of --beta: ms-swift's parser took it
        (
            "[--no_gradient_checkpointing]",
            "it sets gradient_checkpointing, which the harness sets: use the config key backend.gradient_checkpointing instead",
        ),
        ("[--no-check-model]", "it sets check_model, which the harness sets and cannot be overridden"),
    ],
)
def test_abbreviations_and_negations_cannot_reach_a_harness_flag(table_cache, extra, why):
    cfg, _ = point_config([f"run.extra_args={extra}"], run_dir="/tmp/unused")
    with pytest.raises(ConfigError, match="^run.extra_args: " + why.replace(".", r"\.") + "$"):
        validate_config(cfg)


def test_validation_checks_the_flags_without_importing_ms_swift(table_cache):
    code = (
        "import sys\n"
        "from gkd_harness.harness.launcher.compose import point_config\n"
        "from gkd_harness.harness.config.validate import validate_config\n"
        "from gkd_harness.harness.config.schema import ConfigError\n"
        "cfg, _ = point_config(['run.extra_args=[--lora_rank,eight]'], run_dir='/tmp/unused')\n"
        "try:\n"
        "    validate_config(cfg)\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
        "print([m for m in ('torch', 'swift', 'transformers') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, CACHE_ENV: str(table_cache)},
    ).stdout.splitlines()
    assert out == [
        "run.extra_args: ms-swift refuses it: argument --lora_rank/--lora-rank: invalid int value: 'eight'",
        "[]",
    ]


def test_gkd_train_refuses_an_unknown_flag_in_one_line_and_quickly(table_cache, tmp_path):
    """The command a user types: exit 2, one line (before: ms-swift's INFO line above it, after 20 to 40 s)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [entry_point("gkd-train"), "run.extra_args=[--lora_rnak,8]", "run.dry_run=true"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, CACHE_ENV: str(table_cache), "GKD_OUTPUT_ROOT": str(tmp_path / "o")},
    )
    wall = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert (proc.stdout + proc.stderr).strip().splitlines() == [
        "gkd-train: invalid config: run.extra_args: ms-swift has no flag --lora_rnak"
    ]
    assert wall < 15, f"{wall:.1f} s (about 1.3 s on an idle 2-core machine)"  # loose: the suite runs in parallel
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None,
    reason="Transformer Engine is installed: megatron rlhf's flags are checked",
)
def test_a_megatron_dry_run_without_transformer_engine_says_the_flags_are_unchecked(table_cache, tmp_path, caplog):
    cfg, run_dir = point_config(
        [
            "backend=megatron",
            "model.student_dtype=null",
            "model.teacher_dtype=null",
            "run.extra_args=[--attn_impl,sdpa]",
        ],
        run_dir=tmp_path / "run",
    )
    with caplog.at_level("WARNING", logger="gkd_harness.train"):
        plan = dry_run(cfg, run_dir)
    assert "--attn_impl sdpa" in plan.replace("\\\n", " ")
    assert "Megatron argument classes need Transformer Engine" in caplog.text
    assert sorted(n for n in os.listdir(table_cache) if not n.startswith(".")) == [
        table_path(False).name
    ]  # .lock: the build's


def test_flags_and_paths_never_reach_folder_or_run_names(tmp_path, monkeypatch):
    """Issue 24: a path in run.extra_args or backend.deepspeed put ``/`` into the run name, so Hydra nested
    folders; both are left out of names (configs/hydra/default.yaml, override_dirname.exclude_keys)."""
    monkeypatch.setenv("GKD_OUTPUT_ROOT", str(tmp_path / "out"))
    cfg, run_dir = point_config(["run.extra_args=[--attn_impl,/x/y]", "backend.deepspeed=/etc/ds/zero3.json"])
    assert Path(run_dir).resolve() == (tmp_path / "out" / "runs" / "default").resolve()
    plan = dry_run(cfg, run_dir).replace("\\\n", " ").split()
    assert plan[plan.index("--run_name") + 1] == "default"
    assert plan[plan.index("--deepspeed") + 1] == "/etc/ds/zero3.json" and "/x/y" in plan
    cfg, run_dir = point_config(["gkd.beta=0.9", "run.extra_args=[--attn_impl,/x/y]"])
    assert run_dir.name == "gkd.beta=0.9" and run_dir.parent.name == "default"


def test_the_help_documents_extra_args():
    """Issue 24: run.extra_args was in no doc and no --help."""
    proc = subprocess.run([entry_point("gkd-train"), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "run.extra_args=[--tuner_type,lora,--lora_rank,8]" in proc.stdout
    assert "refused naming their config key" in proc.stdout
