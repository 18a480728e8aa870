"""The public loss API (contract): the GKD / generalized-JSD variants as drop-ins for ms-swift's functions.

    make_gkd_loss(precision, beta_form)        # drop-in for swift.rlhf_trainers.gkd_loss.gkd_loss
    make_jsd_loss(precision, beta_form)        # drop-in for swift.rlhf_trainers.gkd_loss.jsd_loss
    make_gkd_loss_terms(precision, beta_form)  # same signature as gkd_loss -> GKDTerms(total, num_valid, per_position)
    jsd_per_position(s_logits, t_logits, beta, precision=..., beta_form=...)

The implementation lives in :mod:`gkd_harness.harness.loss` (one module per path); this facade keeps the public names.
"""

from gkd_harness.harness.loss.variants import (
    BETA_FORMS,
    BUILTIN_PRECISIONS,
    DTYPES_BY_NAME,
    GKDTerms,
    compute_dtype,
    gkd_per_position,
    jsd_per_position,
    make_gkd_loss,
    make_gkd_loss_terms,
    make_jsd_loss,
)

__all__ = [
    "BUILTIN_PRECISIONS",
    "BETA_FORMS",
    "DTYPES_BY_NAME",
    "GKDTerms",
    "compute_dtype",
    "make_gkd_loss",
    "make_jsd_loss",
    "make_gkd_loss_terms",
    "jsd_per_position",
    "gkd_per_position",
]
