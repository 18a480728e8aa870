"""The launch plan: typed config + this node's environment -> the ms-swift argv and the process environment.

One function, :func:`build_plan`, makes it. ``gkd-train`` executes it, ``gkd-train run.dry_run=true`` prints it,
and ``python -m gkd_harness.launch.slurm`` prints it for every node of a SLURM job, so the dry run is exactly what runs: the
process layout (``gkd_harness.harness.launcher.node.node_layout``), the data-parallel size and the global batch size derived from
it, and the torchrun variables all come from the same objects.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from gkd_harness.harness.config.schema import EMBEDDED, ConfigError, EmbeddedConfig, MegatronBackendConfig, TrainConfig
from gkd_harness.harness.contract import PLUGIN_SETTINGS_FILE, SETTINGS_ENV
from gkd_harness.harness.launcher.extra_args import check_with_swift
from gkd_harness.harness.launcher.node import NodeLayout, detect_device, node_layout
from gkd_harness.harness.launcher.rollout_argv import needs_torchrun, rollout_env
from gkd_harness.harness.launcher.swift_argv import (
    ResolvedInputs,
    build_argv,
    megatron_batch_note,
    megatron_batch_sizes,
)
from gkd_harness.harness.launcher.wandb_env import WANDB_SERVICE_ENV

#: Prefixes of the variables the plan sets (shown by the dry run and saved in command.json; never a key).
SHOWN_PREFIXES = (
    "NPROC_PER_NODE",
    "NNODES",
    "NODE_RANK",
    "MASTER_",
    "WANDB_",
    "GKD_",
    "VLLM_",
    "HF_HUB_OFFLINE",
    "CUDA_VISIBLE_DEVICES",
)


@dataclass(frozen=True)
class LaunchPlan:
    """What ``gkd-train`` runs on this node.

    Attributes:
        argv: the ms-swift CLI command (``swift rlhf ...`` or ``megatron rlhf ...``).
        env: the variables the plan adds to the node's environment (torchrun, WANDB_*, plugin settings, rollout).
        layout: the node's process layout.
        device: ``cpu`` or ``cuda``.
        inputs: the student / teacher / dataset the argv names.
        data_parallel_size: the job's data-parallel size (Megatron: world / (TP × PP × CP); HF: world).
    """

    argv: List[str]
    env: Dict[str, str]
    layout: NodeLayout
    device: str
    inputs: ResolvedInputs
    data_parallel_size: int
    notes: List[str] = field(default_factory=list)

    def process_env(self, base_env: Mapping[str, str]) -> Dict[str, str]:
        """The full environment of the ms-swift process: ``base_env`` with the plan's variables on top. A node
        without torchrun gets none of the torchrun variables, even when ``base_env`` had them. The caller's wandb
        service (``WANDB_SERVICE``, set in any process with a live wandb run, and inherited by its children) is
        dropped: the ranks start their own, so a killed run's wandb stream ends with it and a resume can take the
        same run id again (before: "run ID ... is in use" from the caller's service, and the resume failed)."""
        out = dict(base_env)
        out.pop(WANDB_SERVICE_ENV, None)
        if not self.layout.torchrun:
            for key in ("NPROC_PER_NODE", "NNODES", "NODE_RANK"):
                out.pop(key, None)
        out.update(self.env)
        return out

    def shown_env(self) -> Dict[str, str]:
        """The plan's variables worth showing (never a credential)."""
        return {
            k: v
            for k, v in sorted(self.env.items())
            if k.startswith(SHOWN_PREFIXES) and "KEY" not in k and "TOKEN" not in k
        }

    def render(self, wrap: bool = True) -> str:
        """The plan as text: the torchrun variables, then the command."""
        lines = [
            f"# node {self.layout.node_rank} of {self.layout.nnodes}: {self.layout.nproc_per_node} process(es), "
            f"device {self.device}, data-parallel size {self.data_parallel_size}, "
            f"torchrun {'yes' if self.layout.torchrun else 'no'}"
        ]
        lines += [f"# {note}" for note in self.notes]
        lines += [f"{k}={shlex.quote(v)}" for k, v in self.shown_env().items()]
        lines.append(format_command(self.argv, wrap=wrap))
        return "\n".join(lines) + "\n"


def format_command(argv: Sequence[str], wrap: bool = False, indent: str = "") -> str:
    """A shell-quoted command; ``wrap`` puts every ``--flag [value]`` on its own continuation line."""
    if not wrap:
        return indent + shlex.join(argv)
    head: List[str] = []
    groups: List[List[str]] = []
    for tok in argv:
        # a script after a flag's value (torchrun's route file) starts its own line
        if tok.startswith("--") or (tok.endswith(".py") and groups and len(groups[-1]) >= 2):
            groups.append([tok])
        elif groups:
            groups[-1].append(tok)
        else:
            head.append(tok)
    lines = [shlex.join(head)] + [shlex.join(g) for g in groups]
    return indent + (" \\\n" + indent + "    ").join(lines)


def _embedded_spec(cfg: TrainConfig) -> EmbeddedConfig:
    """``model.embedded``: the spec of the embedded models and dataset (needed by either)."""
    if cfg.model.embedded is None:
        raise ConfigError(
            "model.embedded", f"must be set for the embedded models or dataset (model={EMBEDDED} or run.dataset=null)"
        )
    return cfg.model.embedded


def resolve_inputs(cfg: TrainConfig, build: bool) -> ResolvedInputs:
    """Concrete student / teacher / dataset. With ``build``, the embedded assets are built (or reused from the
    cache); without, their cache paths are named and nothing is built (the dry run)."""
    student, teacher, dataset = cfg.model.student, cfg.model.teacher, cfg.run.dataset
    if EMBEDDED in (student, teacher) or dataset is None:
        from gkd_harness.harness.fixtures.embedded import EmbeddedSpec, asset_paths, prepare_embedded

        spec = EmbeddedSpec(**dataclasses.asdict(_embedded_spec(cfg)))
        if build:
            assets = prepare_embedded(spec, label=_model_choice())  # a build says so: "building the tiny_distill ..."
            paths = (assets.student_dir, assets.teacher_dir, assets.dataset_path)
        else:
            paths = asset_paths(spec)
        student = str(paths[0]) if student == EMBEDDED else student
        teacher = str(paths[1]) if teacher == EMBEDDED else teacher
        dataset = str(paths[2]) if dataset is None else dataset
    return ResolvedInputs(
        student=student, teacher=teacher, dataset=str(dataset), val_dataset=_held_out(cfg, dataset, build)
    )


def _model_choice() -> Optional[str]:
    """The ``model=`` preset of the running Hydra app (None outside one), which names an embedded build."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get("model")
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        return None


def _held_out(cfg: TrainConfig, dataset: str, build: bool) -> Optional[str]:
    """The held-out split of ``monitor.eval`` (None when it is off): ``monitor.eval.dataset``, or the embedded
    dataset's disjoint validation split (built with ``build``; named only in the dry run)."""
    ev = cfg.monitor.eval
    if not ev.every_n_steps:
        return None
    if ev.dataset:
        return ev.dataset
    if cfg.run.dataset is not None:
        raise ConfigError(
            "monitor.eval.dataset",
            "needed with run.dataset (the embedded split only holds out rows of the embedded dataset)",
        )
    from gkd_harness.harness.fixtures.embedded import prepare_validation, validation_path

    seed = _embedded_spec(cfg).seed
    return str(
        prepare_validation(Path(dataset), ev.embedded_samples, seed)
        if build
        else validation_path(Path(dataset), ev.embedded_samples)
    )


def boundary_note(cfg: TrainConfig) -> str:
    """What the plugin does to the logits at the loss boundary (``model.student_dtype`` / ``teacher_dtype``)."""
    casts = [
        f"{side} logits cast to {dtype}"
        for side, dtype in (("student", cfg.model.student_dtype), ("teacher", cfg.model.teacher_dtype))
        if dtype
    ]
    if not casts:
        return f"loss {cfg.loss.precision}/{cfg.loss.beta_form}; loss boundary: no cast (logits as the backend delivers them)"
    return f"loss {cfg.loss.precision}/{cfg.loss.beta_form}; loss boundary: " + ", ".join(casts)


def data_parallel_size(cfg: TrainConfig, layout: NodeLayout) -> int:
    if isinstance(cfg.backend, MegatronBackendConfig):
        return megatron_batch_sizes(cfg.backend, layout, cfg.run.grad_accum)[0]
    return layout.world_size


def build_plan(
    cfg: TrainConfig,
    base_env: Mapping[str, str],
    run_dir: Path,
    run_name: str,
    wandb_mode: str,
    wandb_vars: Mapping[str, str],
    settings_path: Optional[Path],
    inputs: ResolvedInputs,
    extra_args: Sequence[str] = (),
    port_picker=None,
) -> LaunchPlan:
    """The launch plan of this node.

    Args:
        cfg: the validated typed config.
        base_env: this node's environment (``os.environ``, or a SLURM task's variables in the dry run).
        run_dir: the run folder (ms-swift's output goes to ``run_dir/swift``).
        run_name: the run's name (wandb name, ms-swift ``--run_name``).
        wandb_mode: the mode after the online -> offline fallback.
        wandb_vars: the ``WANDB_*`` variables (``gkd_harness.harness.launcher.wandb_env.wandb_env``).
        settings_path: the plugin settings file (None in a dry run: the plan names where it would be).
        inputs: the resolved student / teacher / dataset (:func:`resolve_inputs`).
        extra_args: appended last (``--resume_from_checkpoint DIR`` on a resumed run).
        port_picker: a free-port function for single-node runs (tests pin it).

    Raises:
        ConfigError: an invalid layout (naming the ``backend.*`` key or variable), ``run.extra_args`` that
            ms-swift's argument parser refuses, or an ms-swift outside the tested series
            (``run.allow_untested_swift``, :mod:`gkd_harness.harness.launcher.swift_version`).
    """
    from gkd_harness.harness.launcher.swift_version import check_swift_version

    swift_version = check_swift_version(cfg.run.allow_untested_swift)  # one line, exit 2, outside the tested series
    check_with_swift(cfg)  # run.extra_args through ms-swift's own parser (nothing to do when empty)
    device = detect_device(cfg.run.device, base_env)
    force = isinstance(cfg.backend, MegatronBackendConfig) or needs_torchrun(cfg)
    layout = node_layout(cfg.backend, base_env, force_torchrun=force, port_picker=port_picker)
    argv = build_argv(
        cfg,
        inputs,
        run_dir,
        layout,
        device=device,
        wandb_mode=wandb_mode,
        run_name=run_name,
        swift_version=swift_version,
    )
    argv += list(extra_args)
    env: Dict[str, str] = dict(layout.env())
    env.update(rollout_env(cfg, device=device))
    env.update(wandb_vars)
    env[SETTINGS_ENV] = str(settings_path if settings_path is not None else Path(run_dir) / PLUGIN_SETTINGS_FILE)
    if cfg.model.student == EMBEDDED:
        env["HF_HUB_OFFLINE"] = "1"  # the embedded models never need a hub
    env["PYTHONUNBUFFERED"] = "1"
    notes = [boundary_note(cfg)]
    if isinstance(cfg.backend, MegatronBackendConfig):
        notes.append(megatron_batch_note(cfg, layout))  # the layout was checked by megatron_argv
    return LaunchPlan(
        argv=argv,
        env=env,
        layout=layout,
        device=device,
        inputs=inputs,
        data_parallel_size=data_parallel_size(cfg, layout),
        notes=notes,
    )


__all__ = ["LaunchPlan", "build_plan", "resolve_inputs", "format_command", "data_parallel_size", "SETTINGS_ENV"]
