"""``run.extra_args`` checked by ms-swift's own argument classes, before anything is launched (the dry run and
every real launch call :func:`check_with_swift` through :func:`harness.launcher.plan.build_plan`).

The harness's own rules (flags it sets, credential-looking flags) run at validation
(:mod:`harness.config.extra_args_rules`, torch-free). This module parses the flags with the argparse parser
ms-swift builds from its argument dataclass (``RLHFArguments`` for ``swift rlhf``, ``MegatronRLHFArguments`` for
``megatron rlhf``): an unknown flag, a value of the wrong type or outside a flag's choices is refused here instead
of in ms-swift's ``remaining_argv`` error after the models have loaded. Only the parser runs, never the
dataclass's ``__post_init__`` (which would resolve models and datasets). Costs nothing when the list is empty.
"""
from __future__ import annotations

import argparse
from typing import List, Sequence

from harness.config.extra_args_rules import KEY
from harness.config.schema import ConfigError, MegatronBackendConfig, TrainConfig


def _swift_parser(megatron: bool) -> argparse.ArgumentParser:
    from transformers import HfArgumentParser

    from swift.utils.utils import _patch_get_type_hints  # the type-hint patch ms-swift's own parse_args uses

    if megatron:
        from swift.megatron.arguments import MegatronRLHFArguments as args_class
    else:
        from swift.arguments import RLHFArguments as args_class
    with _patch_get_type_hints():
        return HfArgumentParser([args_class], exit_on_error=False)


def swift_refusal(extra_args: Sequence[str], megatron: bool = False) -> str | None:
    """Why ms-swift's parser refuses ``extra_args`` (None: it accepts them)."""
    parser = _swift_parser(megatron)
    try:
        _, unknown = parser.parse_known_args(list(extra_args))
    except argparse.ArgumentError as e:
        return f"ms-swift refuses it: {e}"
    unknown_flags: List[str] = [t for t in unknown if t.startswith("-")]
    if unknown_flags or unknown:
        return f"ms-swift has no flag {' '.join(unknown_flags or unknown)}"
    return None


def check_with_swift(cfg: TrainConfig) -> None:
    """Raises :class:`ConfigError` naming ``run.extra_args`` when ms-swift's parser refuses them."""
    extra = list(cfg.run.extra_args)
    if not extra:
        return
    why = swift_refusal(extra, megatron=isinstance(cfg.backend, MegatronBackendConfig))
    if why:
        raise ConfigError(KEY, why)


__all__ = ["check_with_swift", "swift_refusal"]
