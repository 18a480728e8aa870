"""Candidate losses: any implementation of ms-swift's ``gkd_loss.py`` interface, loaded from a file or a module.

A candidate is named by ``loss.source``:

* ``PATH.py``: a file with ms-swift's interface (``gkd_loss``, and ``jsd_loss`` where present), such as
  ``swift/rlhf_trainers/gkd_loss.py`` of a pull-request branch;
* ``package.module``: an importable module with that interface;
* ``package.module:attr``: an importable ``gkd_loss`` drop-in (a function, or an object with ``gkd_loss``).

:func:`load_candidate` imports it, checks the interface and the signatures against the installed ms-swift's
(``swift.rlhf_trainers.gkd_loss``) and hashes the source; a refusal is a :class:`CandidateError` whose message is
one line naming the file and what is missing. :func:`candidate_terms` turns the candidate's ``gkd_loss`` into the
per-position form the instrument records (``GKDTerms``).

Provenance for every precision (torch-free, for ``summary.json`` and the wandb config):
:func:`loss_source_sha256` / :func:`loss_source_path` / :func:`loss_provenance`: ``native`` is the installed
ms-swift ``gkd_loss.py``, ``fp32`` / ``fp64`` the harness's own ``harness/loss`` sources, ``candidate`` the
candidate's source file.

A candidate may declare where it claims to change nothing relative to the installed ms-swift, by a module
attribute ``GKD_CERTIFY_UNCHANGED = ("float32/float32", ...)`` (student/teacher dtype pairs); ``gkd-certify``
then checks bit-identity with upstream on those pairs.

Importing this module imports neither torch nor ms-swift (only :func:`load_candidate` and :func:`candidate_terms`
do).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from gkd_harness.harness.config.source_files import find_module_file
from gkd_harness.harness.contract import CANDIDATE, CANDIDATE_DIR, NATIVE

#: The upstream module whose interface a candidate implements.
UPSTREAM_MODULE = "swift.rlhf_trainers.gkd_loss"
#: The attribute a candidate must define; ``jsd_loss`` is checked where present.
REQUIRED, OPTIONAL = ("gkd_loss",), ("jsd_loss",)
#: Module attribute: student/teacher dtype pairs where the candidate claims bit-identity with upstream.
UNCHANGED_ATTR = "GKD_CERTIFY_UNCHANGED"
HARNESS_LOSS_DIR = Path(__file__).resolve().parent

_MODULE_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?$")


class CandidateError(ValueError):
    """A candidate that cannot be used; the message is one line naming the source and what is wrong."""


@dataclasses.dataclass(frozen=True)
class SourceRef:
    """Where a candidate comes from: a file (``path``) or a module (``module`` and optional ``attr``)."""

    spec: str
    path: Optional[Path] = None
    module: Optional[str] = None
    attr: Optional[str] = None

    @property
    def is_file(self) -> bool:
        return self.path is not None


def resolve_source(source: str) -> SourceRef:
    """Parse ``loss.source``: a ``.py`` path (or any existing file) or ``package.module[:attr]``."""
    if not source or not str(source).strip():
        raise CandidateError("loss.source: empty (give PATH.py or package.module[:attr])")
    source = str(source).strip()
    p = Path(source).expanduser()
    if source.endswith(".py") or "/" in source or p.exists():
        return SourceRef(source, path=p.resolve())
    if not _MODULE_RE.match(source):
        raise CandidateError(f"loss.source: {source!r} is neither a .py file nor package.module[:attr]")
    module, _, attr = source.partition(":")
    return SourceRef(source, module=module, attr=attr or None)


def upstream_file() -> Optional[Path]:
    """The installed ms-swift ``gkd_loss.py`` (found without importing ms-swift)."""
    return find_module_file(UPSTREAM_MODULE)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _sha256_tree(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def source_file(source: str) -> Optional[Path]:
    """The file a candidate's code lives in (None when it cannot be found without importing)."""
    ref = resolve_source(source)
    if ref.path is not None:
        return ref.path
    return find_module_file(ref.module) if ref.module else None


