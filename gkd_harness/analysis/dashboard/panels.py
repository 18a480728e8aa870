"""The standard panels of a sweep's dashboard, as plain data (no wandb import).

:func:`standard_sections` turns the sign-off criteria into sections of :class:`PanelSpec`; the sign-off
tolerances become :class:`Line` s drawn on the panel they bound. :func:`keep_available` leaves out the panels
whose metrics no run logged (e.g. the parameter-gradient check, measured only with
``monitor.spot_check.param_grad=true``), so a dashboard never references a metric its runs lack.

A tolerance line is a wandb line-plot expression over a metric the panel already plots, so it is drawn at the
steps where that metric was logged: ``${spot/grad_rel_l2}*0 + 0.001`` is the constant 1e-3; the loss
tolerance ``|loss - FP64| <= rtol * |FP64| + atol`` is ``${spot/loss_fp64}*rtol + atol`` (FP64 JSD >= 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Tuple

from gkd_harness.analysis.dashboard import names as n

__all__ = ["Line", "PanelSpec", "Section", "standard_sections", "keep_available", "expression_refs"]

_REF = re.compile(r"\$\{([^}]+)\}")


def _num(x: float) -> str:
    """A number as a wandb expression literal (``0.0001``, ``2e-06``)."""
    return format(float(x), ".10g")


def expression_refs(expression: str) -> Tuple[str, ...]:
    """Metric names referenced as ``${name}`` in a wandb expression."""
    return tuple(_REF.findall(expression))


@dataclass(frozen=True)
class Line:
    """A reference line: ``label`` (legend words) and a wandb line-plot expression."""

    label: str
    expression: str

    @staticmethod
    def constant(label: str, value: float, along: str) -> "Line":
        """A horizontal line at ``value``, drawn at the steps where metric ``along`` is logged."""
        return Line(label, f"${{{along}}}*0 + {_num(value)}")

    @staticmethod
    def affine(label: str, of: str, scale: float, offset: float) -> "Line":
        """``scale * of + offset`` at every step where metric ``of`` is logged."""
        return Line(label, f"${{{of}}}*{_num(scale)} + {_num(offset)}")


@dataclass(frozen=True)
class PanelSpec:
    """One panel.

    kind: ``line`` (history of ``metrics`` against the step, runs grouped as the runset groups them),
    ``bar`` (each run's summary of ``metrics``), ``scatter`` (x = config key ``config[0]``, y = summary of
    ``metrics[0]``), ``parallel`` (axes: the ``config`` keys, then the summaries of ``metrics``).
    config: harness config keys (``gkd.beta``), not yet prefixed for wandb.
    optional: left out, with a note, when no run logs its metrics.
    bands: a line plot of grouped runs draws each group's mean with a min-max band (the seeds of a variant).
    """

    kind: str
    title: str
    metrics: Tuple[str, ...]
    config: Tuple[str, ...] = ()
    lines: Tuple[Line, ...] = ()
    optional: bool = False
    log_y: Optional[bool] = None
    bands: bool = False

    @property
    def metric_refs(self) -> Tuple[str, ...]:
        """Every metric the panel reads: its own and those its lines' expressions use."""
        refs = list(self.metrics)
        for line in self.lines:
            refs += [r for r in expression_refs(line.expression) if r not in refs]
        return tuple(refs)


@dataclass(frozen=True)
class Section:
    name: str
    panels: Tuple[PanelSpec, ...] = field(default_factory=tuple)


def _enabled(criteria: Any, name: str) -> Optional[Any]:
    section = getattr(criteria, name, None)
    return section if section is not None and section.enabled else None


