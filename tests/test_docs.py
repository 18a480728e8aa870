"""The docs: self-contained, every path they name exists, and the documented commands run.

Checked on README.md and docs/*.md:
- no reference to a file outside the repository (``../``, the design doc, numbered reports);
- every Markdown link and every backticked repository path exists;
- the README's notebook example runs on a sweep;
- the commands the README documents without a GPU or a cluster run and exit 0;
- the documented Python API block (docs/python-api.md, as a dry run), the own-models command (a dry run, as
  docs/own-models.md says), docs/cluster.md's SLURM dry-run listing and its `--config-dir` settings, and the
  README's criteria table against the criteria gkd-analyze evaluates.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import entry_point

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"(?<![.\w])\.\./|DESIGN\.md|\breports?/0\d\d|\breport 0\d\d|\bthe seed report\b", re.IGNORECASE)
#: a backticked repository path: a file with an extension, or a folder ending in "/"
REPO_PATH = re.compile(r"`((?:configs|harness|launch|analysis|bench|tests|docs)/[\w./-]*(?:\.\w+|/))`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_reference_outside_the_repository(doc):
    bad = [
        f"{doc.name}:{n}: {line.strip()}"
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc):
    text = doc.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists():
            missing.append(target)
    for path in REPO_PATH.findall(text):
        path = path.rstrip(".")
        if "*" in path or "<" in path or path.startswith("configs/local/default"):
            continue
        if not (REPO / path).exists():
            missing.append(path)
    assert not missing, missing


def test_readme_notebook_example_runs(tmp_path):
    from gkd_harness.bench.synthetic import write_sweep

    sweep = tmp_path / "smoke"
    write_sweep(sweep)
    readme = (REPO / "README.md").read_text()
    block = re.search(r"In a notebook.*?```python\n(.*?)```", readme, flags=re.S).group(1)
    code = block.replace('"outputs/multirun/smoke"', repr(str(sweep)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


COMMANDS = [
    ["gkd-train", "run.dry_run=true"],
    ["gkd-train", "--cfg", "job"],
    ["gkd-train", "--version"],
    ["gkd-train", "--help"],
    ["gkd-replay", "--version"],
    ["gkd-bench", "--version"],
    ["gkd-dashboard", "--version"],
    ["gkd-analyze", "--help"],
    ["gkd-analyze", "--version"],
    ["gkd-dashboard", "--help"],
    ["gkd-replay", "synthetic"],
    ["gkd-bench", "--help"],
    ["gkd-certify", "--help"],
    ["gkd-certify", "--version"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_documented_command_runs(cmd, tmp_path):
    env = dict(os.environ, GKD_OUTPUT_ROOT=str(tmp_path / "outputs"))
    proc = subprocess.run(
        [entry_point(cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if "--help" in cmd:
        assert "``" not in proc.stdout, "raw RST backticks in --help"
        if cmd[0] in ("gkd-train", "gkd-analyze", "gkd-dashboard", "gkd-certify"):
            assert "Exit codes" in proc.stdout or "exit codes" in proc.stdout.lower(), "--help lists no exit codes"
    if cmd == ["gkd-train", "run.dry_run=true"]:
        assert not (tmp_path / "outputs").exists()


def test_slurm_dry_run_as_documented():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gkd_harness.launch.slurm",
            "experiment=precision_ab",
            "hydra.launcher.nodes=2",
            "hydra.launcher.gpus_per_node=8",
            "run.dataset=x/y",
            "monitor.eval.dataset=x/z",
            "--max-points",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--global_batch_size 16" in proc.stdout and "NNODES=2" in proc.stdout


def _blocks(doc: str, lang: str) -> list:
    return re.findall(rf"```{lang}\n(.*?)```", (REPO / doc).read_text(), flags=re.S)


def test_python_api_snippet_runs_as_documented(tmp_path):
    """docs/python-api.md's run-and-sweep block, with the EXTRA the doc names (run.dry_run=true): compose three
    points, print each plan, train nothing and write nothing."""
    block = _blocks("docs/python-api.md", "python")[0]
    assert "EXTRA = []" in block
    code = block.replace("EXTRA = []", 'EXTRA = ["run.dry_run=true"]', 1)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("swift rlhf") == 3 and proc.stdout.count("dry_run") == 3, proc.stdout[-2000:]
    assert "fp32 0.5 " in proc.stdout and str(tmp_path / "outputs" / "notebook" / "one_run") in proc.stdout
    assert not (tmp_path / "outputs").exists()  # a dry run writes nothing


def test_own_models_command_runs_as_documented(tmp_path):
    """docs/own-models.md's first command (a dry run, as the doc says), on checkpoint folders and the doc's own
    two-row jsonl placed at the doc's paths under a temporary root: exit 0, and the plan names them."""
    cmd = _blocks("docs/own-models.md", "bash")[0]
    rows = _blocks("docs/own-models.md", "json")[0]
    assert "run.dry_run=true" in cmd
    for name in ("student", "teacher"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 400}')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(rows)
    cmd = cmd.replace("/models/", f"{tmp_path}/models/").replace("/data/", f"{tmp_path}/data/")
    cmd = cmd.replace("gkd-train", entry_point("gkd-train"), 1)
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"--model {tmp_path}/models/student" in proc.stdout
    assert f"--teacher_model {tmp_path}/models/teacher" in proc.stdout
    assert f"--dataset {tmp_path}/data/train.jsonl" in proc.stdout


