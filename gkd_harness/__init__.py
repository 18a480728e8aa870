"""gkd-harness's one import namespace: ``gkd_harness.harness``, ``gkd_harness.analysis``, ``gkd_harness.launch``,
``gkd_harness.bench`` and ``gkd_harness.configs``.

They are ordinary subpackages, in this folder, in a checkout as in the wheel, so Python and every static tool
(mypy, pyright, jedi, an import-graph reader) resolve ``gkd_harness.harness.contract`` to the same file. The
repository's top-level ``harness/``, ``analysis/``, ``launch/``, ``bench/`` and ``configs/`` are links into this
folder (the layout the design card names), and a user's own ``analysis/`` package never collides with ours.
"""
