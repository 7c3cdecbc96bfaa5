"""Benchmarks (`python -m zeroboot_kernel.bench SUITE`): speed claims are checked here, never in tests."""
