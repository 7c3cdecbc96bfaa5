#!/usr/bin/env bash
# Installs everything zeroboot-kernel needs on a fresh Debian machine into ./.venv: Debian build
# tools, the Python packages, the native engine (built by pip through cffi), both kernelspecs
# and the default template. Safe to re-run. `./setup.sh --test` also installs the test extras.
#
# Works as root and as a normal user: root installs missing Debian packages with apt-get; anyone
# else is told which to ask for (the build tools are required, the test tools optional). Which
# Python: $PYTHON if set, else `python3` on PATH (Debian's own, a pyenv build, ...; 3.11 or newer).
# The template goes to the user's cache ($XDG_CACHE_HOME or ~/.cache/zeroboot-kernel).
set -euo pipefail
cd "$(dirname "$0")"

extras="notebook"
[ "${1:-}" = "--test" ] && extras="notebook,test"
python="${PYTHON:-python3}"
say() { echo "setup: $*"; }
fail() { echo "setup: $*" >&2; exit 1; }

command -v "$python" >/dev/null 2>&1 || fail "no $python on PATH: install Python 3.11 or newer (Debian: python3), or set PYTHON=/path/to/python3"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "$("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])') is too old: zeroboot-kernel needs Python 3.11 or newer (set PYTHON=...)"
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# Debian packages: required ones build the engine; optional ones are for the tests only
need=() want=()
command -v gcc >/dev/null 2>&1 || need+=(build-essential)
command -v objcopy >/dev/null 2>&1 || need+=(binutils)
printf '#include <openssl/evp.h>\n' | cpp >/dev/null 2>&1 || need+=(libssl-dev)  # the spill file's MAC (native/mac.c)
"$python" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=("python$pyver-venv")
"$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
    need+=("python$pyver-dev")
if [ "$extras" = "notebook,test" ]; then
    command -v bwrap >/dev/null 2>&1 || want+=(bubblewrap)
    command -v clang >/dev/null 2>&1 || want+=(clang)  # fuzz/ smoke test
    command -v chromium >/dev/null 2>&1 || want+=(chromium)  # tests/test_browser_widgets.py (JupyterLab)
fi
apt_install() {
    say "installing Debian packages: $*"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if [ "$(id -u)" = 0 ]; then
    [ $((${#need[@]} + ${#want[@]})) -gt 0 ] && apt_install ${need[@]+"${need[@]}"} ${want[@]+"${want[@]}"}
    # the fuzzers (tests/test_fuzz_smoke.py) need clang's libFuzzer runtime, packaged per clang version
    if [ "$extras" = "notebook,test" ] && command -v clang >/dev/null 2>&1 &&
       ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
         clang -x c - -fsanitize=fuzzer -o /dev/null >/dev/null 2>&1; then
        apt_install "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
    fi
else
    # a normal user cannot apt-get: say what to ask for instead of failing inside apt
    if [ ${#need[@]} -gt 0 ]; then
        fail "missing Debian packages needed to build the engine: ${need[*]}
setup: ask an administrator to run:  sudo apt-get install ${need[*]}
setup: (or run ./setup.sh as root), then run ./setup.sh again"
    fi
    [ ${#want[@]} -gt 0 ] &&
        say "optional for the tests, not installed: ${want[*]} (sudo apt-get install ${want[*]}); the tests that need them are skipped"
fi

# /dev/kvm: root, or a member of the group that owns it (Debian: kvm)
kvm_ok=1
if [ ! -e /dev/kvm ]; then
    kvm_ok=0
    echo "setup: WARNING: /dev/kvm is missing; zeroboot-kernel needs KVM to run anything." >&2
elif [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
    kvm_ok=0
    group="$(stat -c %G /dev/kvm)"
    echo "setup: WARNING: $(id -un) cannot open /dev/kvm (owned by $(stat -c %U:%G /dev/kvm), mode $(stat -c %a /dev/kvm))." >&2
    if [ "$group" != root ]; then
        echo "setup: ask an administrator to run:  sudo usermod -aG $group $(id -un)   then log in again" >&2
    else
        echo "setup: ask an administrator to give the kvm group access (Debian's udev does:  sudo groupadd -r kvm;" \
             "sudo chgrp kvm /dev/kvm; sudo chmod 660 /dev/kvm;  sudo usermod -aG kvm $(id -un)), then log in again" >&2
    fi
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
say "installing zeroboot-kernel[$extras] (builds the native engine)"
.venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c 'import zeroboot_kernel._native' || fail "the native engine did not build"

if [ "$kvm_ok" = 0 ]; then
    say "installing the kernelspecs; the template is built once /dev/kvm is usable (the first kernel start does it)"
    .venv/bin/zeroboot-kernel install --sys-prefix --no-template
    fail "installed, but nothing can run until /dev/kvm is accessible (see above)"
fi
say "installing the kernelspecs and building the default template"
.venv/bin/zeroboot-kernel install --sys-prefix
