"""`python -m zeroboot_kernel.bench SUITE [options]`."""
from __future__ import annotations

import importlib
import sys

SUITES = {"engine": "zeroboot_kernel.bench.engine"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SUITES:
        print(f"usage: python -m zeroboot_kernel.bench {{{','.join(SUITES)}}} [options]", file=sys.stderr)
        return 2
    return int(importlib.import_module(SUITES[argv[0]]).main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
