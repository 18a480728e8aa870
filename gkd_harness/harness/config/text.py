"""Text from a user made safe where it is shown: on a console (:func:`console_safe`) and in Markdown
(:func:`markdown_cell`, :func:`markdown_link`). Torch-free, stdlib only; every path, name, tag and value a user
gave goes through one of these before it is printed or written into report.md.

* A console must never receive a terminal escape (``ESC ]0;title BEL`` retitles the terminal, ``ESC [`` moves the
  cursor or recolours), another C0 / C1 control character, DEL, or a Unicode bidi control (U+202A-U+202E,
  U+2066-U+2069, U+200E/U+200F, U+061C: a right-to-left override shows ``gpj.exe`` as ``exe.jpg``). Each is
  shown as its Python escape (``\\x1b``, ``\\u202e``), so the text stays readable and nothing is lost silently.
* A Markdown table cell must stay one cell: ``|`` and a newline; it renders no raw HTML (``<!--`` hid the rest
  of the report, ``<script>``: ``<``, ``>`` and ``&`` become entities), no code span and no link (backticks,
  ``[``, ``]`` and backslashes escaped); the console's controls are shown escaped too.
* A Markdown link keeps its text as a cell does and its target only when it is a relative path or an
  ``http(s)``/``file`` URL; a ``javascript:``, ``data:`` or other scheme becomes plain text. The target is
  percent-encoded where Markdown or HTML would end it early (space, ``(``, ``)``, ``<``, ``>``, ``|``, quotes)
  and where a control or bidi character hides in it.
"""

from __future__ import annotations

import re
from typing import Any, Optional
from urllib.parse import quote

#: C0 controls (tab and newline treated by the caller), DEL, C1 controls, and Unicode's bidi and direction marks
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_TAB_NEWLINE = re.compile("[\t\n\r]")
#: what ends a cell or starts code or a link in Markdown, escaped with a backslash (raw HTML as entities)
_MARKDOWN = re.compile(r"([\\`|\[\]])")
_SAFE_SCHEMES = ("http://", "https://", "file://")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _escaped(match: re.Match) -> str:
    ch = match.group(0)
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def console_safe(text: Any, limit: Optional[int] = None, multiline: bool = False) -> str:
    """``text`` as it may reach a terminal: terminal escapes, control characters and bidi controls shown as
    their escapes (``\\x1b``, ``\\u202e``); tab, newline and carriage return escaped too unless ``multiline``
    (then tab and newline are kept; a carriage return is always escaped). ``limit``: at most that many characters of the
    original, the rest counted (``... (4,900 more characters)``)."""
    s = "" if text is None else str(text)
    more = 0
    if limit is not None and len(s) > limit:
        s, more = s[:limit], len(s) - limit
    s = _UNSAFE.sub(_escaped, s)  # a carriage return included (\x0d): it would overwrite the line shown
    if not multiline:
        s = _TAB_NEWLINE.sub(_escaped, s)
    return s + (f"... ({more:,} more characters)" if more else "")


def markdown_cell(text: Any) -> str:
    """``text`` as one Markdown table cell (or inline text): stays in its cell and its line, renders no HTML,
    no link, no emphasis, and carries no control or bidi character."""
    s = "" if text is None else str(text)
    s = _UNSAFE.sub(_escaped, s)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MARKDOWN.sub(r"\\\1", s)
    return re.sub(r"[\t\r\n]+", " ", s)


def link_target(target: Any) -> Optional[str]:
    """``target`` percent-encoded for a Markdown link, or None when it must not be a link (a scheme other than
    http, https and file: ``javascript:``, ``data:``, ``vbscript:``)."""
    s = "" if target is None else str(target).strip()
    if not s:
        return None
    if _SCHEME.match(s) and not s.lower().startswith(_SAFE_SCHEMES):
        return None
    return quote(s, safe="/:#?=&%.,_~+-@!$*;")


def markdown_link(text: Any, target: Any) -> str:
    """A Markdown link ``[text](target)`` with both made safe (:func:`markdown_cell`, :func:`link_target`);
    plain text when the target may not be a link."""
    href = link_target(target)
    label = markdown_cell(text)
    return f"[{label}]({href})" if href is not None else label


_NAME_LIKE = re.compile(r"[A-Za-z0-9_.:+@-]{1,64}")


def shown_value(value: Any) -> str:
    """A user's value as an error message may quote it without echoing a file's content: a number, a bool, null,
    or a short name-like string (``'spot_tolerance'``) as its repr; any other text by its length only (``a
    string of 1,234 characters``: ``--criteria /etc/passwd`` echoed the file's first line); a short list of such
    values as its repr, another list or a mapping by its size."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if _NAME_LIKE.fullmatch(value) else f"a string of {len(value):,} characters"
    if (
        isinstance(value, (list, tuple))
        and len(value) <= 16
        and all(
            v is None or isinstance(v, (bool, int, float)) or isinstance(v, str) and _NAME_LIKE.fullmatch(v)
            for v in value
        )
    ):
        return repr(list(value))
    if isinstance(value, (list, tuple, dict)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value):,} entries"
    return f"a {type(value).__name__}"


__all__ = ["console_safe", "markdown_cell", "markdown_link", "link_target", "shown_value"]