def loss_source_path(precision: str, source: Optional[str] = None) -> Optional[str]:
    """Where the loss code of a run lives: upstream's gkd_loss.py (``native``), the harness's ``harness/loss``
    folder (``fp32``, ``fp64``) or the candidate's file (``candidate``)."""
    if precision == NATIVE:
        f = upstream_file()
        return str(f) if f else None
    if precision == CANDIDATE:
        f = source_file(source) if source else None
        return str(f) if f else None
    return str(HARNESS_LOSS_DIR)


def loss_source_sha256(precision: str, source: Optional[str] = None) -> Optional[str]:
    """sha256 of a run's loss code (see :func:`loss_source_path`; a folder hashes its ``*.py`` files by name and
    content in name order). None where the code cannot be found."""
    path = loss_source_path(precision, source)
    if path is None or not Path(path).exists():
        return None
    return _sha256_tree(Path(path)) if Path(path).is_dir() else sha256_file(Path(path))


def candidate_name(source: str, name: Optional[str] = None) -> str:
    """The label of a candidate: ``name``, else the file's stem, else the module spec."""
    if name:
        return name
    ref = resolve_source(source)
    return ref.path.stem if ref.path is not None else ref.spec


def loss_provenance(precision: str, source: Optional[str] = None, name: Optional[str] = None) -> Dict[str, Any]:
    """``{"name", "path", "sha256"}`` of a run's loss code (``name``: the candidate's label or the precision)."""
    label = candidate_name(source, name) if precision == CANDIDATE and source else precision
    return {"name": label, "path": loss_source_path(precision, source), "sha256": loss_source_sha256(precision, source)}


def candidate_tags(precision: str, source: Optional[str] = None, name: Optional[str] = None) -> Tuple[str, ...]:
    """wandb tags of a candidate run: ``candidate:<name>`` and ``sha256:<first 12 hex>`` (none for the others)."""
    if precision != CANDIDATE or not source:
        return ()
    sha = loss_source_sha256(precision, source)
    return (f"candidate:{candidate_name(source, name)}",) + ((f"sha256:{sha[:12]}",) if sha else ())


# ------------------------------------------------------------------------------------------------ signatures
@dataclasses.dataclass(frozen=True)
class Params:
    """A function's parameters as the interface check sees them."""

    names: Tuple[str, ...]  # positional-or-keyword, in order
    defaults: Tuple[bool, ...]  # has a default
    var_args: bool = False
    var_kwargs: bool = False
    required_kwonly: Tuple[str, ...] = ()


def params_from_callable(fn: Callable) -> Params:
    sig = inspect.signature(fn)
    names, defaults, req_kw = [], [], []
    var_args = var_kwargs = False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
            defaults.append(p.default is not p.empty)
        elif p.kind == p.VAR_POSITIONAL:
            var_args = True
        elif p.kind == p.VAR_KEYWORD:
            var_kwargs = True
        elif p.default is p.empty:
            req_kw.append(p.name)
    return Params(tuple(names), tuple(defaults), var_args, var_kwargs, tuple(req_kw))


def signature_problem(candidate: Params, upstream: Params) -> Optional[str]:
    """Why ``candidate`` cannot replace ``upstream`` at its call sites (None when it can).

    Accepted: the same parameter names in the same order (upstream's defaulted ones defaulted too), extra
    trailing parameters with defaults; or a catch-all ``(*args, **kwargs)``.
    """
    if candidate.required_kwonly:
        return f"required keyword-only parameter(s) {', '.join(candidate.required_kwonly)} (upstream has none)"
    if candidate.var_args and candidate.var_kwargs and not candidate.names:
        return None
    want = upstream.names
    got = candidate.names
    for i, name in enumerate(want):
        if i >= len(got):
            if candidate.var_args and candidate.var_kwargs:
                return None
            return f"missing parameter {name!r} (expected ({', '.join(want)}), got ({', '.join(got)}))"
        if got[i] != name:
            return f"parameter {i + 1} is {got[i]!r}, expected {name!r} (expected ({', '.join(want)}))"
        if upstream.defaults[i] and not candidate.defaults[i]:
            return f"parameter {name!r} has no default (upstream's has one)"
    extra = [n for n, d in zip(got[len(want) :], candidate.defaults[len(want) :]) if not d]
    if extra:
        return f"extra parameter(s) without default: {', '.join(extra)}"
    return None


