"""The contract: every fact that crosses a process boundary, in one torch-free module.

``gkd-train`` (``gkd_harness.harness.launcher``) writes what the plugin inside ms-swift's ranks (``gkd_harness.harness.rank``) reads, both
write the run folder (``gkd_harness.harness.store``) that ``analysis/`` reads, and wandb carries the same names. This module
is the one home of those facts:

- the loss variants: precisions, beta forms, dtype names, and which runs are "original", "patched" or "reference";
- the sign-off's criterion statuses (``verdict.json``);
- the plugin settings: the environment variable, the file, the callback name and the typed :class:`PluginSettings`;
- the run-folder file names;
- the metric names (the same keys on the HF and Megatron backends, in wandb and in ``metrics.jsonl``).

It imports nothing from the harness and nothing heavy, so every layer may import it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple, get_args

# ---------------------------------------------------------------------------------------------------------------
# Loss variants
# ---------------------------------------------------------------------------------------------------------------
# Each set of names is one Literal type (what mypy checks a value against) and the tuple of its values (what the
# code checks at run time), derived from it: one definition each.

#: The precisions the harness computes itself (``gkd_harness.harness.loss.variants``): upstream arithmetic, promote
#: BF16/FP16 to FP32 before temperature, or everything in FP64.
BuiltinPrecision = Literal["native", "fp32", "fp64"]
BUILTIN_PRECISIONS: Tuple[BuiltinPrecision, ...] = get_args(BuiltinPrecision)
#: ``loss.precision``: a built-in one, or ``candidate``: a loss loaded from ``loss.source`` (a file with ms-swift's
#: gkd_loss.py interface, or ``package.module:attr``); a fix someone ships, so its role is "patched"
#: (``gkd_harness.harness.loss.candidate``).
Precision = Literal[BuiltinPrecision, "candidate"]
PRECISIONS: Tuple[Precision, ...] = get_args(Precision)
NATIVE, FP32, FP64, CANDIDATE = PRECISIONS
#: The run-folder sub-folder holding a copy of the candidate's source (the evidence outlives the branch).
CANDIDATE_DIR = "candidate"
#: ``loss.beta_form``: the GKD paper's weights (upstream) or the endpoint-continuous ones.
BetaForm = Literal["paper", "continuous"]
BETA_FORMS: Tuple[BetaForm, ...] = get_args(BetaForm)
PAPER, CONTINUOUS = BETA_FORMS
#: dtype names of ``model.student_dtype`` / ``model.teacher_dtype`` and ``gkd-replay --student-dtype``.
DtypeName = Literal["float32", "bfloat16", "float16", "float64"]
DTYPE_NAMES: Tuple[DtypeName, ...] = get_args(DtypeName)

#: What a run is, by its precision. ``reference`` (FP64 everywhere) is the yardstick, not a fix anyone ships, so
#: it is never called "patched": tags, tables, dashboards and the report all say "reference".
Role = Literal["original", "patched", "reference"]
ROLES: Tuple[Role, ...] = get_args(Role)
ORIGINAL, PATCHED, REFERENCE = ROLES
ROLE_BY_PRECISION: Dict[str, Role] = {NATIVE: ORIGINAL, FP32: PATCHED, FP64: REFERENCE, CANDIDATE: PATCHED}

#: A run's ``status`` in ``summary.json`` (``gkd_harness.harness.store.run_folder`` writes it, ``analysis`` reads it).
RunStatus = Literal["running", "completed", "failed", "interrupted"]
RUN_STATUSES: Tuple[RunStatus, ...] = get_args(RunStatus)

#: A sign-off criterion's status (``gkd_harness.analysis.signoff``, in ``verdict.json``): measured and met or not,
#: not measured (its evidence is missing), not applicable (the sweep's design lacks its subject), skipped (an
#: optional criterion that did not pass) or disabled (switched off in the criteria file).
CriterionStatus = Literal["pass", "fail", "not_measured", "not_applicable", "skipped", "disabled"]
CRITERION_STATUSES: Tuple[CriterionStatus, ...] = get_args(CriterionStatus)
#: The statuses that fail a sign-off: never ``not_applicable`` (a subject the design lacks is not a failure),
#: ``skipped`` or ``disabled``.
FAILING_STATUSES: Tuple[CriterionStatus, ...] = ("fail", "not_measured")


def role_of(precision: Optional[str]) -> str:
    """``original`` | ``patched`` | ``reference`` (``unknown`` for anything else)."""
    return ROLE_BY_PRECISION.get(precision or "", "unknown")


# ---------------------------------------------------------------------------------------------------------------
# The harness's cache folder (embedded models, ms-swift's flag table)
# ---------------------------------------------------------------------------------------------------------------
#: The variable that moves the cache folder (default ``~/.cache/gkd-harness``).
CACHE_ENV = "GKD_HARNESS_CACHE"


def cache_dir(env: Optional[Mapping[str, str]] = None) -> Path:
    """``$GKD_HARNESS_CACHE`` (from ``env``, default ``os.environ``), else ``~/.cache/gkd-harness``."""
    env = os.environ if env is None else env
    return Path(env[CACHE_ENV]).expanduser() if env.get(CACHE_ENV) else Path.home() / ".cache" / "gkd-harness"


# ---------------------------------------------------------------------------------------------------------------
# Launcher -> rank: the plugin settings
# ---------------------------------------------------------------------------------------------------------------
#: The variable that tells the plugin inside ms-swift where its settings file is.
SETTINGS_ENV = "GKD_HARNESS_PLUGIN_SETTINGS"
#: Set for on-policy runs; read in the ms-swift process by the rollout patches.
ROLLOUT_ENGINE_ENV = "GKD_ROLLOUT_ENGINE"
#: The module ms-swift loads by file path through ``--external_plugins`` (in every rank).
PLUGIN_MODULE = "gkd_harness.harness.rank.plugin"
#: The trainer callback's name in ms-swift's callback maps (``--callbacks gkd_harness``).
CALLBACK_NAME = "gkd_harness"


# ---------------------------------------------------------------------------------------------------------------
# The run folder
# ---------------------------------------------------------------------------------------------------------------
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"
SWIFT_LOG = "swift.log"


def swift_node_log(node: "int | str") -> str:
    """ms-swift's output on node ``node`` > 0 of a multi-node run (node 0 writes :data:`SWIFT_LOG`); such a file
    can land in the run folder before node 0 has written anything (a mark of the harness's folder)."""
    return f"swift.node{node}.log"


PLUGIN_SETTINGS_FILE = "plugin_settings.json"
LOCK_FILE = ".lock"
#: What a sweep planned (gkd_harness.launch.sweep writes it in the sweep folder before the first point starts).
SWEEP_MANIFEST_FILE = "sweep_manifest.json"
CAPTURES_DIR = "captures"
WANDB_DIR = "wandb"
SWIFT_DIR = "swift"
#: ``summary.json`` fields the rank that writes the records keeps current (at each log and at train end): the
#: training calls of the harness's ``gkd_loss`` (:class:`gkd_harness.harness.rank.boundary.DtypeBoundary`, every
#: monitor mode) and the optimizer steps trained, both counted by this attempt's process. ``gkd-train`` fails a run
#: with fewer calls than steps trained (``gkd_harness.harness.launcher.run.loss_bypass_error``).
LOSS_CALLS_FIELD = "loss_calls"
STEPS_TRAINED_FIELD = "steps_trained"
HYDRA_DIR = ".hydra"
ARCHIVE_DIR = "previous_attempts"
#: In each HF checkpoint folder (``swift/.../checkpoint-N/``), written by the rank at save time: the wandb run's
#: id and last committed step then, where a resumed attempt rewinds the wandb run to (``WANDB_RESUME_FROM``).
WANDB_STEP_FILE = "gkd_wandb_step.json"
#: Hydra's own files in ``.hydra/`` (written by the harness once it owns the folder); its ``config.yaml`` shares
#: the run's file name.
HYDRA_FILES = (CONFIG_FILE, "overrides.yaml", "hydra.yaml")
#: The ms-swift command gkd-train ran (``argv``, and the environment it set, secrets redacted).
COMMAND_FILE = "command.json"
#: A capture's file name in ``captures/`` (:func:`gkd_harness.harness.store.records.capture_path`).
CAPTURE_FILE = "step{step}_rank{rank}.safetensors"
#: ``summary.json`` field: sha256 of the data a run read, by config key (the training set, the held-out set),
#: recorded when the run starts: part of the run's identity (a file edited in place under one path is another run).
DATA_SHA256_FIELD = "data_sha256"
#: The config keys naming a run's data files (hashed into :data:`DATA_SHA256_FIELD`).
DATA_KEYS = ("run.dataset", "monitor.eval.dataset")
#: ``summary.json`` ``versions``: the packages whose arithmetic a result depends on; runs of one comparison agree
#: on each (``gkd_harness.analysis.sweep.evidence.mixed_evidence``).
IDENTITY_PACKAGES = ("ms-swift", "torch", "transformers")
#: Where the sweep's plan travels with a wandb run: a copy of ``sweep_manifest.json`` in the run's files, and the
#: run's point (its folder relative to the sweep folder) in its harness config under this key.
WANDB_POINT_KEY = "sweep_point"
#: The files of a run folder and a sweep folder that have a typed record (:mod:`gkd_harness.harness.store.records`):
#: only the store layer opens them by name (a layer test holds every other module to it).
RECORD_FILES = (SUMMARY_FILE, COMMAND_FILE, CONFIG_FILE, METRICS_FILE, SWEEP_MANIFEST_FILE)


@dataclasses.dataclass(frozen=True)
class PluginSettings:
    """What ``gkd-train`` hands to every rank: written once by the launcher, parsed once by the plugin.

    config: the resolved config as a plain dict (``gkd_harness.harness.config.schema.to_dict``).
    run_dir: the run folder (absolute).
    experiment: the experiment preset's name, if any.
    resume_totals: cumulative metric totals to continue from (a resumed run), by metric name.
    wandb_replay: ``metrics.jsonl`` rows (a resumed run) that the wandb run lacks up to the checkpoint (a killed
        rank's wandb file ended before it): the rank that owns the wandb run logs them before training continues.
    """

    config: Dict[str, Any]
    run_dir: str
    experiment: Optional[str] = None
    resume_totals: Dict[str, float] = dataclasses.field(default_factory=dict)
    wandb_replay: List[Dict[str, Any]] = dataclasses.field(default_factory=list)

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2, default=str))
        return path

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "PluginSettings":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown or "config" not in data or "run_dir" not in data:
            raise ValueError(f"plugin settings: expected keys {sorted(known)}, got {sorted(data)}")
        return cls(**dict(data))

    @classmethod
    def read(cls, path: str) -> "PluginSettings":
        with open(path) as f:
            return cls.from_mapping(json.load(f))


