"""Regression tests for a GKD loss with ms-swift's ``gkd_loss`` interface: the gkd-harness certificate, exported.

Written by ``gkd-certify --export-pytest`` (gkd-harness, docs/certify.md). The certificate's own modules (its
families, its random search, its judge, the FP64 reference and the tolerances) are embedded below as source text
(``_SOURCES``) and imported under a private package name; this module imports only torch, numpy,
pytest, the standard library and the module under test (``TARGET``). Every case of every family the certificate's
verdict counts (``gkd-certify`` without ``--strict``) is one test here, judged by the certificate's own
``evaluate``; the search's draws for ``SEARCH_SEED`` are fixed cases. What the module leaves out, and why, is
``LEFT_OUT`` (also printed by the export). Run: ``pytest THIS_FILE``.

Options (environment): ``GKD_EXPORT_QUICK=1`` the certificate's ``--quick`` subset; ``GKD_EXPORT_REQUIRE_ALL=1``
a case that cannot run here (torch.distributed without gloo) fails instead of skipping with its reason.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import math
import os
import re
import socket
import sys
import tempfile
import types
from typing import Any, Dict, List, Tuple

import pytest
import torch

TARGET = "swift.rlhf_trainers.gkd_loss"  # EXPORT: target
FORM = "paper"  # EXPORT: form
SEARCH_SEED = 0  # EXPORT: search-seed
LEFT_OUT: Dict[str, str] = {}  # EXPORT: left-out
_SOURCES: Dict[str, str] = {}  # EXPORT: sources
_TARGET_NAMES: Dict[str, List[str]] = {}  # EXPORT: target-names

QUICK = os.environ.get("GKD_EXPORT_QUICK") == "1"
REQUIRE_ALL = os.environ.get("GKD_EXPORT_REQUIRE_ALL") == "1"
#: The embedded modules' package: gkd_harness's name, private to this module (several exports run in one session).
PACKAGE = "_gkd_export_" + re.sub(r"\W", "_", __name__)
_HARNESS_IMPORT = re.compile(r"^(\s*)(from|import) gkd_harness(?=[.\s])", re.M)


# ------------------------------------------------------------------------------------------------ the embedded certificate
class _Embedded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``PACKAGE.<module>`` from ``_SOURCES`` (the harness's ``gkd_harness.<module>``, its imports of the
    harness renamed so); the parents are empty packages. Names a module imported from ms-swift's loss file (the
    export removed those imports) are bound to the target's."""

    def find_spec(self, name, path=None, target=None):
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        rel = name[len(PACKAGE) + 1 :]
        package = rel not in _SOURCES
        if package and rel and not any(k.startswith(rel + ".") for k in _SOURCES):
            return None
        return importlib.util.spec_from_loader(name, self, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        rel = module.__name__[len(PACKAGE) + 1 :]
        if rel not in _SOURCES:
            return
        filename = f"<gkd-harness {rel}.py>"
        linecache.cache[filename] = (len(_SOURCES[rel]), None, _SOURCES[rel].splitlines(True), filename)
        if "target" in globals():  # else bound once it is loaded (_bind_target)
            module.__dict__.update({name: getattr(target, name) for name in _TARGET_NAMES.get(rel, ())})
        source = _HARNESS_IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} {PACKAGE}", _SOURCES[rel])
        exec(compile(source, filename, "exec"), module.__dict__)


def _load_target() -> types.ModuleType:
    if TARGET.endswith(".py"):
        spec = importlib.util.spec_from_file_location("gkd_loss_under_test", TARGET)
        if spec is None or spec.loader is None:
            raise ImportError(f"{TARGET}: cannot be loaded as a module")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(TARGET)


if not any(isinstance(f, _Embedded) for f in sys.meta_path):
    sys.meta_path.insert(0, _Embedded())
_evaluate = importlib.import_module(f"{PACKAGE}.analysis.certify.evaluate")
_state_before_import = _evaluate.torch_state()
target = _load_target()
for _rel, _names in _TARGET_NAMES.items():
    if f"{PACKAGE}.{_rel}" in sys.modules:
        sys.modules[f"{PACKAGE}.{_rel}"].__dict__.update({name: getattr(target, name) for name in _names})
_state_changed_by_import = [
    k for k, v in _state_before_import.items() if not _evaluate._equal_state(v, _evaluate.torch_state().get(k))
]
_certificate = importlib.import_module(f"{PACKAGE}.analysis.certify.certificate")
_search = importlib.import_module(f"{PACKAGE}.analysis.certify.search")


def exported_families() -> List[Any]:
    """The families the certificate's verdict counts for a candidate that declares nothing (``gkd-certify``
    without ``--strict``: the required ones and the search), less ``LEFT_OUT``."""
    fams = _certificate.families_for(types.SimpleNamespace(unchanged=()), False, (), (SEARCH_SEED, _search.DRAWS, None))
    return [f for f in fams if f.required and f.name not in LEFT_OUT]


def _all_cases() -> List[Tuple[str, Any]]:
    return [(f.name, c) for f in exported_families() for c in f.build(FORM, QUICK)]


CASES = _all_cases()


def test_importing_the_target_leaves_global_torch_state():
    assert not _state_changed_by_import, f"importing {TARGET} changed global torch state: {_state_changed_by_import}"


@pytest.mark.parametrize("family,case", CASES, ids=[f"{name} | {c.id}" for name, c in CASES])
def test_case(family, case):
    """One case of the certificate through ``target.gkd_loss``, judged by the certificate's ``evaluate``."""
    result = _evaluate.evaluate(target.gkd_loss, case)
    assert not result.failed, f"{family}: {case.id}: {result.note}" + (
        f" (reproduce: gkd-certify CANDIDATE {case.repro})" if case.repro else ""
    )


