"""CLI, config schema, experiment configs, sweeps, plots and benchmarks."""
