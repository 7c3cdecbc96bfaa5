"""CPython's own regression tests, run inside the guest: `zeroboot-kernel run -m test ...`.

The stdlib test package comes from the base installation in the read-only view. FULLY_PASSING
modules pass as they are, with the same counts as on the host (the last 11 of them once needed
exclusions: their cases start threads or processes, which the sandbox has since issues 14 and 15).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FULLY_PASSING = [
    # asked for in issue 2
    "test_math", "test_string", "test_collections", "test_fractions", "test_statistics", "test_textwrap",
    "test_operator", "test_bisect", "test_heapq", "test_dataclasses", "test_datetime",
    # more pure-library suites that pass
    "test_fnmatch", "test_glob", "test_zlib", "test_lzma", "test_csv", "test_difflib", "test_pprint",
    "test_contextlib", "test_typing", "test_copy", "test_types", "test_long", "test_float", "test_dict",
    "test_set", "test_list", "test_array", "test_ast", "test_codecs", "test_locale", "test_linecache",
    # their thread and process cases run since the guest has threads and processes: `zeroboot-kernel
    # run -m test <these 11>` and the host's `python -m test <these 11>`, 2026-12-07: run=3,045
    # skipped=75 on both, all OK (18.6 s in the guest, 8.0 s on the host)
    "test_json", "test_re", "test_itertools", "test_functools", "test_decimal", "test_base64", "test_struct",
    "test_enum", "test_random", "test_hashlib", "test_pickle",
]

def run_in_guest(exclusions: dict[str, list[str]], guest_timeout: int, matches: tuple[str, ...] = ()) -> None:
    """Run these modules with regrtest in the guest, leaving out the given cases (-i patterns) and,
    with `matches`, running only the cases they match (-m patterns); every module must pass."""
    modules = list(exclusions)
    # -m before -i: regrtest lets the last matching pattern decide, and a case no pattern matches
    # is run only if the first pattern is an -i
    ignores = [arg for pattern in matches for arg in ("-m", pattern)]
    ignores += [arg for patterns in exclusions.values() for pattern in patterns for arg in ("-i", pattern)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "zeroboot_kernel", "run", "--timeout", str(guest_timeout), "-m", "test",
                           *modules, *ignores], capture_output=True, text=True, timeout=guest_timeout + 300, env=env,
                          stdin=subprocess.DEVNULL, cwd=ROOT)
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    assert "Result: SUCCESS" in proc.stdout, report
    assert ("1 test OK." if len(modules) == 1 else f"All {len(modules)} tests OK.") in proc.stdout, report


# The guest timeouts below guard against a hang, not a speed: a loaded 2-core host took 654 s for
# the regression modules that take ~200 s on a quiet one.
def test_cpython_regression_tests_pass_in_the_guest():
    run_in_guest({m: [] for m in FULLY_PASSING}, 1800)


# CPython's thread suites (issue 14). Measured 2026-12-02 with guest processes (fork, execve,
# subprocess) in place: `zeroboot-kernel run -m test test_thread test_threading_local test_queue
# test_threadsignals test_threadedtempfile -v` and `zeroboot-kernel run -m test test_threading -v`;
# host: the same with the base interpreter (`python -m test ...`). Cases run ("Ran N tests") and
# passed, guest / host:
#   test_thread 24/24 / 24/24, test_threading_local 22/22 / 22/22, test_queue 54/54 / 54/54,
#   test_threadsignals 6/6 / 6/6, test_threadedtempfile 1/1 / 1/1,
#   test_threading 195 passed of 197 run (2 skipped on both: no debug build, ConditionAsRLock's
#   _recursion_count) / 194 passed of 197 (the host fails test_import_from_another_thread: its
#   site imports threading before `-I -c` runs; it passes in the guest).
# 302 of the 304 cases pass in the guest (the 2 others are skipped on the host too); the host
# passes 301. test_reinit_tls_after_fork (threads that fork at once) aborted the guest until the
# engine loaded a thread whose wait ended between runs (tests/test_threads_cells.py covers it).
# test_concurrent_futures is not installed in this interpreter's test package, so its thread-pool
# parts cannot be run here; tests/test_threads_cells.py covers ThreadPoolExecutor and Timer.
THREAD_MODULES: dict[str, list[str]] = {
    "test_thread": [],
    "test_threading_local": [],
    "test_queue": [],
    "test_threadsignals": [],
    "test_threadedtempfile": [],
}

# test_threading takes ~40 s on this host and ~2 minutes in the guest (2 loaded cores), so CI runs
# these classes of it: everything but PyRLockTests and ConditionAsRLockTests (lock_tests' RLock
# cases again, on the pure-Python RLock that threading does not use; CRLockTests, threading's own
# RLock, stays). The process classes (ThreadJoinOnShutdown, SubinterpThreadingTests, AtexitTests)
# run since the guest has processes.
THREADING_CLASSES = ("ThreadTests", "LockTests", "CRLockTests", "EventTests", "ConditionTests", "SemaphoreTests",
                     "BoundedSemaphoreTests", "BarrierTests", "TimerTests", "InterruptMainTests", "ExceptHookTests",
                     "ThreadingExceptionTests", "MiscTestCase", "ThreadJoinOnShutdown", "SubinterpThreadingTests",
                     "AtexitTests")


def test_cpython_thread_suites_pass_in_the_guest():
    run_in_guest(THREAD_MODULES, 1800)


def test_cpython_test_threading_passes_in_the_guest():
    run_in_guest({"test_threading": []}, 1800,
                 matches=tuple(f"*.{cls}.*" for cls in THREADING_CLASSES))


# test_socket's AF_UNIX stream cases (issue 15: named sockets): `zeroboot-kernel run -m test
# test_socket -m '*Unix*' -v` against the host's `python -m test test_socket -m '*Unix*' -v`,
# measured 2026-12-04: 48 run, 47 passed, 1 skipped (TestUnixDomain.testEmptyAddress, "Linux
# specific test") on both; 12 s in the guest against 3 s on the host. The classes that pass fds
# are not among them: see the next test.
def test_cpython_unix_socket_cases_pass_in_the_guest():
    run_in_guest({"test_socket": []}, 900, matches=("*Unix*",))


# test_socket's fd-passing cases (SCM_RIGHTS over AF_UNIX streams: RecvmsgSCMRightsStreamTest and
# RecvmsgIntoSCMRightsStreamTest, with their control-buffer truncation cases): `zeroboot-kernel run
# -m test test_socket -m '*SCMRights*' -v` against the host's, measured 2026-12-06: 36 run, 36
# passed on both, none skipped; 2.5 s in the guest against 0.4 s on the host.
def test_cpython_fd_passing_cases_pass_in_the_guest():
    run_in_guest({"test_socket": []}, 900, matches=("*SCMRights*",))