# ------------------------------------------------------------------------------------------------ loading
@dataclasses.dataclass
class Candidate:
    """A loaded candidate: its label, where it came from, its hash and its functions."""

    name: str
    source: str
    path: Optional[str]
    sha256: Optional[str]
    gkd_loss: Callable
    jsd_loss: Optional[Callable] = None
    unchanged: Tuple[str, ...] = ()  # declared dtype pairs "student/teacher" where it claims to be upstream

    def provenance(self) -> Dict[str, Any]:
        return {"name": self.name, "source": self.source, "path": self.path, "sha256": self.sha256}


def _import_file(path: Path):
    digest = sha256_file(path)[:12]
    mod_name = f"gkd_candidate_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise CandidateError(f"{path}: cannot be loaded as a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException as e:  # noqa: BLE001 - any failure while importing is a refusal
        sys.modules.pop(mod_name, None)
        raise CandidateError(f"{path}: import failed: {type(e).__name__}: {_one_line(e)}") from None
    return mod


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _declared_unchanged(obj: Any) -> Tuple[str, ...]:
    value = getattr(obj, UNCHANGED_ATTR, ()) or ()
    if isinstance(value, str):
        value = (value,)
    return tuple(str(v) for v in value)


def load_candidate(source: str, name: Optional[str] = None) -> Candidate:
    """Import the candidate named by ``source`` and check it against the installed ms-swift's interface.

    Raises:
        CandidateError: missing file, import failure, no ``gkd_loss``, not callable, or a signature upstream's
            call sites cannot use; one line naming the file (or module) and what is missing.
    """
    ref = resolve_source(source)
    where = str(ref.path) if ref.is_file else ref.spec
    path: Optional[Path]
    if ref.path is not None:
        if not ref.path.exists():
            raise CandidateError(f"{ref.path}: no such file (loss.source)")
        if not ref.path.is_file():
            raise CandidateError(f"{ref.path}: not a file (loss.source)")
        mod = _import_file(ref.path)
        obj = mod
        path = ref.path
    else:
        module = ref.module or ref.spec  # resolve_source sets module whenever path is None
        try:
            mod = importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001
            raise CandidateError(f"{ref.module}: import failed: {type(e).__name__}: {_one_line(e)}") from None
        obj = mod
        if ref.attr:
            for part in ref.attr.split("."):
                if not hasattr(obj, part):
                    raise CandidateError(f"{ref.spec}: module {ref.module} has no attribute {ref.attr!r}")
                obj = getattr(obj, part)
        f = getattr(mod, "__file__", None)
        path = Path(f) if f else None
    from swift.rlhf_trainers import gkd_loss as upstream

    if ref.attr and callable(obj) and not hasattr(obj, "gkd_loss"):
        fns = {"gkd_loss": obj}
    else:
        fns = {n: getattr(obj, n) for n in REQUIRED + OPTIONAL if hasattr(obj, n)}
    for n in REQUIRED:
        if n not in fns:
            raise CandidateError(f"{where}: no {n} (a candidate implements ms-swift's gkd_loss.py interface)")
    for n, fn in fns.items():
        if not callable(fn):
            raise CandidateError(f"{where}: {n} is not callable")
        problem = signature_problem(params_from_callable(fn), params_from_callable(getattr(upstream, n)))
        if problem:
            raise CandidateError(f"{where}: {n} signature differs from ms-swift's: {problem}")
    return Candidate(
        name=candidate_name(source, name),
        source=str(source),
        path=str(path) if path else None,
        sha256=sha256_file(path) if path and path.is_file() else None,
        gkd_loss=fns["gkd_loss"],
        jsd_loss=fns.get("jsd_loss"),
        unchanged=_declared_unchanged(obj),
    )


def copy_into_run_folder(source: str, run_dir: str, folder_name: str = CANDIDATE_DIR) -> Optional[str]:
    """Copy the candidate's source file into ``run_dir/folder_name/`` (the evidence outlives the branch);
    returns the copy's path (None when the source has no file)."""
    f = source_file(source)
    if f is None or not f.is_file():
        return None
    dest = Path(run_dir) / folder_name
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f.name
    shutil.copyfile(f, target)
    return str(target)