def standard_sections(criteria: Any) -> Tuple[Section, ...]:
    """The standard sections for the sign-off ``criteria`` (``gkd_harness.analysis.signoff.criteria.load_criteria()``).

    Tolerance lines come from the criteria that are enabled; a disabled criterion draws no line.
    """
    neg = _enabled(criteria, "no_negative_patched")
    nonfinite = _enabled(criteria, "no_nonfinite")
    spot = _enabled(criteria, "spot_tolerance")

    def limit(crit: Any, attr: str, label: str, along: str) -> Tuple[Line, ...]:
        if crit is None or getattr(crit, attr, None) is None:
            return ()
        return (Line.constant(label, getattr(crit, attr), along),)

    loss = Section(
        "Loss and gradient by variant",
        (
            PanelSpec(
                "line", "train/loss by variant (original = native precision, patched = fp32/fp64)", (n.TRAIN_LOSS,)
            ),
            PanelSpec("line", "train/grad_norm by variant", (n.TRAIN_GRAD_NORM,)),
            PanelSpec("line", "gkd/jsd_loss (the JSD term alone)", (n.JSD_LOSS,), optional=True),
        ),
    )
    negative = Section(
        "Negative-loss calls",
        (
            PanelSpec("line", "Negative-loss calls per logging window (all ranks)", (n.NEG_CALLS,)),
            PanelSpec(
                "line",
                "Negative-loss calls, running total (line: allowed total for patched runs)",
                (n.NEG_CALLS_TOTAL,),
                lines=limit(neg, "max_negative_calls", "patched limit", n.NEG_CALLS_TOTAL),
            ),
            PanelSpec("bar", "Negative-loss calls: total per run", (n.NEG_CALLS_TOTAL,)),
            PanelSpec("bar", "Loss calls: total per run", (n.LOSS_CALLS_TOTAL,)),
            PanelSpec("line", "Share of positions with negative per-position JSD", (n.NEG_TOKEN_FRAC,)),
        ),
    )
    nonfin = Section(
        "Non-finite calls",
        (
            PanelSpec(
                "line",
                "Non-finite loss calls, running total (line: allowed total for patched runs)",
                (n.NONFINITE_TOTAL,),
                lines=limit(nonfinite, "max_nonfinite_calls", "patched limit", n.NONFINITE_TOTAL),
            ),
            PanelSpec("bar", "Non-finite loss calls: total per run", (n.NONFINITE_TOTAL,)),
        ),
    )
    spot_lines_abs = (
        ()
        if spot is None
        else (Line.affine("tolerance: rtol*|FP64| + atol", n.SPOT_LOSS_FP64, spot.loss_rtol, spot.loss_atol),)
    )
    spots = Section(
        "Spot checks against FP64 (lines: sign-off tolerances)",
        (
            PanelSpec(
                "line",
                "|loss - FP64 loss| (line: loss_rtol*|FP64| + loss_atol)",
                (n.SPOT_ABS_ERR,),
                lines=spot_lines_abs,
                log_y=True,
            ),
            PanelSpec(
                "line",
                "Relative loss error (line: loss_rtol)",
                (n.SPOT_REL_ERR,),
                lines=limit(spot, "loss_rtol", "loss_rtol", n.SPOT_REL_ERR),
                log_y=True,
            ),
            PanelSpec(
                "line",
                "Logit-gradient error ||g - g64|| / ||g64|| (line: grad_rel_l2_max)",
                (n.SPOT_GRAD_REL_L2,),
                lines=limit(spot, "grad_rel_l2_max", "grad_rel_l2_max", n.SPOT_GRAD_REL_L2),
                log_y=True,
            ),
            PanelSpec(
                "line",
                "Parameter-gradient error (line: param_grad_rel_l2_max)",
                (n.SPOT_PARAM_GRAD_REL_L2,),
                lines=limit(spot, "param_grad_rel_l2_max", "param_grad_rel_l2_max", n.SPOT_PARAM_GRAD_REL_L2),
                optional=True,
                log_y=True,
            ),
            PanelSpec(
                "line",
                "Sign mismatch with FP64 (1 = the run's loss and FP64 disagree in sign)",
                (n.SPOT_SIGN_MISMATCH,),
            ),
        ),
    )
    min_jsd = Section(
        "Minimum token JSD",
        (
            PanelSpec(
                "line",
                "Minimum per-position JSD (line: 0, the JSD's lower bound)",
                (n.MIN_TOKEN_JSD,),
                lines=(Line.constant("0", 0.0, n.MIN_TOKEN_JSD),),
            ),
        ),
    )
    beta = Section(
        "beta view (the beta-curve)",
        (
            PanelSpec(
                "parallel",
                "beta, form, precision -> loss, grad_norm, negative calls, min token JSD",
                (n.TRAIN_LOSS, n.TRAIN_GRAD_NORM, n.NEG_CALLS_TOTAL, n.MIN_TOKEN_JSD),
                config=(n.BETA, n.BETA_FORM, n.PRECISION),
            ),
            PanelSpec("scatter", "Final train/loss against gkd.beta", (n.TRAIN_LOSS,), config=(n.BETA,)),
            PanelSpec("scatter", "Final train/grad_norm against gkd.beta", (n.TRAIN_GRAD_NORM,), config=(n.BETA,)),
            PanelSpec(
                "scatter", "Negative-loss calls (total) against gkd.beta", (n.NEG_CALLS_TOTAL,), config=(n.BETA,)
            ),
        ),
    )
    evaluation = Section(
        "Held-out evaluation (band: the seeds of a variant)",
        tuple(
            PanelSpec("line", title, (metric,), optional=True, bands=True)
            for metric, title in (
                (n.EVAL_JSD, "eval/jsd: held-out JSD at the run's beta and temperature"),
                (n.EVAL_FORWARD_KL, "eval/forward_kl: KL(teacher || student) on the held-out split"),
                (n.EVAL_REVERSE_KL, "eval/reverse_kl: KL(student || teacher) on the held-out split"),
                (n.EVAL_TOP1_AGREEMENT, "eval/top1_agreement: share of positions where student and teacher agree"),
            )
        ),
    )
    return (loss, negative, nonfin, spots, min_jsd, evaluation, beta)


def keep_available(sections: Iterable[Section], metric_keys: Iterable[str]) -> tuple:
    """-> (sections holding only panels whose every metric is in ``metric_keys``, [dropped panel notes]).

    An empty section is left out too (a section of optional panels none of which is kept, e.g. the held-out
    evaluation without ``monitor.eval``, in one note). A standard (non-optional) panel that is dropped is noted
    all the same: the runs did not log a metric the dashboard expects."""
    available = set(metric_keys)
    kept, dropped = [], []
    for sec in sections:
        panels, notes, missing_all = [], [], []
        for p in sec.panels:
            missing = [m for m in p.metric_refs if m not in available]
            if missing:
                notes.append(
                    f"{sec.name} / {p.title}: no run logged {', '.join(missing)}"
                    + ("" if p.optional else " (a standard panel)")
                )
                missing_all += [m for m in missing if m not in missing_all]
                continue
            panels.append(p)
        if panels:
            kept.append(Section(sec.name, tuple(panels)))
            dropped += notes
        elif len(notes) > 1 and all(p.optional for p in sec.panels):  # a whole optional section: one note
            dropped.append(f"{sec.name}: no run logged {', '.join(missing_all)}")
        else:
            dropped += notes
    return tuple(kept), dropped
