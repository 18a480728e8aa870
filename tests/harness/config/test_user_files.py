"""Bounded reads of a user's files (issue 48, item 6): ``gkd_harness.harness.config.user_files`` and its uses.

Before: ``gkd-analyze --criteria FIFO`` blocked forever; a YAML alias bomb ran at full CPU for 13 minutes;
``--criteria /etc/passwd`` echoed the file's content in its error; a 1 GB line appended to ``metrics.jsonl`` as a
step past the plan was read whole (3.2 GB) and the run still passed. The criteria cases run in a child process
with a time bound, so that the old code's hang fails the test instead of hanging the suite.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from gkd_harness.harness.config.user_files import (
    UserFileError,
    bounded_lines,
    check_yaml,
    load_yaml,
    open_regular,
    read_text,
)

BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
LOAD = "from gkd_harness.analysis.signoff.criteria_file import load_criteria\nimport sys\n"
LOAD += "try:\n    load_criteria(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"


def _criteria(path) -> str:
    p = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "criteria.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UserFileError, match="is a FIFO, not a regular file"):
        open_regular(fifo)
    assert _criteria(fifo) == f"UnusableInput criteria file {fifo}: is a FIFO, not a regular file"


def test_an_alias_bomb_is_refused_from_the_parser_events(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    with pytest.raises(UserFileError, match=r"aliases \(\*name\) are not allowed \(line 2\)"):
        check_yaml(BOMB, bomb)
    assert "aliases" in _criteria(bomb)


def test_an_error_names_the_file_not_its_content(tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    line = _criteria(secret)
    assert str(secret) in line and "root:x" not in line and "daemon" not in line, line
    bad = tmp_path / "bad.yaml"
    bad.write_text("ok: 1\nsecret-token-value: [unclosed\n")
    with pytest.raises(UserFileError) as e:
        load_yaml(bad)
    assert "not valid YAML (line" in str(e.value) and "secret-token" not in str(e.value)


def test_size_and_kind_limits(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" * 1000)
    with pytest.raises(UserFileError, match="5,000 bytes, more than the 100 allowed"):
        read_text(big, limit=100)
    with pytest.raises(UserFileError, match="is a character device"):
        read_text("/dev/zero")
    with pytest.raises(UserFileError, match="is a folder"):
        read_text(tmp_path)
    (tmp_path / "latin1.yaml").write_bytes(b"a: caf\xe9\n")
    with pytest.raises(UserFileError, match=r"not UTF-8 text \(byte offset 6\)"):
        read_text(tmp_path / "latin1.yaml")


def test_bounded_lines_skip_a_long_line_and_go_on():
    data = b"one\n" + b"x" * 5000 + b"\n" + b"three\n" + b"y" * 40
    lines = list(bounded_lines(io.BytesIO(data), max_line=100))
    assert lines == [(1, b"one\n"), (2, None), (3, b"three\n"), (4, b"y" * 40)]
    assert list(bounded_lines(io.BytesIO(b"abc\n"), max_line=4)) == [(1, b"abc\n")]
    assert list(bounded_lines(io.BytesIO(b"abcd\n"), max_line=4)) == [(1, None)]


def test_a_long_metrics_line_makes_the_file_unusable_unread(tmp_path):
    """A line past the bound (here 16 MiB + 1) is named, not parsed: a step past the plan never passes."""
    from gkd_harness.analysis.sweep.metrics import read_metrics_file
    from gkd_harness.harness.config.user_files import MAX_LINE

    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:
        f.write(json.dumps({"step": 1, "train/loss": 0.5}) + "\n")
        f.write(json.dumps({"step": 2, "junk": "a" * (MAX_LINE + 1)}) + "\n")
    table = read_metrics_file(path, completed=True)
    assert table.unusable == f"{path}:2: a line of more than {MAX_LINE:,} bytes (not read)"


def test_the_resume_reader_skips_a_long_line(tmp_path):
    from gkd_harness.harness.config.user_files import MAX_LINE
    from gkd_harness.harness.store.metrics_io import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' + '{"step": 2, "x": "' + "a" * MAX_LINE + '"}\n{"step": 3}\n')
    assert read_metrics(path) == [{"step": 1}, {"step": 3}]
