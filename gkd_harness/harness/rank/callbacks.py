"""The ``gkd_harness`` trainer callbacks (HF and Megatron): the instrument's metrics into the trainer's logs, the
instrument's step kept current, and, on the rank that owns the wandb run (global rank 0 on HF, the last rank on
Megatron: the last pipeline stage, which computes the loss), ``metrics.jsonl``, ``summary.json``'s world size,
dtypes, last step, loss calls and steps trained (:data:`~gkd_harness.harness.contract.LOSS_CALLS_FIELD`, in every
monitor mode: ``gkd-train`` fails a run with fewer calls than steps trained), and the harness
config on the wandb run."""

from __future__ import annotations

import atexit
import importlib
import math
import os
import sys
import time
from typing import Any, Dict, Optional

from gkd_harness.harness.contract import (
    CALLBACK_NAME,
    LOSS_CALLS_FIELD,
    STEPS_TRAINED_FIELD,
    SUMMARY_FILE,
    WANDB_DIR,
)
from gkd_harness.harness.rank import state
from gkd_harness.harness.rank.state import logger


def _run_folder():
    from gkd_harness.harness.store.run_folder import RunFolder

    return RunFolder(state.current().settings.run_dir)


def _runtime() -> Dict[str, Any]:
    """This rank's torch build and accelerator, for the report's provenance table: ``torch`` (version), ``cuda``
    (the CUDA version torch was built with, None for a CPU build), ``gpu`` (the first visible GPU's name, None
    without one), ``gpus`` (how many this rank sees)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpus": gpus,
    }


def _loss_call_fields(step: int) -> Dict[str, int]:
    """``{loss_calls, steps_trained}`` at trainer step ``step``: this process's training calls of the installed
    loss (the boundary's Python counter: no host sync) and the steps trained since train begin."""
    st = state.current()
    return {LOSS_CALLS_FIELD: int(st.boundary.train_calls), STEPS_TRAINED_FIELD: max(0, int(step) - st.begin_step)}


def _record_start(world_size: int, is_writer: bool, step: int = 0, explicit_wandb_step: bool = False) -> None:
    """Remember the step training begins at (every rank); summary fields (the loss-call counts start at 0, so a
    resumed attempt never shows the previous one's), the harness config on the wandb run and the rows a resumed
    wandb run lacks (``PluginSettings.wandb_replay``, logged as the backend logs: ``explicit_wandb_step`` on
    Megatron), only on the rank that owns the wandb run."""
    state.current().begin_step = int(step)
    if not is_writer:
        return
    _run_folder().update_summary(
        world_size=world_size,
        train_pid=os.getpid(),
        plugin={"rebound": state.current().rebound},
        runtime=_runtime(),
        **_loss_call_fields(step),
    )
    try:
        from gkd_harness.harness.rank.wandb_run import attach_to_wandb_run
        from gkd_harness.harness.store.provenance import package_versions

        attach_to_wandb_run(
            {
                **state.current().settings.config,
                "experiment": state.current().settings.experiment,
                "world_size": world_size,
                "versions": package_versions(),
            },
            run_dir=state.current().settings.run_dir,
        )
    except Exception as e:  # noqa: BLE001 - tracking never kills training
        logger.warning(f"could not add the harness config to the wandb run: {e}")
    replay = state.current().settings.wandb_replay
    if replay:
        from gkd_harness.harness.rank.wandb_run import replay_rows

        try:
            logged = replay_rows(replay, explicit_step=explicit_wandb_step)
            logger.info(f"{logged} of {len(replay)} metrics.jsonl rows the wandb run lacked replayed into it")
        except Exception as e:  # noqa: BLE001 - tracking never kills training
            logger.warning(f"could not replay {len(replay)} metrics.jsonl rows into the wandb run: {e}")


class RunFolderNotSharedError(RuntimeError):
    """A rank does not see the run folder that gkd-train on node 0 created (multi-node needs a shared folder)."""


def check_run_folder_shared() -> None:
    """Multi-node (``NNODES`` > 1 in ms-swift's environment, a process group started): every rank checks that it
    sees node 0's ``summary.json`` in the run folder, then one all-reduce (MIN) tells every rank the answer.

    gkd-train on node 0 writes ``summary.json`` before it starts ms-swift, and no rank reaches training before
    node 0's ms-swift joined the rendezvous, so a rank that does not see it is on a node with its own folder. The
    rank that writes ``metrics.jsonl`` and the dtypes (the last rank on Megatron) may be one of them: without
    this check node 0 ended only with "the harness plugin never reported". Raised on every rank, node 0's
    ``swift.log`` included, so gkd-train on node 0 fails with this line.

    Raises:
        RunFolderNotSharedError: naming the folder and how to set it.
    """
    import torch
    import torch.distributed as dist

    try:
        nnodes = int(os.environ.get("NNODES", "1") or 1)
    except ValueError:
        nnodes = 1
    if nnodes <= 1 or not (dist.is_available() and dist.is_initialized()):
        return
    from swift.utils import get_current_device

    folder = _run_folder()
    seen = folder.summary_path.is_file()
    flag = torch.tensor([1.0 if seen else 0.0], device=get_current_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if flag.item() < 1:
        import socket

        who = f"rank {dist.get_rank()} on {socket.gethostname()}" if not seen else "a rank on another node"
        raise RunFolderNotSharedError(
            f"run folder {folder.path} is not shared by the {nnodes} nodes: {who} does not see node 0's "
            f"{SUMMARY_FILE} there; set run.output_dir (or GKD_OUTPUT_ROOT) to a folder every node mounts at the "
            "same path (NFS, Lustre, /shared/...)"
        )


def _check_finite_logs(logs: Dict[str, Any], step: int) -> None:
    """With ``monitor.fail_on_nonfinite``: stop at a non-finite logged loss or grad_norm (every rank sees them)."""
    if not state.current().fail_on_nonfinite:
        return
    for key in ("loss", "grad_norm"):
        try:
            value = float(logs[key])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(value):
            from gkd_harness.harness.rank.instrument import NonFiniteError

            flush_records()  # the failure path: what was logged is on disk before the run stops

            raise NonFiniteError(
                f"non-finite {key} ({value}) at step {step}; monitor.fail_on_nonfinite=true stops the run"
            )


#: Seconds between two ``summary.json`` updates of the last step during training. ``metrics.jsonl`` gets every
#: record at once (fsynced on the same clock, :class:`~gkd_harness.harness.store.metrics_io.MetricsAppender`); the
#: summary is written at once when its dtypes change, at train end and on the failure and exit paths, and its
#: ``last_step`` is read from ``metrics.jsonl`` by ``gkd-train`` when the run ends (so nothing is lost when a rank
#: dies between two updates).
SUMMARY_INTERVAL_S = 10.0


class RunRecorder:
    """The writer rank's records of one run folder: ``metrics.jsonl`` lines as they come, ``summary.json`` fields
    merged in memory and written on a clock (:data:`SUMMARY_INTERVAL_S`) or at once when ``urgent``.

    Before (every logging step): a fsynced append to ``metrics.jsonl`` and a read + atomic rewrite + fsync of
    ``summary.json`` (about 1.8 ms of CPU and 15 ms of wall per step on a local disk).
    """

    def __init__(self, folder, interval_s: float = SUMMARY_INTERVAL_S):
        from gkd_harness.harness.store.metrics_io import MetricsAppender

        self.folder = folder
        self.interval_s = float(interval_s)
        self.metrics = MetricsAppender(folder.metrics_path, interval_s)
        self.pending: Dict[str, Any] = {}
        self.summary_writes = 0
        self.dtypes: Optional[tuple] = None  # (seen, arrived) last written to the summary
        self._written_at = time.monotonic()

    def log(self, record: Optional[Dict[str, Any]], fields: Dict[str, Any], urgent: bool = False) -> None:
        """Write ``record`` (None: none) to ``metrics.jsonl`` now; merge ``fields`` into the pending summary."""
        if record is not None:
            self.metrics.write(record)
        self.pending.update(fields)
        if urgent or time.monotonic() - self._written_at >= self.interval_s:
            self.flush(sync=False)

    def flush(self, sync: bool = True) -> None:
        """Write the pending summary fields (and fsync ``metrics.jsonl`` when ``sync``)."""
        if sync:
            self.metrics.sync()
        if self.pending:
            pending, self.pending = self.pending, {}
            self.folder.update_summary(**pending)
            self.summary_writes += 1
        self._written_at = time.monotonic()

    def close(self) -> None:
        """Flush everything and close ``metrics.jsonl`` (idempotent)."""
        try:
            self.flush()
        finally:
            self.metrics.close()


_RECORDER: Optional[RunRecorder] = None


def recorder() -> RunRecorder:
    """This process's :class:`RunRecorder` for the installed run folder (made on first use; flushed at exit)."""
    global _RECORDER
    run_dir = os.path.abspath(state.current().settings.run_dir)
    if _RECORDER is None or os.path.abspath(_RECORDER.folder.path) != run_dir:
        if _RECORDER is None:
            atexit.register(flush_records)
        else:
            flush_records()
        _RECORDER = RunRecorder(_run_folder())
    return _RECORDER


def flush_records() -> None:
    """Write everything buffered to the run folder and close ``metrics.jsonl`` (train end, failure and exit
    paths); never raises (a tracking failure never hides the run's own error)."""
    if _RECORDER is None:
        return
    try:
        _RECORDER.close()
    except Exception as e:  # noqa: BLE001
        logger.warning(f"could not write the run folder's records: {e}")


def _record_log(logs: Dict[str, Any], step: int, is_writer: bool) -> None:
    """One ``metrics.jsonl`` record and the summary's last step / dtypes; only on the rank that owns the wandb run.

    The record is in the file at once; the summary fields are written on a clock, or at once when the dtypes
    seen at the loss boundary change (:class:`RunRecorder`)."""
    if not is_writer:
        return
    from gkd_harness.harness.rank.wandb_run import design_record, update_wandb_config

    rec, rec_ = design_record(logs, step), recorder()
    fields: Dict[str, Any] = {"last_step": int(step), **_loss_call_fields(step)}
    urgent = False
    if state.current().boundary.seen:
        seen, arrived = state.current().boundary.seen, state.current().boundary.arrived
        if (seen, arrived) != rec_.dtypes:
            rec_.dtypes = (dict(seen), dict(arrived))
            fields.update(dtypes_seen=dict(seen), dtypes_arrived=dict(arrived))
            urgent = True
        if not state.current().dtypes_sent:
            state.current().dtypes_sent = True
            try:
                update_wandb_config({"dtypes_seen": seen, "dtypes_arrived": arrived})
            except Exception as e:  # noqa: BLE001
                logger.warning(f"could not add dtypes to the wandb run: {e}")
    rec_.log(rec, fields, urgent=urgent)


def _record_end(step: int, is_writer: bool) -> None:
    """At train end, on the writer rank: the final loss calls and steps trained, then every record flushed."""
    if is_writer:
        try:
            recorder().log(None, _loss_call_fields(step))
        except Exception as e:  # noqa: BLE001 - tracking never kills training (gkd-train then finds no count)
            logger.warning(f"could not record the loss calls: {e}")
    flush_records()


def _close_captures() -> None:
    """Write the instrument's queued captures (``gkd_harness.harness.rank.capture``) before the process ends."""
    inst = state.current().instrument if state.STATE is not None else None
    if inst is not None:
        for err in inst.close():
            logger.warning(err)


def _finish_wandb_run() -> None:
    """Close this process's wandb run synchronously, so its files are complete when ms-swift exits.

    Without it the run is closed by wandb's own service only after it notices the process is gone (measured:
    over a minute later), so a reader right after ``gkd-train`` returns can find a file with a header only.
    """
    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return
    try:
        wandb.finish()
    except Exception as e:  # noqa: BLE001 - tracking never kills training
        logger.warning(f"wandb.finish() failed: {e}")


def _eval_on() -> bool:
    """``monitor.eval.every_n_steps > 0`` in this run's config."""
    return bool(state.current().config.monitor.eval.every_n_steps)


def _make_hf_callback():
    from swift.callbacks import TrainerCallback

    class HarnessCallback(TrainerCallback):
        """HF-backend callback: metrics into ``custom_metrics``, step tracking, run-folder records."""

        def on_train_begin(self, args, tstate, control, **kwargs):
            import torch.distributed as dist

            from gkd_harness.harness.rank.call_site import check_rebound

            check_rebound()  # never train on upstream's loss unnoticed
            inst = state.current().instrument
            if inst is not None:
                inst.where.bind_rank_device(args.device)  # the rank's device, known by now (never at import)
                self.trainer.custom_metrics["train"].update(inst.metrics)
                model = self.trainer.model
                inst.params = lambda: [p for p in model.parameters() if p.requires_grad]
                inst.step = tstate.global_step + 1
            if getattr(args, "logging_nan_inf_filter", False):
                # HF replaces a NaN/Inf step loss by the window's mean (0.0 right after a log): log it as it is
                args.logging_nan_inf_filter = False
                logger.info("logging_nan_inf_filter turned off: NaN/Inf losses are logged as themselves")
            check_run_folder_shared()
            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            _record_start(world, is_writer=tstate.is_world_process_zero, step=tstate.global_step)

        def on_step_begin(self, args, tstate, control, **kwargs):
            if state.current().instrument is not None:
                state.current().instrument.step = tstate.global_step + 1

        def on_step_end(self, args, tstate, control, **kwargs):
            # the held-out evaluation also at the end of the run (ms-swift's loop runs it every eval_steps)
            strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
            if _eval_on() and strategy != "no" and tstate.max_steps and tstate.global_step >= tstate.max_steps:
                control.should_evaluate = True
            return control

        def on_log(self, args, tstate, control, logs=None, **kwargs):
            if logs and "train_runtime" not in logs:
                _record_log(logs, tstate.global_step, is_writer=tstate.is_world_process_zero)
                _check_finite_logs(logs, tstate.global_step)

        def on_train_end(self, args, tstate, control, **kwargs):
            _record_end(tstate.global_step, is_writer=tstate.is_world_process_zero)
            _close_captures()
            # Reporting callbacks (wandb's among them) come first in the trainer's list, so they are done here.
            _finish_wandb_run()

    return HarnessCallback


#: The prefix ms-swift's Megatron trainer gives its evaluation logs (``BaseMegatronTrainer.evaluate``:
#: ``self.on_log(logs=eval_metrics, prefix='eval_')``)
MEGATRON_EVAL_PREFIX = "eval_"


def _eval_only(logs: Dict[str, Any]) -> bool:
    """A record of an evaluation only: the harness's held-out ``eval/*`` metrics, or ms-swift's Megatron
    evaluation (every key ``eval_*``). The instrument's training window is not read for it, so it neither writes a
    second record of the training counters at that step nor empties the window of the next training log."""
    from gkd_harness.harness.contract import EVAL_METRICS

    return bool(logs) and all(k in EVAL_METRICS or k.startswith(MEGATRON_EVAL_PREFIX) for k in logs)


def _megatron_writer() -> bool:
    """The rank that owns ms-swift's Megatron wandb run: the last rank (on the last pipeline stage)."""
    from swift.utils import is_last_rank

    return bool(is_last_rank())


class ParamGradRefusedError(RuntimeError):
    """``monitor.spot_check.param_grad`` where the backward writes ``main_grad`` itself (Megatron's fusion)."""


def _megatron_params(trainer) -> Any:
    """``() -> [parameter]``: this rank's trainable student parameters in ms-swift's Megatron trainer, over every
    model chunk of ``trainer.unwrapped_models`` (one per virtual pipeline stage; with LoRA the adapters are the
    trainable ones). Under TP or PP they are this rank's shards / stages, so ``spot/param_grad_rel_l2`` is per rank
    (the metric keeps the largest).

    With activation recompute on (``args.recompute_granularity``; ms-swift's default is ``selective``) none are
    handed: megatron-core's checkpoint functions raise "Checkpointing is not compatible with .grad()" under the
    spot check's ``torch.autograd.grad`` (``megatron/core/tensor_parallel/random.py``), which would stop the run.
    gkd-train passes ``--recompute_granularity none`` when the check is on (``gkd_harness.harness.launcher.swift_argv``).

    Raises:
        ParamGradRefusedError: ``gradient_accumulation_fusion`` is on (ms-swift's args or a model chunk's config):
            the fused backward writes ``main_grad`` (the optimizer's gradients), which the check must not touch.
    """
    models = list(getattr(trainer, "unwrapped_models", None) or [])
    fused = [
        where
        for where, obj in [("args", trainer.args)]
        + [(f"model {i} config", getattr(m, "config", None)) for i, m in enumerate(models)]
        if getattr(obj, "gradient_accumulation_fusion", False)
    ]
    if fused:
        raise ParamGradRefusedError(
            f"monitor.spot_check.param_grad=true cannot run with gradient_accumulation_fusion on ({', '.join(fused)}): "
            "megatron-core's fused weight-gradient kernels write main_grad in the backward, so the check would add "
            "to training's gradients; pass --gradient_accumulation_fusion false (gkd-train does unless "
            "run.extra_args sets it) or turn the check off"
        )
    recompute = getattr(trainer.args, "recompute_granularity", None)
    if recompute:
        logger.warning(
            f"spot/param_grad_rel_l2 not measured: recompute_granularity={recompute} (megatron-core's "
            "activation checkpointing does not support torch.autograd.grad); set "
            "backend.recompute_granularity=none"
        )
        return lambda: []
    return lambda: [p for m in models for p in m.parameters() if p.requires_grad]


def _make_megatron_callback():
    from swift.megatron.callbacks.base import MegatronCallback

    class HarnessMegatronCallback(MegatronCallback):
        """Megatron-backend callback: step tracking and run-folder records (metrics computed at log time).

        ms-swift's Megatron wandb callback owns the run on the last rank (``is_last_rank``), which is also on the
        last pipeline stage, the one that computes the loss: that rank writes the run folder's records.
        """

        def on_train_begin(self):
            import torch.distributed as dist
            from swift.utils import get_current_device

            from gkd_harness.harness.rank.call_site import check_rebound

            check_rebound()  # never train on upstream's loss unnoticed
            inst = state.current().instrument
            if inst is not None:
                inst.where.bind_rank_device(get_current_device())  # set per rank by now
                if inst.param_grad:  # the model for monitor.spot_check.param_grad, as on HF
                    inst.params = _megatron_params(self.trainer)
            check_run_folder_shared()
            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            _record_start(world, is_writer=_megatron_writer(), step=int(self.state.iteration), explicit_wandb_step=True)

        def on_step_begin(self):
            if state.current().instrument is not None:
                state.current().instrument.step = int(self.state.iteration) + 1

        def on_eval_begin(self):
            from gkd_harness.harness.rank.evaluation import find_tap

            tap = find_tap(state.current().boundary)
            if tap is not None:
                tap.sums = None

        def on_eval_end(self):
            # every rank: the sums' all-reduce is a collective; logged as their own record at this iteration
            from gkd_harness.harness.rank.evaluation import find_tap

            tap = find_tap(state.current().boundary)
            values = tap.finish() if tap is not None else {}
            if values:
                self.trainer.on_log(logs={**values, "n_steps": 1})

        def on_log(self, logs):
            if state.current().instrument is not None and not _eval_only(logs):
                # every rank: the metrics' all-reduce is a collective
                from swift.trainers.mixin import SwiftMixin

                logs.update(SwiftMixin.compute_custom_metrics(state.current().instrument.metrics))
            _record_log(logs, int(self.state.iteration), is_writer=_megatron_writer())
            _check_finite_logs(logs, int(self.state.iteration))

        def on_train_end(self):
            _record_end(int(self.state.iteration), is_writer=_megatron_writer())
            _close_captures()
            _finish_wandb_run()

    return HarnessMegatronCallback


def _make_megatron_wandb_callback(base: Any) -> Any:
    """ms-swift's Megatron wandb callback (``base``, ``swift/megatron/callbacks/wandb.py``) with its files in the run
    folder's ``wandb/``, where the HF backend's go (``<run>/wandb/wandb/offline-run-*``).

    ms-swift calls ``wandb.init(dir=output_dir)`` on the last rank, and an explicit ``dir`` wins over
    ``WANDB_DIR``: with gkd-train's ``--output_dir <run>/swift`` the files landed in ``<run>/swift/wandb/``, outside
    the documented ``wandb sync`` glob. Everything else (run name, project, config, logging) is ms-swift's.
    """

    class RunFolderWandbCallback(base):
        def setup(self):
            st = state.STATE
            if st is not None and st.settings is not None:
                self.save_dir = os.path.join(st.settings.run_dir, WANDB_DIR)
                os.makedirs(self.save_dir, exist_ok=True)  # wandb falls back to /tmp for a missing dir
            super().setup()

    RunFolderWandbCallback._gkd_harness = True
    return RunFolderWandbCallback


def register_callbacks() -> Dict[str, str]:
    """Put the harness callback into ms-swift's HF and Megatron callback maps under ``gkd_harness``, and point
    the Megatron map's ``wandb`` callback at the run folder's ``wandb/`` (:func:`_make_megatron_wandb_callback`)."""
    result = {}
    for name, make, mod_name in (
        ("hf", _make_hf_callback, "swift.callbacks"),
        ("megatron", _make_megatron_callback, "swift.megatron.callbacks"),
    ):
        try:
            mod = importlib.import_module(mod_name)
            cb_map = mod.callbacks_map if name == "hf" else mod.megatron_callbacks_map
            cb_map[CALLBACK_NAME] = make()
            wandb_cb = cb_map.get("wandb")
            if name == "megatron" and wandb_cb is not None and not getattr(wandb_cb, "_gkd_harness", False):
                cb_map["wandb"] = _make_megatron_wandb_callback(wandb_cb)
            result[name] = "registered"
        except Exception as e:  # noqa: BLE001
            result[name] = f"skipped: {type(e).__name__}: {e}"
            logger.info(f"{name} callback not registered: {type(e).__name__}: {e}")
    return result
