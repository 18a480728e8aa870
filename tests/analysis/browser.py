"""Headless Chromium for the report tests: measure a rendered page, take a screenshot.

No browser driver package is needed: :func:`measure` copies the page, appends a small script that writes its
measurements as JSON into a ``<pre id="gkd-measure">`` once the page has loaded, and reads them back from
``chromium --dump-dom``. Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``).

Regenerate the README screenshot (and ``docs/img/report.json``: the sections and criteria it shows)::

    .venv/bin/python -m tests.analysis.browser screenshot REPORT_DIR/report.html docs/img/report.png 1800
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

__all__ = ["find_chromium", "measure", "screenshot", "report_counts", "VIEWPORT"]

#: Window size of every rendering (a common laptop width).
VIEWPORT = (1366, 900)
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Runs after the load event: every <img> has loaded or failed by then (data: URIs included).
_MEASURE_JS = """
<script>
window.addEventListener('load', function () {
  var d = document.documentElement, b = document.body;
  var banner = document.getElementById('verdict-banner'), v = document.getElementById('verdict');
  var ids = {};
  Array.prototype.forEach.call(document.querySelectorAll('[id]'), function (e) { ids[e.id] = true; });
  var external = [];
  // what the page loads (src, stylesheets); a link the reader may follow (a run folder) loads nothing
  Array.prototype.forEach.call(document.querySelectorAll('[src],link[href]'), function (e) {
    var u = e.getAttribute('src') || e.getAttribute('href');
    if (!/^(data:|#)/.test(u)) external.push(u);
  });
  var out = {
    innerWidth: window.innerWidth,
    clientWidth: d.clientWidth,
    scrollWidth: Math.max(d.scrollWidth, b.scrollWidth),
    verdict: v ? v.textContent : null,
    bannerClass: banner ? banner.className : null,
    bannerBackground: banner ? getComputedStyle(banner).backgroundColor : null,
    bannerTop: banner ? banner.getBoundingClientRect().top : null,
    images: Array.prototype.map.call(document.images, function (i) {
      return {alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth,
              shownWidth: i.getBoundingClientRect().width};
    }),
    tables: Array.prototype.map.call(document.querySelectorAll('table'), function (t) {
      var w = t.parentElement;
      return {width: t.scrollWidth, wrapped: w.classList.contains('table-wrap'),
              boxWidth: w.clientWidth, boxRight: w.getBoundingClientRect().right};
    }),
    tocLinks: Array.prototype.map.call(document.querySelectorAll('nav.toc a'), function (a) {
      var id = decodeURIComponent(a.getAttribute('href').slice(1));
      return {href: a.getAttribute('href'), target: !!ids[id]};
    }),
    external: external
  };
  var pre = document.createElement('pre');
  pre.id = 'gkd-measure';
  pre.style.display = 'none';
  pre.textContent = JSON.stringify(out);
  b.appendChild(pre);
});
</script>
"""


def find_chromium() -> Optional[str]:
    """Path of a Chromium/Chrome binary on PATH, or None."""
    for name in _CANDIDATES:
        p = shutil.which(name)
        if p:
            return p
    return None


def _run(args: list, timeout: float, size: tuple = VIEWPORT) -> subprocess.CompletedProcess:
    """Run headless Chromium with a throw-away profile and no network services; ``args`` are appended."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH: install Debian's chromium package (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="gkd-chromium-") as profile:
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
        ] + args
        # Chromium logs D-Bus noise on stderr in containers; only its exit code and stdout matter here.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": profile})
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def measure(html_path: Path, timeout: float = 120.0, size: tuple = VIEWPORT) -> dict:
    """Render ``html_path`` at ``size`` (default :data:`VIEWPORT`) and return the page's measurements.

    Keys: ``innerWidth, clientWidth`` (viewport without / with the vertical scrollbar taken off),
    ``scrollWidth`` (document width: > clientWidth means the page scrolls sideways), ``verdict`` (text of
    ``#verdict``), ``bannerClass, bannerBackground`` (CSS rgb string), ``images`` (per <img>: complete,
    naturalWidth), ``tables`` (per <table>: width, wrapped in .table-wrap), ``tocLinks`` (href, target exists),
    ``external`` (src/href values that are not data: or #anchors).
    """
    html_path = Path(html_path)
    text = html_path.read_text(encoding="utf-8")
    if "</body>" not in text:
        raise ValueError(f"{html_path}: no </body> to append the measuring script to")
    with tempfile.TemporaryDirectory(prefix="gkd-measure-") as tmp:
        page = Path(tmp) / html_path.name
        page.write_text(text.replace("</body>", _MEASURE_JS + "</body>", 1), encoding="utf-8")
        # --virtual-time-budget lets the page finish loading before the DOM is dumped.
        proc = _run(["--virtual-time-budget=10000", "--dump-dom", page.as_uri()], timeout, size=size)
    m = re.search(r'<pre id="gkd-measure"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    if not m:
        raise RuntimeError(
            f"{html_path}: the measuring script left no result (did the page load?); "
            f"DOM dump starts: {proc.stdout[:300]!r}"
        )
    import html as _html

    return json.loads(_html.unescape(m.group(1)))


def screenshot(html_path: Path, png_path: Path, height: int = 1400, timeout: float = 120.0) -> Path:
    """Save a PNG of the top ``VIEWPORT[0]`` x ``height`` pixels of the rendered page."""
    png_path = Path(png_path).absolute()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [
            "--run-all-compositor-stages-before-draw",
            "--virtual-time-budget=10000",
            f"--screenshot={png_path}",
            Path(html_path).absolute().as_uri(),
        ],
        timeout,
        size=(VIEWPORT[0], height),
    )
    if not png_path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {png_path}")
    return png_path


def report_counts(html_text: str) -> dict:
    """What the top of a report shows: ``sections`` (entries of its table of contents) and ``criteria`` (rows of
    the criteria table, the first table after the ``Criteria`` heading)."""
    toc = re.search(r"<nav class='toc'.*?</nav>", html_text, re.S)
    after = html_text.split("<h2 id='criteria'>", 1)[1] if "<h2 id='criteria'>" in html_text else ""
    table = re.search(r"<table>(.*?)</table>", after, re.S)
    return {
        "sections": len(re.findall(r"<li>", toc.group(0))) if toc else 0,
        "criteria": max(0, len(re.findall(r"<tr>", table.group(1))) - 1) if table else 0,
    }


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) in (3, 4) and args[0] == "screenshot":
        # beside the PNG, what it shows (tests/analysis/test_readme_screenshot.py holds the README to it)
        png = screenshot(Path(args[1]), Path(args[2]), *(int(a) for a in args[3:]))
        counts = report_counts(Path(args[1]).read_text(encoding="utf-8"))
        png.with_suffix(".json").write_text(json.dumps({"image": png.name, **counts}, indent=1) + "\n")
        print(png, counts)
        return 0
    if len(args) == 2 and args[0] == "measure":
        print(json.dumps(measure(Path(args[1])), indent=1))
        return 0
    print(
        "usage: python -m tests.analysis.browser screenshot REPORT.html OUT.png [HEIGHT] | measure REPORT.html",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