# ---------------------------------------------------------------------------------------------------------------
# Metric names
# ---------------------------------------------------------------------------------------------------------------

# training (ms-swift's own values under the harness's names)
TRAIN_LOSS = "train/loss"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_LEARNING_RATE = "train/learning_rate"
TRAIN_METRICS = (TRAIN_LOSS, TRAIN_GRAD_NORM, TRAIN_LEARNING_RATE)
#: ms-swift / transformers log keys -> harness names
HF_KEY_MAP = {"loss": TRAIN_LOSS, "grad_norm": TRAIN_GRAD_NORM, "learning_rate": TRAIN_LEARNING_RATE}

# per logging window, from the instrumented loss
JSD_LOSS = "gkd/jsd_loss"
SFT_LOSS = "gkd/sft_loss"
NEG_LOSS_CALLS = "gkd/neg_loss_calls"
NEG_TOKEN_FRAC = "gkd/neg_token_frac"
MIN_TOKEN_JSD = "gkd/min_token_jsd"
WINDOW_METRICS = (JSD_LOSS, SFT_LOSS, NEG_LOSS_CALLS, NEG_TOKEN_FRAC, MIN_TOKEN_JSD)

# cumulative over the run (a resumed run continues them)
NEG_LOSS_CALLS_TOTAL = "gkd/neg_loss_calls_total"
LOSS_CALLS_TOTAL = "gkd/loss_calls_total"
NONFINITE_CALLS_TOTAL = "gkd/nonfinite_calls_total"
CUMULATIVE_METRICS = (NEG_LOSS_CALLS_TOTAL, LOSS_CALLS_TOTAL, NONFINITE_CALLS_TOTAL)

