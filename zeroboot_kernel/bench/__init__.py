"""Benchmarks of zeroboot-kernel: `python -m zeroboot_kernel.bench SUBCOMMAND [options]`.

Each subcommand is a module of this package with a `main(argv) -> int`; see __main__.py for the
table. Results are written as JSON (and a markdown summary next to it) under bench/results/ of the
checkout by default, and the summary table is printed.
"""
