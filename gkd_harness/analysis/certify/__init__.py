"""``gkd-certify``: the loss-level certificate of a candidate GKD loss (cases, families, evaluation, CLI)."""
