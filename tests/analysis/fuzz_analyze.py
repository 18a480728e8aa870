"""A seeded fuzz of ``gkd-analyze``'s flags and of malformed run folders (issue 48, item 1), in one process.

:func:`flag_cases` draws argument lists from the real flags with hostile values (missing paths, a device, a FIFO,
a file for a folder, a 5,000-character path, terminal escapes, unknown flags and sources); :func:`folder_cases`
builds sweep folders whose run files are missing, empty, torn, binary, of the wrong JSON type, a FIFO, a folder,
a link to ``/dev/zero``, or hold a 20 MB line. :func:`outcome` runs ``gkd_harness.analysis.cli.main`` and
classifies: ``clean`` (exit 0, 1 or 2, no traceback, at most a few lines on stderr, none of them "internal
error", no raw control character on the console) or ``other`` with the reason.

By hand, for the counts: ``python -m tests.analysis.fuzz_analyze [N] [SEED]`` (prints JSON).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import List, Tuple

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FLAGS = ("--report", "--criteria", "--source", "--group", "--verify", "--junit", "--summary")
SWITCHES = ("--wandb", "--allow-mixed", "--verbose", "--bogus", "-x")
FILES = ("summary.json", "config.yaml", "metrics.jsonl", "command.json", "sweep_manifest.json")
DAMAGE = ("missing", "empty", "torn", "binary", "list", "string", "nan", "fifo", "folder", "devzero", "long", "deep")


def _paths(root: Path) -> List[str]:
    fifo = root / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    (root / "afile").write_text("x")
    return [
        str(root / "missing"),
        "/dev/zero",
        str(fifo),
        str(root / "afile"),
        str(root / ("a" * 5000)),
        str(root / "esc\x1b]0;pwned\x07"),
        str(root / "rtl\u202etxt"),
        "",
        "/",
        str(root / "sweep"),
    ]


def flag_cases(root: Path, n: int, seed: int) -> List[List[str]]:
    rng = random.Random(seed)
    paths = _paths(root)
    values = [*paths, "local", "wandb", "wandb-offline", "nope", "-1", "\x1b[2J"]
    cases = []
    for _ in range(n):
        argv = [rng.choice(paths)] if rng.random() < 0.8 else []
        for _ in range(rng.randint(0, 4)):
            if rng.random() < 0.75:
                flag = rng.choice(FLAGS)
                argv += [flag, rng.choice(values)] if rng.random() < 0.9 else [flag]
            else:
                argv.append(rng.choice(SWITCHES))
        if "--report" not in argv and rng.random() < 0.7:
            argv += ["--report", str(root / f"report{len(cases)}")]
        cases.append(argv)
    return cases


def _damage(path: Path, how: str, rng: random.Random) -> None:
    if how == "missing":
        return
    if how == "empty":
        path.write_bytes(b"")
    elif how == "torn":
        path.write_text('{"status": "compl')
    elif how == "binary":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(300)))
    elif how == "list":
        path.write_text("[1, 2, 3]\n")
    elif how == "string":
        path.write_text('"root:x:0:0:root:/root:/bin/bash"\n')
    elif how == "nan":
        path.write_text('{"status": NaN, "step": Infinity, "config": null}\n')
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
    elif how == "devzero":
        path.symlink_to("/dev/zero")
    elif how == "long":
        path.write_text('{"step": 1, "x": "' + "a" * 20_000_000 + '"}\n')
    elif how == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)


def folder_cases(root: Path, n: int, seed: int) -> List[Tuple[str, List[str]]]:
    """``n`` sweep folders of one or two damaged run folders: (description, argv)."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        sweep = root / f"sweep{i}"
        sweep.mkdir()
        what = []
        for r in range(rng.randint(1, 2)):
            run = sweep / f"loss=fp32,seed={r}"
            run.mkdir()
            for name in FILES if r == 0 else FILES[:3]:
                how = rng.choice(DAMAGE)
                target = (sweep if name == "sweep_manifest.json" else run) / name
                if target.exists() or target.is_symlink():
                    continue
                _damage(target, how, rng)
                what.append(f"{name}:{how}")
        cases.append((",".join(what), [str(sweep), "--report", str(root / f"freport{i}")]))
    return cases


def outcome(argv: List[str]) -> Tuple[str, str]:
    from gkd_harness.analysis.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except BaseException as e:  # noqa: BLE001 - what the fuzz looks for
        return "other", f"{type(e).__name__}: {str(e)[:200]}"
    text = out.getvalue() + err.getvalue()
    if code not in (0, 1, 2):
        return "other", f"exit {code!r}"
    if RAW.search(text):
        return "other", "a raw control character on the console"
    if "Traceback" in text or "internal error" in err.getvalue():
        return "other", err.getvalue()[-300:]
    lines = err.getvalue().strip().splitlines()
    if code == 2 and lines and lines[-1].startswith("gkd-analyze: error: ") and lines[0].startswith("usage:"):
        return "clean", "argparse's usage and its one error line"
    if len(lines) > 3:
        return "other", f"{len(err.getvalue().splitlines())} lines on stderr: {err.getvalue()[-300:]!r}"
    if any(len(line) > 2000 for line in text.splitlines()):
        return "other", "a line over 2,000 characters"
    return "clean", f"exit {code}"


def run(root: Path, n_flags: int = 60, n_folders: int = 40, seed: int = 48) -> dict:
    (root / "sweep").mkdir(exist_ok=True)
    flags = [(" ".join(a), a) for a in flag_cases(root, n_flags, seed)]
    folders = folder_cases(root, n_folders, seed)
    result: dict = {"flags": {"clean": 0, "other": []}, "folders": {"clean": 0, "other": []}}
    for kind, cases in (("flags", flags), ("folders", folders)):
        for what, argv in cases:
            verdict, why = outcome(argv)
            if verdict == "clean":
                result[kind]["clean"] += 1
            else:
                result[kind]["other"].append(f"{what[:160]!r}: {why}")
    return result


if __name__ == "__main__":  # pragma: no cover - also the suite's child process
    import tempfile

    n_flags = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    n_folders = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    print(json.dumps(run(Path(tempfile.mkdtemp(prefix="gkd-afuzz-")), n_flags, n_folders, seed)))