# FP64 spot checks
SPOT_LOSS = "spot/loss"
SPOT_LOSS_FP64 = "spot/loss_fp64"
SPOT_LOSS_ABS_ERR = "spot/loss_abs_err"
SPOT_LOSS_REL_ERR = "spot/loss_rel_err"
SPOT_GRAD_REL_L2 = "spot/grad_rel_l2"
SPOT_SIGN_MISMATCH = "spot/sign_mismatch"
SPOT_METRICS = (SPOT_LOSS, SPOT_LOSS_FP64, SPOT_LOSS_ABS_ERR, SPOT_LOSS_REL_ERR, SPOT_GRAD_REL_L2, SPOT_SIGN_MISMATCH)
SPOT_PARAM_GRAD_REL_L2 = "spot/param_grad_rel_l2"
#: The student dtype's own share of the gradient tolerance: LOW_PRECISION_GRAD_FACTOR x the rounding of the FP64
#: gradient to the student dtype (gkd_harness.harness.loss.tolerances.grad_tol minus its FP32 part; 0 for an FP32/FP64 student).
SPOT_GRAD_REL_L2_DTYPE_FLOOR = "spot/grad_rel_l2_dtype_floor"

#: The one top-level key of the harness's config in a wandb run's config, logged nested under it
#: (``{"harness": {"gkd": {"beta": 0.5}}}``; wandb stores it as ``harness.value.gkd.beta``), so wandb-workspaces
#: addresses it as ``Config("harness.gkd.beta")`` and keeps it through its own load-and-save. The analysis readers
#: flatten it to ``harness.gkd.beta`` (gkd_harness.harness.rank.wandb_run, gkd_harness.analysis.dashboard.names).
WANDB_CONFIG_KEY = "harness"

