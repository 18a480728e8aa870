"""The run folder: layout, lock, metrics I/O, captures, provenance (both processes write it; credentials are
kept out by ``gkd_harness.harness.config.secrets``)."""
