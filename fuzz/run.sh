#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] [HARNESS...] - build the libFuzzer harnesses of fuzz/ with ASan and UBSan
# and run each for SECONDS (default 60). Harnesses: uart (frame parser, assembler, 16550 model),
# syscall (the syscall dispatcher over guest memory holding fuzzer bytes), dns (the sandbox's
# resolver's query parser) and exec (execve of a program and loader made of fuzzer bytes). Needs clang and its
# libFuzzer runtime (Debian: clang, libclang-rt-14-dev). The committed seeds in fuzz/corpus/NAME
# are read; new inputs go to build/fuzz/corpus-NAME, crashes to build/fuzz/artifacts-NAME/
# (FUZZ_OUT=DIR puts the build and both there instead).
# Exits 1 if a harness found a crash, a sanitizer report or a broken invariant.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
[ $# -gt 0 ] && shift
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(uart syscall dns exec)

cc="${CC:-}"
if [ -z "$cc" ]; then
    for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        command -v "$c" >/dev/null 2>&1 && { cc="$c"; break; }
    done
fi
[ -n "$cc" ] || { echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }

out="${FUZZ_OUT:-build/fuzz}"
mkdir -p "$out"
# The engine's sources, the generated ones and the shared C flags (language, warnings, include
# directories) come from the extension's build script, so that both builds compile the same engine
# the same way; only the optimisation level and the sanitizers are the fuzzers' own.
python="${PYTHON:-python3}"
mapfile -t sources < <("$python" zeroboot_kernel/_build_native.py --print-sources)
mapfile -t generated < <("$python" zeroboot_kernel/_build_native.py --generate "$out")
mapfile -t shared < <("$python" zeroboot_kernel/_build_native.py --print-flags)
[ ${#sources[@]} -gt 0 ] && [ ${#generated[@]} -gt 0 ] && [ ${#shared[@]} -gt 0 ] ||
    { echo "fuzz: zeroboot_kernel/_build_native.py failed" >&2; exit 2; }

flags=(-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       "${shared[@]}" -Wno-gnu-variable-sized-type-not-at-end)
status=0
for h in "${harnesses[@]}"; do
    src="fuzz/${h}_fuzz.c"
    [ -f "$src" ] || { echo "fuzz: no harness $src" >&2; exit 2; }
    bin="$out/${h}_fuzz"
    "$cc" "${flags[@]}" -o "$bin" "$src" fuzz/fuzz_blobs.c "${sources[@]}" "${generated[@]}" -lrt -lpthread -lcrypto
    mkdir -p "$out/corpus-$h" "$out/artifacts-$h" "fuzz/corpus/$h"
    log="$out/$h.log"
    echo "fuzz: running $h for ${secs}s (log: $log)"
    set +e
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -max_len=8192 -print_final_stats=1 \
        -artifact_prefix="$out/artifacts-$h/" "$out/corpus-$h" "fuzz/corpus/$h" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1 || true)
    corpus=$(grep -o 'corp: [0-9]*/[0-9]*[bkKM]*' "$log" | tail -1 || true)
    echo "fuzz: $h: exit $rc, $execs executions, ${cov:-cov: ?}, ${corpus:-corp: ?}"
    if [ $rc -ne 0 ]; then
        echo "fuzz: $h FAILED; the report:" >&2
        grep -E -A40 'ERROR: |runtime error|invariant failed|deadly signal|Test unit written' "$log" | head -80 >&2
        status=1
    fi
done
exit $status