# transformers' step metric (the optimizer step, the x-axis of every dashboard line plot)
TRAIN_GLOBAL_STEP = "train/global_step"

# on-policy rollouts (gkd_harness.harness.rank.rollout_patches)
ROLLOUT_COMPLETION_TOKENS = "rollout/completion_tokens"
ROLLOUT_ON_POLICY_FRAC = "rollout/on_policy_frac"
ROLLOUT_ON_POLICY_LOSS_TOKENS = "rollout/on_policy_loss_tokens"
ROLLOUT_METRICS = (ROLLOUT_COMPLETION_TOKENS, ROLLOUT_ON_POLICY_FRAC, ROLLOUT_ON_POLICY_LOSS_TOKENS)

# held-out evaluation (gkd_harness.harness.rank.evaluation): the student against the teacher on the held-out split, in FP64
# on the logits as they reach the loss, at the run's beta, beta form and temperature; token-weighted means
EVAL_JSD = "eval/jsd"
EVAL_FORWARD_KL = "eval/forward_kl"  # KL(teacher || student)
EVAL_REVERSE_KL = "eval/reverse_kl"  # KL(student || teacher)
EVAL_TOP1_AGREEMENT = "eval/top1_agreement"
EVAL_TOKENS = "eval/tokens"  # positions evaluated (the same every evaluation of a run)
EVAL_METRICS = (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL, EVAL_TOP1_AGREEMENT, EVAL_TOKENS)
#: The held-out split next to the embedded training file (gkd_harness.harness.fixtures.embedded), by its row count.
VALIDATION_FILE = "validation-{n}.jsonl"

#: prefixes of the harness's own metrics (kept under these names in wandb on both backends)
HARNESS_PREFIXES = ("gkd/", "spot/", "rollout/", "eval/")
#: wandb summary aggregation per metric
WANDB_SUMMARIES = {
    NEG_LOSS_CALLS_TOTAL: "max",
    NONFINITE_CALLS_TOTAL: "max",
    LOSS_CALLS_TOTAL: "max",
    NEG_LOSS_CALLS: "max",
    NEG_TOKEN_FRAC: "max",
    MIN_TOKEN_JSD: "min",
    SPOT_LOSS_ABS_ERR: "max",
    SPOT_LOSS_REL_ERR: "max",
    SPOT_GRAD_REL_L2: "max",
    SPOT_SIGN_MISMATCH: "max",
    SPOT_PARAM_GRAD_REL_L2: "max",
    SPOT_GRAD_REL_L2_DTYPE_FLOOR: "max",
    EVAL_JSD: "last",
    EVAL_FORWARD_KL: "last",
    EVAL_REVERSE_KL: "last",
    EVAL_TOP1_AGREEMENT: "last",
}
ALL_METRICS = (
    TRAIN_METRICS
    + WINDOW_METRICS
    + CUMULATIVE_METRICS
    + SPOT_METRICS
    + (SPOT_PARAM_GRAD_REL_L2, SPOT_GRAD_REL_L2_DTYPE_FLOOR)
    + EVAL_METRICS
)

#: ``model.embedded.tokenizer`` values: the locally trained BPE, or one of Qwen's real vocabularies
#: (gkd_harness.harness.fixtures.embedded builds them; gkd_harness.harness.config.validate checks the key)
EMBEDDED_TOKENIZERS = ("bytes", "qwen3", "qwen35")
