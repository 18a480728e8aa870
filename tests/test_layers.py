"""The dependency rule and the one typed config, checked on the source tree.

- ``harness/`` imports none of ``launch/``, ``analysis/``, ``bench/``, not even inside a function;
- no dotted-string config reads remain outside the schema module (``get(cfg, "...")``, ``_select(cfg, ...)``,
  ``OmegaConf.select``);
- validation imports neither torch nor ms-swift.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sources(*packages: str):
    for pkg in packages:
        yield from sorted((REPO / pkg).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (inside functions too), read from its syntax tree."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m.removeprefix("gkd_harness.") for m in out}  # the installed namespace; layers are the folders


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_harness_imports_no_upper_layer():
    bad = [
        f"{p.relative_to(REPO)}: {m}"
        for p in _sources("harness")
        for m in sorted(_imports(p))
        if m.split(".")[0] in ("launch", "analysis", "bench")
    ]
    assert not bad, "\n".join(bad)


def test_no_dotted_string_config_reads():
    pattern = re.compile(r"""\bget\(\s*cfg\s*,\s*["']|\b_select\(\s*cfg|OmegaConf\.select\(""")
    bad = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in _sources("harness", "launch", "analysis", "bench")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not bad, "\n".join(bad)


def test_no_module_pair_imports_each_other():
    modules = {_module(p): _imports(p) for p in _sources("harness", "launch", "analysis", "bench")}
    cycles = sorted(
        {
            tuple(sorted((a, b)))
            for a, deps in modules.items()
            for b in deps
            if b in modules and b != a and a in modules[b]
        }
    )
    assert not cycles, cycles


def test_validation_imports_neither_torch_nor_swift():
    code = (
        "import sys\n"
        "from gkd_harness.harness.launcher.compose import point_config\n"
        "from gkd_harness.harness.config.validate import validate_config\n"
        "from gkd_harness.harness.config.schema import ConfigError\n"
        "cfg, _ = point_config(['gkd.beta=0.5', 'run.output_dir=/tmp/x'])\n"
        "validate_config(cfg)\n"
        "bad = [m for m in ('torch', 'swift', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# The layout: two processes, and the layers below them
# ---------------------------------------------------------------------------------------------------------------
#: What each harness subpackage may import from the harness (besides itself and the contract module).
ALLOWED = {
    "config": set(),
    "store": {"config"},
    "loss": {"config"},
    "fixtures": set(),
    "launcher": {"config", "store", "fixtures", "loss"},
    "rank": {"config", "store", "loss", "fixtures"},
}


def _harness_layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "harness" or len(parts) < 2:
        return None
    return "losses" if parts[1] == "losses" else parts[1]


def layer_violations(root: Path = REPO) -> list[str]:
    """``file: imported module`` for every import that breaks :data:`ALLOWED` (``gkd_harness.harness.losses`` counts as loss)."""
    bad = []
    for p in sorted((root / "harness").rglob("*.py")):
        parts = p.relative_to(root).parts
        own = parts[1] if len(parts) > 2 else None
        if own is None:  # harness/__init__.py, harness/contract.py, harness/losses.py
            allowed = {"loss"} if parts[1] == "losses.py" else set()
        else:
            allowed = ALLOWED[own] | {own}
        for m in sorted(_imports(p)):
            layer = _harness_layer(m)
            if layer is None or layer == "contract":
                continue
            layer = "loss" if layer == "losses" else layer
            if layer not in allowed and m.split(".")[1] in set(ALLOWED) | {"losses"}:
                bad.append(f"{p.relative_to(root)}: {m}")
    return bad


def test_harness_has_only_the_contract_and_the_loss_facade_at_top_level():
    top = sorted(p.name for p in (REPO / "harness").glob("*.py"))
    assert top == ["__init__.py", "contract.py", "losses.py"], top
    packages = sorted(p.name for p in (REPO / "harness").iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(ALLOWED), packages


def test_layers_launcher_and_rank_never_import_each_other_and_lower_layers_import_neither():
    assert not layer_violations(), "\n".join(layer_violations())


def test_the_layer_check_fails_when_a_rank_module_imports_a_launcher_module(tmp_path):
    import shutil

    shutil.copytree(REPO / "harness", tmp_path / "harness")
    bad = tmp_path / "harness" / "rank" / "plugin.py"
    bad.write_text(bad.read_text() + "\n\ndef _late():\n    from gkd_harness.harness.launcher.plan import build_plan\n")
    assert layer_violations(tmp_path) == [
        "harness/rank/plugin.py: harness.launcher.plan",
        "harness/rank/plugin.py: harness.launcher.plan.build_plan",
    ]


def test_the_contract_module_imports_nothing_of_the_harness_and_no_torch():
    mods = _imports(REPO / "harness" / "contract.py")
    assert not [m for m in mods if m.split(".")[0] in ("harness", "torch", "swift")], mods


def _string_literals(path: Path):
    """(line, value) of every string constant that is not a docstring."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    fragments = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | fragments:
            yield node.lineno, node.value


# ---------------------------------------------------------------------------------------------------------------
# One home for every contract fact (docs/architecture.md, "What crosses between them")
# ---------------------------------------------------------------------------------------------------------------
#: The names of the loss variants (precisions and beta forms). Outside the contract they may not be spelled where
#: they name a variant: compared against, a default argument, a dict key or an index (messages and docstrings may).
#: "candidate" also names the certificate's JSON section, so only a comparison or a default counts for it.
VARIANT_NAMES = ("native", "fp32", "fp64", "candidate", "paper", "continuous")
_KEY_VARIANT_NAMES = ("native", "fp32", "fp64", "paper", "continuous")
#: Files not converted yet (issue 39), with how many variant names each still spells: a file may not spell more.
VARIANT_LITERALS_LEFT: dict = {
    "analysis/certify/cases.py": 3,
    "analysis/certify/certificate.py": 1,
    "analysis/certify/search.py": 2,  # in certify "fp32"/"fp64" also name dtypes (bf16, fp16, fp32, fp64)
    "bench/cases.py": 15,
    "bench/scaling.py": 3,
    "harness/loss/stable.py": 1,
    "launch/gpu_bare.py": 2,
}


def _sources_under(root: Path, *packages: str):
    for pkg in packages:
        yield from sorted((root / pkg).rglob("*.py"))


def _contract_constants() -> dict:
    from gkd_harness.harness import contract

    return {k: v for k, v in vars(contract).items() if k.isupper() and not k.startswith("_")}


def _defined_names(tree: ast.Module) -> list:
    """(line, name) of every module-level definition: assignments, functions, classes (imports are not)."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.lineno, node.name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [(node.lineno, n.id) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return out


def _contract_names() -> set:
    """Every name the contract defines: constants, the Literal types, ``role_of``, ``PluginSettings`` ..."""
    return {name for _, name in _defined_names(ast.parse((REPO / "harness" / "contract.py").read_text()))}


def _strict_facts(constants: dict) -> set:
    """Contract strings that may appear nowhere else as a literal: metric names (a "/"), file names, variables,
    the callback and plugin module, and the unambiguous folder names."""
    dirs_everywhere = {"HYDRA_DIR", "ARCHIVE_DIR"}  # ".hydra", "previous_attempts": no other meaning
    return {
        v
        for k, v in constants.items()
        if isinstance(v, str)
        and ("/" in v or k.endswith(("_FILE", "_ENV", "_LOG", "_MODULE")) or k in {"CALLBACK_NAME"} | dirs_everywhere)
    }


def _path_facts(constants: dict) -> set:
    """Run-folder sub-folder names ("swift", "wandb", "captures", "candidate"): words with other meanings (the
    ``swift`` command, ``--report_to wandb``), so they are facts only as a path component: a ``/`` operand or an
    argument of ``os.path.join`` / ``joinpath``."""
    return {v for k, v in constants.items() if k.endswith("_DIR") and isinstance(v, str)}


def _tuple_facts(constants: dict) -> dict:
    """``frozenset of values -> name`` of every tuple of strings in the contract (PRECISIONS, BETA_FORMS, ...)."""
    return {
        frozenset(v): k
        for k, v in constants.items()
        if isinstance(v, tuple) and len(v) > 1 and all(isinstance(x, str) for x in v)
    }


def _variant_literals(tree: ast.AST) -> list:
    """(line, value) of each variant name spelled where it names a variant (see :data:`VARIANT_NAMES`)."""

    def names(n, allowed):
        if isinstance(n, ast.Constant) and n.value in allowed:
            yield n
        elif isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            for e in n.elts:
                yield from names(e, allowed)

    out = []
    for node in ast.walk(tree):
        allowed = VARIANT_NAMES
        if isinstance(node, ast.Compare):
            spots = [node.left, *node.comparators]
        elif isinstance(node, ast.arguments):
            spots = [d for d in [*node.defaults, *node.kw_defaults] if d is not None]
        elif isinstance(node, ast.Dict):
            spots, allowed = [k for k in node.keys if k is not None], _KEY_VARIANT_NAMES
        elif isinstance(node, ast.Subscript):
            spots, allowed = [node.slice], _KEY_VARIANT_NAMES
        else:
            continue
        out += [(c.lineno, c.value) for s in spots for c in names(s, allowed)]
    return out


def _path_literals(tree: ast.AST, facts: set) -> list:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            spots = [node.left, node.right]
        elif isinstance(node, ast.Call) and (
            isinstance(node.func, ast.Attribute) and node.func.attr in ("join", "joinpath")
        ):
            spots = list(node.args)
        else:
            continue
        out += [(s.lineno, s.value) for s in spots if isinstance(s, ast.Constant) and s.value in facts]
    return out


def one_home_violations(root: Path = REPO) -> list:
    """``file:line: what`` for every contract fact with a second home under ``root``'s harness/, launch/,
    analysis/ and bench/ (tests and docs may spell them):

    - a string constant of the contract spelled as a literal (:func:`_strict_facts`), or a run-folder folder name
      as a path component (:func:`_path_facts`);
    - a module-level definition of a name the contract defines (``PRECISIONS = ...``, ``class PluginSettings``,
      ``Precision = Literal[...]``), or a tuple/list/set literal holding exactly
      the values of a contract tuple (``("fail", "not_measured")``);
    - a variant name where it names a variant, beyond :data:`VARIANT_LITERALS_LEFT`'s count for that file.
    """
    constants, defined = _contract_constants(), _contract_names()
    strict, paths, tuples = _strict_facts(constants), _path_facts(constants), _tuple_facts(constants)
    bad = []
    for p in _sources_under(root, "harness", "launch", "analysis", "bench"):
        rel = p.relative_to(root).as_posix()
        if rel == "harness/contract.py":
            continue
        tree = ast.parse(p.read_text())
        bad += [f"{rel}:{line}: {value!r}" for line, value in _string_literals(p) if value in strict]
        bad += [f"{rel}:{line}: {value!r} as a path" for line, value in _path_literals(tree, paths)]
        bad += [
            f"{rel}:{line}: defines the contract's {name}" for line, name in _defined_names(tree) if name in defined
        ]
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
                values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(values) == len(node.elts) and frozenset(values) in tuples:
                    bad.append(f"{rel}:{node.lineno}: a copy of the contract's {tuples[frozenset(values)]}")
        variants = _variant_literals(tree)
        if len(variants) > VARIANT_LITERALS_LEFT.get(rel, 0):
            bad += [f"{rel}:{line}: variant name {value!r}" for line, value in variants]
    return bad


def test_contract_facts_have_one_home():
    """No contract constant, copy of a contract tuple, run-folder folder name as a path, or variant name in a
    comparison outside ``harness/contract.py`` (tests and docs may spell them)."""
    constants = _contract_constants()
    assert {"gkd/neg_loss_calls", "metrics.jsonl", "GKD_HARNESS_PLUGIN_SETTINGS", ".hydra"} <= _strict_facts(constants)
    assert {"captures", "wandb", "swift", "candidate"} <= _path_facts(constants)
    assert {"PRECISIONS", "BETA_FORMS", "DTYPE_NAMES", "FAILING_STATUSES"} <= set(_tuple_facts(constants).values())
    bad = one_home_violations()
    assert not bad, "\n".join(bad)


def test_the_one_home_check_fails_on_a_copy(tmp_path):
    import shutil

    for pkg in ("harness", "launch", "analysis", "bench"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    schema = tmp_path / "harness" / "config" / "schema.py"
    schema.write_text(schema.read_text() + '\nPRECISIONS = ("native", "fp32", "fp64", "candidate")\n')
    lock = tmp_path / "harness" / "store" / "lock.py"
    lock.write_text(
        lock.read_text() + "\n\ndef _late(run, precision):\n"
        '    failing = ("fail", "not_measured")\n'
        '    return run / "captures" if precision == "fp32" else failing\n'
    )
    evidence = tmp_path / "analysis" / "sweep" / "evidence.py"
    evidence.write_text(evidence.read_text() + "\n\ndef role_of(precision):\n    return precision\n")
    bad = one_home_violations(tmp_path)
    n = len(evidence.read_text().splitlines())
    assert f"analysis/sweep/evidence.py:{n - 1}: defines the contract's role_of" in bad
    n = len(schema.read_text().splitlines())
    assert f"harness/config/schema.py:{n}: defines the contract's PRECISIONS" in bad
    assert f"harness/config/schema.py:{n}: a copy of the contract's PRECISIONS" in bad
    n = len(lock.read_text().splitlines())
    assert f"harness/store/lock.py:{n - 1}: a copy of the contract's FAILING_STATUSES" in bad
    assert f"harness/store/lock.py:{n}: 'captures' as a path" in bad
    assert f"harness/store/lock.py:{n}: variant name 'fp32'" in bad
    assert len(bad) == 6, bad


# ---------------------------------------------------------------------------------------------------------------
# The upper layers: launch/ and analysis/ stand on harness/ only; the benchmarks on all three; inside analysis/,
# loading, replay and the certificate stand apart, and the sign-off and the dashboards use them.
# ---------------------------------------------------------------------------------------------------------------
#: The top-level packages each upper package may import (besides harness/ and itself).
UPPER_ALLOWED = {
    "launch": set(),
    "analysis": set(),
    "bench": {"analysis"},
}
#: What each analysis subpackage may import from analysis/ (besides itself). ``top`` is a module directly in
#: analysis/ (cli.py, the notebook facade load.py), which may use them all and which none of them imports.
ANALYSIS_ALLOWED = {
    "sweep": set(),
    "replay": set(),
    "certify": set(),
    "signoff": {"sweep", "replay", "certify"},
    "dashboard": {"sweep", "signoff"},
    "top": {"sweep", "replay", "certify", "signoff", "dashboard"},
}


def _analysis_layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "analysis":
        return None
    if len(parts) == 1:
        return "top"
    return parts[1] if parts[1] in ANALYSIS_ALLOWED else "top"


def upper_layer_violations(root: Path = REPO) -> list[str]:
    """``file: imported module`` for every import that breaks :data:`UPPER_ALLOWED` or :data:`ANALYSIS_ALLOWED`,
    and every import of a command module (``cli.py``: entry points are not libraries)."""
    bad = []
    for pkg, allowed in UPPER_ALLOWED.items():
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root)
            own = _module_of(rel)
            for m in sorted(_imports(p)):
                top = m.split(".")[0]
                if top in UPPER_ALLOWED and top != pkg and top not in allowed:
                    bad.append(f"{rel}: {m}")
                elif m.split(".")[-1] == "cli" and m != own and top in (*UPPER_ALLOWED, "harness"):  # issue 47, item 17
                    bad.append(f"{rel}: {m} (a command module)")
                elif pkg == "analysis" and top == "analysis":
                    mine, theirs = _analysis_layer(own), _analysis_layer(m)
                    if theirs != mine and theirs not in ANALYSIS_ALLOWED[mine]:
                        bad.append(f"{rel}: {m}")
    return bad


def _module_of(rel: Path) -> str:
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_upper_layers_import_only_downwards():
    assert not upper_layer_violations(), "\n".join(upper_layer_violations())


def test_the_upper_layer_check_fails_on_an_upward_import(tmp_path):
    import shutil

    for pkg in UPPER_ALLOWED:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    loader = tmp_path / "analysis" / "sweep" / "runs.py"
    loader.write_text(
        loader.read_text() + "\n\ndef _late():\n    from gkd_harness.launch.sweep import write_manifest\n"
        "    from gkd_harness.analysis.signoff.criteria import evaluate\n"
    )
    bad = upper_layer_violations(tmp_path)
    assert "analysis/sweep/runs.py: launch.sweep" in bad
    assert "analysis/sweep/runs.py: analysis.signoff.criteria" in bad