def test_readme_criteria_table_lists_every_criterion():
    """The README's criteria table names exactly the criteria gkd-analyze evaluates and prints, in its order."""
    from gkd_harness.analysis.signoff.criteria import CRITERIA

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| criterion | passes when |") :].split("\n\n", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", table, flags=re.M) == list(CRITERIA)


def _flags(text: str) -> list:
    """The ``--flag value`` lines of node 0's ms-swift command in a ``gkd_harness.launch.slurm --wrap`` listing, with the
    repository's own path (the plugin) written as REPO."""
    cmd = text[text.index("megatron rlhf \\") :].split("-> ", 1)[0]
    out = [ln.strip().rstrip("\\").strip() for ln in cmd.splitlines()[1:] if ln.strip().startswith("--")]
    return [re.sub(r"\S*/harness/", "REPO/harness/", ln) for ln in out]


def test_cluster_doc_dry_run_is_what_the_command_prints():
    """docs/cluster.md's SLURM dry-run listing: node 0's ms-swift flags are the ones the documented command
    prints today (before: a --vllm_max_model_len 512 no longer emitted, an old plugin path)."""
    doc = (REPO / "docs" / "cluster.md").read_text()
    shown = doc[doc.index("# SLURM dry run:") :]
    env = dict(os.environ, GKD_OUTPUT_ROOT="/shared/gkd-runs")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gkd_harness.launch.slurm",
            "experiment=precision_ab",
            "hydra.launcher.nodes=2",
            "hydra.launcher.gpus_per_node=8",
            "run.dataset=my-org/gkd-prompts",
            "monitor.eval.dataset=my-org/gkd-held-out",
            "run.max_steps=200",
            "--max-points",
            "1",
            "--wrap",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _flags(shown) == _flags(proc.stdout)