def keep_in_run_folder(source: str, name: Optional[str], run_dir: str) -> Dict[str, Any]:
    """Copy the candidate's source into ``run_dir/candidate/`` and return what summary.json records of it:
    ``{"name", "source", "path", "sha256", "copy"}`` (``copy``: the copied file, relative to the run folder)."""
    copy = copy_into_run_folder(source, run_dir)
    prov = loss_provenance("candidate", source, name)
    return {
        "name": prov["name"],
        "source": source,
        "path": prov["path"],
        "sha256": prov["sha256"],
        "copy": str(Path(copy).relative_to(run_dir)) if copy else None,
    }


def run_source(source: str, run_dir: str) -> str:
    """What a rank loads: the run folder's copy of a file candidate (``run_dir/candidate/<file>``, written by
    gkd-train before ms-swift starts, so a relative ``loss.source`` and a moved branch do not matter), else
    ``source`` itself (a module, or a folder without the copy)."""
    ref = resolve_source(source)
    if ref.path is not None:
        copy = Path(run_dir) / CANDIDATE_DIR / ref.path.name
        if copy.is_file():
            return str(copy)
    return source


# ------------------------------------------------------------------------------------------------ instrument
def candidate_terms(gkd_loss: Callable, max_positions: int = 256) -> Callable:
    """The candidate's ``gkd_loss`` in the per-position form the instrument records (``GKDTerms``).

    ``total`` and ``num_valid`` are the candidate's own (with its graph). ms-swift's interface returns only the
    sum, so ``per_position [n]`` is the candidate evaluated row by row (detached, no graph) on the first
    ``max_positions`` active positions of the call: ``gkd/neg_token_frac`` and ``gkd/min_token_jsd`` of a
    candidate run are measured on those positions. The call's extra arguments (gather / log-softmax / KL
    functions, TP-aware under Megatron) are passed through, so every rank of a TP group makes the same calls.
    """
    import torch
    from swift.rlhf_trainers.gkd_loss import TeacherOutput, extract_active

    from gkd_harness.harness.loss.variants import GKDTerms

    def terms(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        total, num_valid = gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        with torch.no_grad():
            s_act, t_act, _ = extract_active(student_logits.detach(), teacher_output, labels)
            n = min(int(s_act.shape[0]), int(max_positions))
            lab = torch.zeros((1, 1), dtype=torch.long, device=labels.device)
            rows = []
            for i in range(n):

                def row(x, i=i):
                    return None if x is None else x[i : i + 1].unsqueeze(0)

                t_i = TeacherOutput(
                    full_logits=row(t_act.full_logits),
                    topk_logprobs=row(t_act.topk_logprobs),
                    topk_indices=row(t_act.topk_indices),
                    labels=lab,
                )
                v, _ = gkd_loss(row(s_act), t_i, lab, beta, temperature, *args, **kwargs)
                rows.append(v.detach().reshape(()))
            per = torch.stack(rows) if rows else total.detach().new_zeros((0,))
        return GKDTerms(total, num_valid, per)

    terms.__name__ = f"terms_{getattr(gkd_loss, '__name__', 'candidate')}"
    return terms


def main(argv=None) -> int:
    """``python -m gkd_harness.harness.loss.candidate SOURCE [NAME]``: load and check a candidate in a fresh process (what
    ``gkd_harness.harness.config.validate`` runs before any model loads). Prints ``ok NAME SHA256`` (exit 0) or the refusal
    in one line (exit 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m gkd_harness.harness.loss.candidate SOURCE [NAME]", file=sys.stderr)
        return 2
    try:
        cand = load_candidate(args[0], args[1] if len(args) > 1 else None)
    except CandidateError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"ok {cand.name} {cand.sha256}")
    return 0


__all__ = [
    "CandidateError",
    "Candidate",
    "SourceRef",
    "resolve_source",
    "load_candidate",
    "loss_source_sha256",
    "loss_source_path",
    "loss_provenance",
    "candidate_name",
    "candidate_tags",
    "keep_in_run_folder",
    "run_source",
    "copy_into_run_folder",
    "candidate_terms",
    "signature_problem",
    "params_from_callable",
    "upstream_file",
    "find_module_file",
    "UNCHANGED_ATTR",
]


if __name__ == "__main__":
    sys.exit(main())
