"""The gkd-train process: CLI, run lifecycle, launch plan and ms-swift argv, node environment."""
