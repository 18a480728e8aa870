"""The vLLM CPU lane: runs only in the ``.venv-vllm`` environment (``launch/setup_vllm_cpu.sh``).

Everything here is marked ``vllm``; in an environment without vLLM the whole folder is skipped at collection
(the main venv's CI run), and ``.ci/run`` runs it with ``.venv-vllm/bin/python -m pytest -m vllm tests/vllm``.
"""

import importlib.util

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_*.py"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
