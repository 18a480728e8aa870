"""Console and Markdown safety of a user's text (issue 48, items 4 and 5): ``gkd_harness.harness.config.text``.

Before, terminal escapes in a dataset path reached the console raw (a test retitled its terminal), and report.md
kept raw ``<``, ``|``, ``<!--`` and a right-to-left override in link targets (a row of 10 cells under an 8-cell
header), and a ``javascript:`` link survived. The functions are checked against independently written
expectations; the console path end to end through ``gkd-train``'s dry run.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from gkd_harness.harness.config.text import console_safe, link_target, markdown_cell, markdown_link

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize(
    "text,shown",
    [
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("a\u202egnp.exe", "a\\u202egnp.exe"),
        ("\u2066x\u2069", "\\u2066x\\u2069"),
        ("\x9b2J", "\\x9b2J"),
        ("a\tb\nc\rd", "a\\x09b\\x0ac\\x0dd"),
        ("plain /path/ok-é", "plain /path/ok-é"),
    ],
)
def test_console_safe_shows_every_control_as_its_escape(text, shown):
    assert console_safe(text) == shown


def test_console_safe_keeps_lines_when_asked_and_clips():
    assert console_safe("a\n\tb\r\x1b", multiline=True) == "a\n\tb\\x0d\\x1b"
    assert console_safe("x" * 5000, limit=10) == "x" * 10 + "... (4,990 more characters)"


def test_markdown_cell_stays_one_cell_and_renders_nothing():
    cell = markdown_cell("a|b<!--c<script>`d`[e](f)\n*g*\u202eh\x1b")
    assert "|" not in cell.replace("\\|", "")
    assert "<" not in cell.replace("\\<", "") and "\n" not in cell and not RAW.search(cell)
    row = "| " + " | ".join(markdown_cell(x) for x in ("x|y", "<!--", "z")) + " |"
    assert len(re.split(r"(?<!\\)\|", row)) - 2 == 3  # three cells, as many as given


@pytest.mark.parametrize("target", ["javascript:alert(1)", "JavaScript:x", "data:text/html,<b>", " vbscript:x"])
def test_a_dangerous_link_becomes_plain_text(target):
    assert link_target(target) is None
    assert "](" not in markdown_link("run", target)


def test_a_link_target_is_encoded_where_markdown_would_end_it():
    href = link_target("runs/a b)(<x>|\u202e\"'.html")
    assert href == "runs/a%20b%29%28%3Cx%3E%7C%E2%80%AE%22%27.html"
    assert markdown_link("r|1", "https://wandb.ai/x/y") == "[r\\|1](https://wandb.ai/x/y)"


def test_the_dry_run_never_shows_a_terminal_escape(tmp_path, monkeypatch):
    """A dataset path with a terminal escape, and a run name with a bidi override, through the console."""
    from gkd_harness.harness.launcher.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    data = tmp_path / "d\x1b]0;pwned\x07.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n')
    for args in ([f"run.dataset={data}"], [f"run.dataset={tmp_path}/missing\x1b[2J.jsonl"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            main(["run.dry_run=true", *args])
        assert out.getvalue() + err.getvalue(), "nothing printed"
        assert not RAW.search(out.getvalue() + err.getvalue()), (out.getvalue() + err.getvalue())[-400:]
