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
    return out


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_harness_imports_no_upper_layer():
    bad = [f"{p.relative_to(REPO)}: {m}" for p in _sources("harness") for m in sorted(_imports(p))
           if m.split(".")[0] in ("launch", "analysis", "bench")]
    assert not bad, "\n".join(bad)


def test_no_dotted_string_config_reads():
    pattern = re.compile(r"""\bget\(\s*cfg\s*,\s*["']|\b_select\(\s*cfg|OmegaConf\.select\(""")
    bad = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
           for p in _sources("harness", "launch", "analysis", "bench")
           for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, "\n".join(bad)


def test_no_module_pair_imports_each_other():
    modules = {_module(p): _imports(p) for p in _sources("harness", "launch", "analysis", "bench")}
    cycles = sorted({tuple(sorted((a, b))) for a, deps in modules.items() for b in deps
                     if b in modules and b != a and a in modules[b]})
    assert not cycles, cycles


def test_validation_imports_neither_torch_nor_swift():
    code = ("import sys\n"
            "from harness.compose import point_config\n"
            "from harness.validate import validate_config\n"
            "from harness.config import ConfigError\n"
            "cfg, _ = point_config(['gkd.beta=0.5', 'run.output_dir=/tmp/x'])\n"
            "validate_config(cfg)\n"
            "bad = [m for m in ('torch', 'swift', 'transformers') if m in sys.modules]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
