"""CI smoke test of the fuzzers (fuzz/): build each libFuzzer harness with ASan and UBSan and run
it briefly. The committed seeds, which include every input that once found a bug, are replayed
first, so this is also the regression test of those fixes. Longer runs: fuzz/run.sh SECONDS."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.without_kvm  # the harnesses drive the engine's C code, no VM

ROOT = Path(__file__).resolve().parent.parent
SECONDS = 15  # per harness
MIN_COVERAGE = {"uart": 100, "syscall": 100, "dns": 60, "exec": 100}  # edges a short run must reach (dns: one small parser)


def clang() -> str | None:
    for name in ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"):
        if shutil.which(name):
            return name
    return None


def libfuzzer_available(cc: str, tmp: Path) -> bool:
    src = tmp / "probe.c"
    src.write_text("#include <stdint.h>\n#include <stddef.h>\n"
                   "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
    return subprocess.run([cc, "-fsanitize=fuzzer,address,undefined", str(src), "-o", str(tmp / "probe")],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("harness", list(MIN_COVERAGE))
def test_fuzz_harness_smoke(harness, tmp_path):
    cc = clang()
    if not cc:
        pytest.skip("clang is not installed (./setup.sh --test installs clang and libclang-rt-14-dev)")
    if not libfuzzer_available(cc, tmp_path):
        pytest.skip(f"{cc} has no libFuzzer runtime (Debian: libclang-rt-<version>-dev)")
    proc = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), str(SECONDS), harness], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin:/usr/local/bin", "CC": cc, "FUZZ_OUT": str(tmp_path / "out"),
                               "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=SECONDS + 240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(rf"fuzz: {harness}: exit 0, (\d+) executions, cov: (\d+)", proc.stdout)
    assert m, proc.stdout
    assert int(m.group(1)) > 1000 and int(m.group(2)) > MIN_COVERAGE[harness], proc.stdout