def test_config_dir_settings_reach_the_plan(tmp_path):
    """docs/cluster.md, wheel installs: DIR/local/default.yaml handed over with --config-dir is loaded through
    `optional local: default` (the same mechanism on an editable install)."""
    (tmp_path / "mine" / "local").mkdir(parents=True)
    (tmp_path / "mine" / "local" / "default.yaml").write_text(
        "# @package _global_\nrun:\n  seed: 7\ntracking:\n  wandb:\n    entity: my-team\n"
    )
    proc = subprocess.run(
        [entry_point("gkd-train"), "--config-dir", str(tmp_path / "mine"), "run.dry_run=true"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--seed 7" in proc.stdout and "WANDB_ENTITY=my-team" in proc.stdout


def test_cluster_doc_sweep_commands_exit_as_documented(tmp_path):
    """docs/cluster.md's sweep listings: every ``$ gkd-train ...  # ...; exit status N`` runs, exits N and prints
    the lines shown under it (before: the doc said a sweep whose points all fail validation exits 1; it exits 2)."""
    doc = (REPO / "docs" / "cluster.md").read_text()
    block = doc[doc.index("$ gkd-train -m experiment=smoke") :].split("```", 1)[0]
    runs = re.findall(r"^\$ (gkd-train[^#\n]*?)\s+#[^\n]*exit status (\d)\n(.*?)(?=^\$ |\Z)", block, flags=re.M | re.S)
    assert runs, "no documented exit status"
    for cmd, code, shown in runs:
        argv = cmd.split()
        proc = subprocess.run(
            [entry_point(argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env=dict(os.environ, GKD_OUTPUT_ROOT="outputs"),
        )
        assert proc.returncode == int(code), cmd + "\n" + proc.stdout[-2000:] + proc.stderr[-2000:]
        for line in (ln for ln in shown.splitlines() if ln.strip() and ln.strip() != "…"):
            assert line in proc.stdout, (line, proc.stdout[-3000:])


def test_piped_log_gets_a_line_a_minute_as_documented():
    """docs/cluster.md: in a log, a new line when a point starts or ends, and otherwise one a minute (before, the
    doc said a line only when a point starts or ends)."""
    import io

    from gkd_harness.harness.launcher.progress import ProgressDisplay, Running, Snapshot

    assert "and otherwise one a minute" in " ".join((REPO / "docs" / "cluster.md").read_text().split())
    now = [0.0]
    out = io.StringIO()
    display = ProgressDisplay(stream=out, live=False, clock=lambda: now[0])  # the default cadence
    for t in range(0, 181, 10):  # one point, a step every 10 s for 3 minutes
        now[0] = float(t)
        display.update(Snapshot(label="s", total=2, done=0, failed=0, running=(Running("a", t // 10, 100),)))
    now[0] = 185.0
    display.update(Snapshot(label="s", total=2, done=1, failed=0, running=(Running("b", 0, 100),)))
    steps = [re.search(r"\| (\S+) step (\d+)/", ln).groups() for ln in out.getvalue().splitlines()]
    assert steps == [("a", "0"), ("a", "6"), ("a", "12"), ("a", "18"), ("b", "0")]


def test_python_api_claims_hold():
    """docs/python-api.md: point_config raises ConfigError for an unknown key or a wrongly typed value; a value out
    of range (gkd.beta=1.5) composes and validate_config / train raise ConfigError naming it (before, the doc said
    point_config raises it); gkd_analyze returns its exit code, a bad flag 2, and never raises SystemExit."""
    import contextlib
    import io

    from gkd_harness.analysis.cli import main as gkd_analyze
    from gkd_harness.harness.config.schema import ConfigError
    from gkd_harness.harness.config.validate import validate_config
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import train

    for overrides, key in ((["gkd.nope=1"], "gkd.nope"), (["gkd.beta=abc"], "gkd.beta")):
        with pytest.raises(ConfigError) as e:
            point_config(overrides)
        assert e.value.key == key
    cfg, _ = point_config(["gkd.beta=1.5", "run.output_dir=/nonexistent/never-written"])
    assert cfg.gkd.beta == 1.5
    for check in (validate_config, train):
        with pytest.raises(ConfigError, match=r"^gkd\.beta: must lie in \[0, 1\], got 1\.5$") as e:
            check(cfg)
        assert e.value.key == "gkd.beta"
    doc = " ".join((REPO / "docs" / "python-api.md").read_text().split())
    assert "a bad flag returns 2" in doc and "never raises `SystemExit`" in doc
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        assert gkd_analyze(["--no-such-flag"]) == 2
        assert gkd_analyze(["--version"]) == 0 and gkd_analyze(["--help"]) == 0
    assert "unrecognized arguments: --no-such-flag" in err.getvalue()


#: a repository path in a config file's comments: a file with an extension under a top-level folder
CONFIG_PATH = re.compile(
    r"(?<![\w./-])((?:configs|harness|launch|analysis|bench|tests|docs)/[\w/-]+\.(?:py|md|yaml|sh))"
)


def test_paths_named_in_configs_exist():
    """Every repository file a config names in its comments exists (before: submitit_slurm.yaml cited
    launch/resume.py; the resume logic is harness/launcher/resume.py)."""
    missing = [
        f"{p.relative_to(REPO)}: {m}"
        for p in sorted((REPO / "configs").rglob("*.yaml"))
        for m in CONFIG_PATH.findall(p.read_text())
        if not (REPO / m).exists() and not m.startswith("configs/local/default")
    ]  # git-ignored, the user's
    assert not missing, missing
