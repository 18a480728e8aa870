"""The argv contract: ms-swift's own argument classes accept every argv the harness builds.

For every experiment preset (``configs/experiment/*.yaml``, every point of a sweep preset) and the default config,
composed for real with ``run.dataset=x/y`` where the preset needs a dataset, the launch plan of node 0 of a 1-node
and of a 2-node SLURM job (``gkd_harness.launch.slurm.node_plan``: ``gkd_harness.harness.launcher.run.make_plan`` under the node's SLURM
variables, ``SLURM_GPUS_ON_NODE=8``) is parsed by the class ms-swift's CLI parses it with:

- ``swift rlhf`` -> ``swift.pipelines.train.rlhf.SwiftRLHF.args_class`` (``RLHFArguments``);
- ``megatron rlhf`` -> ``swift.megatron.pipelines.train.rlhf.MegatronRLHF.args_class`` (``MegatronRLHFArguments``).

The parser is ms-swift's own (``HfArgumentParser`` built under ``swift.utils.utils._patch_get_type_hints``, as
``swift.utils.parse_args`` builds it). Parsing stops at argparse (``parse_known_args``) instead of
``parse_args_into_dataclasses``: constructing the dataclass runs ``__post_init__``, which loads model configs,
initialises process groups and creates output folders. What argparse checks is the contract: no flag unknown
(nothing left over, abbreviations off, where ms-swift would raise ``remaining_argv``) and every value in its
domain (``Literal`` choices, bool / int / float conversion).

Import-only stand-in (this test only): ``swift.megatron`` imports mcore-bridge, which imports Transformer Engine
and Triton at module level; neither exists for a CPU-only torch. The Megatron argv is therefore parsed in a
subprocess in which empty placeholder modules stand in for ``transformer_engine`` and ``triton`` (and for
megatron-core's ``TEGroupedLinear`` / ``TELinear``, None without TE) so that the argument classes can be imported.
Nothing from those modules runs while parsing. Where Transformer Engine is installed, no stand-in is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gkd_harness.harness.launcher.compose import compose, point_config
from gkd_harness.harness.launcher.sweep_points import point_name, sweep_points
from gkd_harness.launch.slurm import node_plan

REPO = Path(__file__).resolve().parents[3]
EXPERIMENTS = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))
NEEDS_DATASET = ("seed", "seed_hf", "precision_ab")
#: presets with the held-out evaluation on and a dataset of their own: they need the held-out split too
NEEDS_EVAL_DATASET = ("precision_ab",)
GPUS_PER_NODE = 8
#: argvs that must be refused: proof that the check bites (an unknown flag, a value outside a Literal's choices,
#: a bool that is not one, an abbreviation of a real flag)
NEGATIVE = {
    "unknown flag": ["x", "rlhf", "--rlhf_type", "gkd", "--no_such_flag", "1"],
    "out of choices": ["x", "rlhf", "--rlhf_type", "gkdx"],
    "not a bool": ["x", "rlhf", "--rlhf_type", "gkd", "--use_vllm", "maybe"],
    "abbreviation": ["x", "rlhf", "--rlhf_type", "gkd", "--gkd_logits_to", "64"],
}


def preset_overrides(experiment: str | None) -> list[str]:
    if experiment is None:
        return []
    return [
        f"experiment={experiment}",
        *(["run.dataset=x/y"] if experiment in NEEDS_DATASET else []),
        *(["monitor.eval.dataset=x/z"] if experiment in NEEDS_EVAL_DATASET else []),
    ]


def contract_argvs(tmp: Path) -> dict[str, list[str]]:
    """{label: ms-swift argv} of node 0 on 1 and 2 nodes for every preset point (and node 1 of 2)."""
    out = {}
    for experiment in [None, *EXPERIMENTS]:
        base = preset_overrides(experiment)
        master = compose(base)
        jobs = sweep_points(master) or [base]
        for job in jobs:
            name = point_name(job, master) or "(no overrides)"
            cfg, run_dir = point_config(job, run_dir=tmp / "runs" / (experiment or "default") / name)
            for nodes, node in ((1, 0), (2, 0), (2, 1)):
                plan = node_plan(cfg, run_dir, node, nodes, GPUS_PER_NODE)
                out[f"{experiment or 'default'} [{name}] node {node} of {nodes}"] = plan.argv
    return out


def parse_errors(args_class: type, argvs: dict[str, list[str]]) -> dict[str, str]:
    """{label: why ms-swift's parser refuses it} for the argvs it refuses (``argv[2:]``: after ``swift rlhf``)."""
    import argparse
    import contextlib
    import io

    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser

    with _patch_get_type_hints():
        parser = HfArgumentParser([args_class])
    parser.allow_abbrev = False  # a flag must be a field's own name
    parser.exit_on_error = False
    errors = {}
    for label, argv in argvs.items():
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                _, rest = parser.parse_known_args(list(argv[2:]))
        except argparse.ArgumentError as e:
            errors[label] = str(e)
            continue
        except SystemExit:
            errors[label] = stderr.getvalue().strip().splitlines()[-1]
            continue
        if rest:
            errors[label] = f"unknown arguments {rest}"
    return errors


# ------------------------------------------------------------------------------------ Megatron, in a subprocess
def _install_import_stand_ins() -> None:
    """Placeholder ``transformer_engine`` / ``triton`` modules, import-only (see the module docstring)."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    stubbed = tuple(m for m in ("transformer_engine", "triton") if importlib.util.find_spec(m) is None)
    if not stubbed:
        return
    import megatron.core  # noqa: F401 - before the stand-ins: megatron-core has its own fallbacks without TE
    import megatron.core.extensions.transformer_engine as te_ext

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _placeholder(name)

    def _placeholder(name):
        def call(self, *args, **kwargs):  # decorators (@triton.jit, @triton.autotune(...)) return what they wrap
            return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self

        return _Meta(
            name,
            (),
            {"__init__": lambda self, *a, **k: None, "__call__": call, "__getattr__": lambda self, n: _placeholder(n)},
        )

    class _Module(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = _placeholder(name)
            setattr(self, name, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in stubbed:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            return _Module(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    for name in ("TEGroupedLinear", "TELinear"):
        if getattr(te_ext, name, None) is None:
            setattr(te_ext, name, type(name, (), {}))
    sys.meta_path.insert(0, _Finder())


def megatron_worker() -> None:
    """Subprocess entry: argvs as JSON on stdin -> ``{label: error}`` as JSON on the last stdout line."""
    argvs = json.loads(sys.stdin.read())
    _install_import_stand_ins()
    from swift.megatron.pipelines.train.rlhf import MegatronRLHF

    errors = parse_errors(MegatronRLHF.args_class, argvs)
    print("\n" + json.dumps({"class": MegatronRLHF.args_class.__name__, "errors": errors}))


def megatron_parse_errors(argvs: dict[str, list[str]]) -> tuple[str, dict[str, str]]:
    code = "from tests.harness.launcher.test_argv_contract import megatron_worker; megatron_worker()"
    proc = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(argvs), cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["class"], out["errors"]


# ------------------------------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def argvs(tmp_path_factory):
    return contract_argvs(tmp_path_factory.mktemp("contract"))


def _by_cli(argvs, program):
    return {k: v for k, v in argvs.items() if v[:2] == [program, "rlhf"]}


def test_every_preset_is_covered_on_one_and_two_nodes(argvs):
    assert {k.split(" ")[0] for k in argvs} == {"default", *EXPERIMENTS}
    assert all(v[:2] in (["swift", "rlhf"], ["megatron", "rlhf"]) for v in argvs.values())
    assert _by_cli(argvs, "swift") and _by_cli(argvs, "megatron")
    for label in argvs:
        if label.startswith(("seed ", "precision_ab ")):
            assert argvs[label][0] == "megatron", label


def test_hf_argv_is_accepted_by_rlhf_arguments(argvs):
    from swift.pipelines.train.rlhf import SwiftRLHF

    assert SwiftRLHF.args_class.__name__ == "RLHFArguments"
    hf = _by_cli(argvs, "swift")
    assert parse_errors(SwiftRLHF.args_class, hf) == {}
    assert set(parse_errors(SwiftRLHF.args_class, NEGATIVE)) == set(NEGATIVE)


def test_megatron_argv_is_accepted_by_megatron_rlhf_arguments(argvs):
    megatron = _by_cli(argvs, "megatron")
    negative = {f"negative: {k}": v for k, v in NEGATIVE.items()}
    name, errors = megatron_parse_errors({**megatron, **negative})
    assert name == "MegatronRLHFArguments"
    assert {k: v for k, v in errors.items() if not k.startswith("negative: ")} == {}
    assert set(k for k in errors if k.startswith("negative: ")) == set(negative)
