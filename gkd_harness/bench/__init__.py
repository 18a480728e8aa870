"""``gkd_harness.bench`` (the repository's ``bench/`` is a link to this folder)."""

if __name__ != "gkd_harness.bench":  # one module object per file: never a second copy under another name
    raise ImportError(f"import gkd_harness.bench, not {__name__} (the checkout's bench/ links into gkd_harness/)")
