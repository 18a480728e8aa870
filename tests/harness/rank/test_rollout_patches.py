"""gkd_harness.harness.rank.rollout_patches: what the plugin installs inside ms-swift's ranks for on-policy runs.

Runs in the main venv (no vLLM); the effect of the prepack switch on a real vLLM engine is
``tests/vllm/test_weight_sync.py``.
"""

from __future__ import annotations

import importlib.util

from gkd_harness.harness.rank import rollout_patches
from gkd_harness.harness.rank.rollout_patches import disable_vllm_cpu_prepack, install_rollout_patches


def test_install_rollout_patches_is_inert_without_the_env(monkeypatch):
    """Without the rollout variables only the resume patch of the rollout step is installed (HF here; Megatron's
    trainer cannot be imported without Transformer Engine): it changes nothing for a run that is not resumed."""
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    monkeypatch.delenv("GKD_VLLM_CPU_NO_PREPACK", raising=False)
    monkeypatch.delenv("GKD_ROLLOUT_ENGINE", raising=False)
    monkeypatch.setattr(GKDTrainer, "_prepare_inputs", GKDTrainer._prepare_inputs)  # restored after the test
    assert install_rollout_patches() == ["hf_rollout_step"]


def test_prepack_switch_reports_whether_vllm_is_here():
    # main venv: no vLLM, nothing patched; .venv-vllm: patched (tests/vllm/test_weight_sync.py checks the effect)
    assert disable_vllm_cpu_prepack() is (importlib.util.find_spec("vllm") is not None)


def test_token_count_of_flat_and_multi_turn_responses():
    assert rollout_patches._num_tokens([5, 6, 7]) == 3
    assert rollout_patches._num_tokens([[5, 6], [7, 8, 9]]) == 5
    assert rollout_patches._num_tokens([]) == 0 and rollout_patches._num_tokens(None) == 0


def test_gkd_train_never_imports_the_patches():
    """The patches belong to ms-swift's ranks: the gkd-train side (rollout_config) does not import them."""
    import subprocess
    import sys

    code = (
        "import sys, gkd_harness.harness.launcher.rollout_argv, gkd_harness.harness.launcher.plan, gkd_harness.harness.config.validate; "
        "assert 'gkd_harness.harness.rank.rollout_patches' not in sys.modules"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
