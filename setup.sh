#!/usr/bin/env bash
# Installs everything zeroboot-kernel needs on a fresh Debian machine into ./.venv: Debian build
# tools, the Python packages, the native engine (built by pip through cffi), both kernelspecs
# and the default template. Safe to re-run. `./setup.sh --test` also installs the test extras.
set -euo pipefail
cd "$(dirname "$0")"

extras="notebook"
[ "${1:-}" = "--test" ] && extras="notebook,test"

need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v objcopy >/dev/null 2>&1 || need_apt+=(binutils)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
[ "$extras" = "notebook,test" ] && ! command -v bwrap >/dev/null 2>&1 && need_apt+=(bubblewrap)
[ "$extras" = "notebook,test" ] && ! command -v clang >/dev/null 2>&1 && need_apt+=(clang)  # fuzz/ smoke test
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# the fuzzers (tests/test_fuzz_smoke.py) need clang's libFuzzer runtime, packaged per clang version
if [ "$extras" = "notebook,test" ] && command -v clang >/dev/null 2>&1 &&
   ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
     clang -x c - -fsanitize=fuzzer -o /dev/null >/dev/null 2>&1; then
    rt="libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
    echo "setup: installing Debian package: $rt"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$rt" >/dev/null
fi

if [ ! -e /dev/kvm ]; then
    echo "setup: WARNING: /dev/kvm is missing; zeroboot-kernel needs KVM to run anything." >&2
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
echo "setup: installing zeroboot-kernel[$extras] (builds the native engine)"
.venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c 'import zeroboot_kernel._native' || { echo "setup: the native engine did not build" >&2; exit 1; }

echo "setup: installing the kernelspecs and building the default template"
.venv/bin/zeroboot-kernel install --sys-prefix
