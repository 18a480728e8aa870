"""``gkd_harness.harness`` (the repository's ``harness/`` is a link to this folder)."""

if __name__ != "gkd_harness.harness":  # one module object per file: never a second copy under another name
    raise ImportError(f"import gkd_harness.harness, not {__name__} (the checkout's harness/ links into gkd_harness/)")
