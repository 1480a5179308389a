"""Benchmark scripts: each prints ratios measured side by side in one run."""
