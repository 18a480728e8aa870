"""``gkd_harness.analysis`` (the repository's ``analysis/`` is a link to this folder)."""

if __name__ != "gkd_harness.analysis":  # one module object per file: never a second copy under another name
    raise ImportError(f"import gkd_harness.analysis, not {__name__} (the checkout's analysis/ links into gkd_harness/)")
