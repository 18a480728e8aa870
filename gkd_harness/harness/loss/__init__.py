"""The GKD loss variants (upstream, cancellation-free, chunked) as plain functions."""