# ------------------------------------------------------------------------------------------------ 2 gloo ranks
def _gloo_missing() -> str:
    dist = torch.distributed
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend in this torch build"
    return ""


class _ReduceSum(torch.autograd.Function):
    """Sum over the ranks; backward identity (the consumer is replicated, as Megatron's reduce-from-TP region)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        torch.distributed.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _VocabParallelLogSoftmax(torch.autograd.Function):
    """Log-softmax of this rank's vocabulary shard over the whole vocabulary (max and Σ exp all-reduced)."""

    @staticmethod
    def forward(ctx, x):
        m = x.amax(-1)
        torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        sumexp = (x - m[..., None]).exp().sum(-1)
        torch.distributed.all_reduce(sumexp)
        out = x - m[..., None] - sumexp.log()[..., None]
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        total = g.sum(-1)
        torch.distributed.all_reduce(total)
        return g - out.exp() * total[..., None]


def _primitives(offset: int, width: int, calls: Dict[str, int]):
    def log_softmax_fn(x):
        calls["log_softmax_fn"] += 1
        return _VocabParallelLogSoftmax.apply(x)

    def kl_div_fn(input_log, target_log):
        calls["kl_div_fn"] += 1
        p = target_log.exp()
        return _ReduceSum.apply(torch.where(p > 0, p * (target_log - input_log), torch.zeros_like(p)).sum(-1))

    def gather_fn(logits, indices):
        calls["gather_fn"] += 1
        mine = (indices >= offset) & (indices < offset + width)
        local = torch.gather(logits, -1, torch.where(mine, indices - offset, 0))
        return _ReduceSum.apply(torch.where(mine, local, torch.zeros_like(local)))

    return {"gather_fn": gather_fn, "log_softmax_fn": log_softmax_fn, "kl_div_fn": kl_div_fn}


def _sharded_cases() -> List[Tuple[str, Any]]:
    return [(name, c) for name, c in CASES if c.check == "sharded"]


def _rank_main(rank: int, world: int, port: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for _, case in _sharded_cases():
        width = case.student.shape[-1] // world
        sl = slice(rank * width, (rank + 1) * width)
        topk = case.teacher.topk_indices is not None
        s = case.student[..., sl].detach().clone().requires_grad_(True)
        fields = {f: getattr(case.teacher, f) for f in _evaluate.TEACHER_FIELDS}
        if not topk:
            fields["full_logits"] = fields["full_logits"][..., sl].clone()
        calls = {"gather_fn": 0, "log_softmax_fn": 0, "kl_div_fn": 0}
        try:
            total, num_valid = target.gkd_loss(
                s,
                target.TeacherOutput(**fields),
                case.labels.clone(),
                case.beta,
                case.temperature,
                **_primitives(rank * width, width, calls),
            )
            n = int(num_valid)
            if total.requires_grad:
                (total / max(n, 1)).backward()
            grad = s.grad if s.grad is not None else torch.zeros_like(s)
            results.append({"total": total.detach(), "n": n, "grad": grad, "calls": calls, "error": ""})
        except Exception as e:  # noqa: BLE001 - reported as the case's failure
            results.append({"error": f"{type(e).__name__}: {e}"[:200], "calls": calls})
            break  # the other rank may now wait in a collective: stop both
    torch.save(results, f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _judge_ranks(case, outs) -> str:
    """Why the ranks' results fail the case ('' when they pass): the certificate's tolerances on rank 0's total
    and the ranks' gradients side by side, against the full-vocabulary FP64 reference."""
    if any(o.get("error") for o in outs):
        return next(o["error"] for o in outs if o.get("error"))
    needed = ("gather_fn",) if case.teacher.topk_indices is not None else ("log_softmax_fn", "kl_div_fn")
    unused = [p for p in needed if any(o["calls"][p] == 0 for o in outs)]
    if unused:
        return f"ignores the injected {', '.join(unused)} (0 calls)"
    ref = _evaluate.reference_of(case)
    if outs[0]["n"] != ref[1]:
        return f"num_valid {outs[0]['n']}, expected {ref[1]}"
    value = float(outs[0]["total"].double())
    if not math.isfinite(value):
        return f"non-finite total {value}"
    ratios = _evaluate._ratios(value, torch.cat([o["grad"] for o in outs], -1), case, ref)
    return "" if max(ratios) <= 1 else f"value {ratios[0]:.3g}x tol, gradient {ratios[1]:.3g}x tol"


def test_injected_primitives_on_2_gloo_ranks():
    """The certificate's vocab-parallel cases on 2 real processes with a gloo group: student (and full-vocabulary
    teacher) logits split over the ranks, the injected primitives all-reduce over the vocabulary."""
    missing = _gloo_missing()
    if missing:
        (pytest.fail if REQUIRE_ALL else pytest.skip)(f"not run: {missing} (GKD_EXPORT_REQUIRE_ALL=1 fails here)")
    import torch.multiprocessing as mp

    cases = _sharded_cases()
    if not cases:
        pytest.skip("no vocab-parallel case among the exported families")
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out.pt")
        mp.spawn(_rank_main, args=(2, _free_port(), out_path), nprocs=2, join=True)
        outs = [torch.load(f"{out_path}.{r}", weights_only=False) for r in range(2)]
    failures = []
    for i, (name, case) in enumerate(cases):
        got = [o[i] if i < len(o) else {"error": "not run (an earlier case failed)", "calls": {}} for o in outs]
        why = _judge_ranks(case, got)
        if why:
            failures.append(f"{name}: {case.id}: {why}")
        if any(g.get("error") for g in got):
            break
    assert not failures, f"{len(failures)} of {len(cases)} cases fail on 2 gloo ranks: {failures[:5]}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
