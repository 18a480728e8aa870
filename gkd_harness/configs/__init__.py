"""The Hydra config tree of gkd-harness, shipped as package data (``pkg://gkd_harness.configs``)."""
