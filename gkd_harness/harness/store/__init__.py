"""The run folder: layout, lock, metrics I/O, captures, secrets (both processes write it)."""
