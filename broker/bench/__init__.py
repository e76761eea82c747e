"""Benchmarks: placement decisions, scheduling cycles, end-to-end service, watch ingestion."""
