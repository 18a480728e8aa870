"""``gkd_harness.launch`` (the repository's ``launch/`` is a link to this folder)."""

if __name__ != "gkd_harness.launch":  # one module object per file: never a second copy under another name
    raise ImportError(f"import gkd_harness.launch, not {__name__} (the checkout's launch/ links into gkd_harness/)")
