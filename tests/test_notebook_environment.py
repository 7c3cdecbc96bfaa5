"""The notebook's environment inside the sandbox as ipykernel gives it (issue 13): modules beside
the notebook import, the kernel's environment variables arrive (minus what describes the host), the
notebook's project (not only its folder) is shown, the locale follows the host's."""
from __future__ import annotations

import os
import shutil

import pytest

from zeroboot_kernel import guest_environ
from zeroboot_kernel.project_root import ProjectRootError, find_project_root
from zeroboot_kernel.session import Session

from session_helpers import cell


@pytest.fixture
def course(tmp_path):
    """A course repository: notebooks/ beside data/ and src/, a pyproject.toml at the top."""
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "src" / "features").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'course'\n")
    (root / "data" / "x.csv").write_text("a,b\n1,2\n")
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "features" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    nb = root / "notebooks"
    (nb / "helper.py").write_text("ANSWER = 42\n")
    (nb / "pkg").mkdir()
    (nb / "pkg" / "__init__.py").write_text("NAME = 'pkg'\n")
    # a user module named like the agent's former top-level modules must win
    (nb / "agent.py").write_text("MINE = True\n")
    (nb / "agent_io.py").write_text("MINE = True\n")
    return root


# ---- item 1: local imports ----------------------------------------------------------------------

def test_modules_beside_the_notebook_import(template, course) -> None:
    nb = course / "notebooks"
    s = Session(template, project_dir=str(nb))
    try:
        r = cell(s, "import helper, pkg, agent, agent_io\n(helper.ANSWER, pkg.NAME, agent.MINE, agent_io.MINE)")
        assert r["status"] == "ok", r
        assert r["result"] == "(42, 'pkg', True, True)"
        # '' where IPython's kernel app puts it: before site-packages, after the standard library
        r = cell(s, "import sys, os\n(os.path.basename(sys.path[sys.path.index('') + 1]), os.getcwd() in sys.path)", 2)
        assert r["result"] == "('site-packages', False)", r
        # a module written during the session is importable at once, as under ipykernel
        r = cell(s, "open('fresh_mod.py', 'w').write('V = 7\\n')\nimport fresh_mod\nfresh_mod.V", 3)
        assert r["status"] == "ok" and r["result"] == "7", r
        # the project's packages import after the usual sys.path edit
        r = cell(s, "sys.path.insert(0, '..')\nfrom src.features import double\ndouble(21)", 4)
        assert r["status"] == "ok" and r["result"] == "42", r
    finally:
        s.close()


def test_autoreload_sees_an_edited_module(template, course) -> None:
    s = Session(template, project_dir=str(course / "notebooks"))
    try:
        assert cell(s, "%load_ext autoreload\n%autoreload 2\nimport helper\nhelper.ANSWER")["result"] == "42"
        cell(s, "import time; time.sleep(1.1)\nopen('helper.py', 'w').write('ANSWER = 43\\n')", 2)
        r = cell(s, "helper.ANSWER", 3)
        assert r["result"] == "43", r
    finally:
        s.close()


# ---- item 12: the project, not only the notebook's folder ---------------------------------------

def test_the_project_root_is_shown(template, course) -> None:
    s = Session(template, project_dir=str(course / "notebooks"))
    try:
        assert s.project_root == str(course.resolve())
        r = cell(s, "import pandas as pd\npd.read_csv('../data/x.csv').values.tolist()")
        assert r["result"] == "[[1, 2]]", r
        r = cell(s, "sorted(os.listdir('..')) if (os := __import__('os')) else None", 2)
        assert r["result"] == repr(["data", "notebooks", "pyproject.toml", "src"]), r
        assert s.stats()["files"] == {"directory": str(course.resolve()), "notebook": str((course / "notebooks").resolve()),
                                      "mode": "overlay"}
    finally:
        s.close()


def test_project_root_search_is_bounded(tmp_path) -> None:
    home = tmp_path / "home"
    nb = home / "work" / "nb"
    nb.mkdir(parents=True)
    env = {"HOME": str(home)}
    # no marker anywhere: the notebook's folder alone
    assert find_project_root(str(nb), env) == str(nb)
    # a marker in the home itself is never taken: the home is not a project
    (home / ".git").mkdir()
    assert find_project_root(str(nb), env) == str(nb)
    (home / "work" / "requirements.txt").write_text("numpy\n")
    assert find_project_root(str(nb), env) == str(home / "work")
    # the notebook directly in the home: only that folder, as before
    assert find_project_root(str(home), env) == str(home)
    assert find_project_root(str(nb), {**env, "ZEROBOOT_PROJECT_ROOT": "notebook"}) == str(nb)
    assert find_project_root(str(nb), {**env, "ZEROBOOT_PROJECT_ROOT": str(home / "work")}) == str(home / "work")
    for bad in (str(home), str(tmp_path / "elsewhere"), "/"):
        with pytest.raises(ProjectRootError):
            find_project_root(str(nb), {**env, "ZEROBOOT_PROJECT_ROOT": bad})
    # outside any home: never / nor a folder directly under it
    assert find_project_root("/tmp", {"HOME": str(home)}) == "/tmp"


# ---- item 3: the kernel's environment ------------------------------------------------------------

def test_environment_policy() -> None:
    env = {"MY_NOTEBOOK_VAR": "hello", "PATH": "/host/bin", "HOME": "/home/u", "LD_PRELOAD": "x.so",
           "SSH_AUTH_SOCK": "/run/ssh", "LANG": "en_US.UTF-8", "LC_ALL": "C.UTF-8", "ZEROBOOT_MODE": "chained",
           "OPENBLAS_CORETYPE": "Haswell", "OMP_NUM_THREADS": "8", "API_KEY": "k"}
    got = guest_environ.session_environment(env)
    assert got == {"MY_NOTEBOOK_VAR": "hello", "LANG": "en_US.UTF-8", "LC_ALL": "C.UTF-8", "API_KEY": "k"}
    clean = guest_environ.session_environment({**env, "ZEROBOOT_ENV": "clean", "ZEROBOOT_ENV_ALLOW": "API_*"})
    assert clean == {"LANG": "en_US.UTF-8", "LC_ALL": "C.UTF-8", "API_KEY": "k"}
    denied = guest_environ.session_environment({**env, "ZEROBOOT_ENV_DENY": "API_KEY,MY_*"})
    assert "API_KEY" not in denied and "MY_NOTEBOOK_VAR" not in denied
    assert guest_environ.session_environment({**env, "ZEROBOOT_ENV_ALLOW": "SSH_AUTH_SOCK"})["SSH_AUTH_SOCK"]
    assert guest_environ.template_environment(env) == {"OPENBLAS_CORETYPE": "Haswell"}
    with pytest.raises(guest_environ.EnvironmentConfigError):
        guest_environ.session_environment({"ZEROBOOT_ENV": "everything"})


def test_the_users_shell_is_forwarded_when_the_sandbox_has_it(tmp_path) -> None:
    """`!cmd` runs `$SHELL -c cmd`: bash users get bash in the guest too (the system view has it);
    a shell the view lacks (a host path outside it, a relative name) is not forwarded, and then
    IPython falls back to sh, as it does without SHELL."""
    bash = shutil.which("bash")
    assert bash, "the host has no bash"
    assert guest_environ.session_environment({"SHELL": bash}) == {"SHELL": bash}
    own = tmp_path / "myshell"
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    for shell in (str(own), "bash", "/nonexistent/zsh"):
        assert "SHELL" not in guest_environ.session_environment({"SHELL": shell}), shell
    assert "SHELL" not in guest_environ.session_environment({"SHELL": bash, "ZEROBOOT_ENV": "clean"})


def test_environment_reaches_the_cells(template, tmp_path) -> None:
    environ = {"MY_NOTEBOOK_VAR": "hello", "PYTHONPATH": str(tmp_path / "extra"), "TZ": "Asia/Tokyo",
               "TERM": "dumb"}
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "extra_mod.py").write_text("X = 'extra'\n")
    s = Session(template, project_dir=str(tmp_path), environ=environ)
    try:
        r = cell(s, "import os, time, sys\n(os.environ.get('MY_NOTEBOOK_VAR'), os.environ['TERM'], time.strftime('%Z'))")
        assert r["result"] == "('hello', 'xterm-color', 'JST')", r
        assert cell(s, "import extra_mod\nextra_mod.X", 2)["result"] == "'extra'"
        assert cell(s, "os.environ['MPLBACKEND']", 3)["result"] == "'module://matplotlib_inline.backend_inline'"
        # a restart (a fresh sandbox from the session's clean state) keeps the environment
        s.restart()
        assert cell(s, "import os\nos.environ.get('MY_NOTEBOOK_VAR')", 1)["result"] == "'hello'"
    finally:
        s.close()
    iso = Session(template, mode="isolated", project_dir=str(tmp_path), environ=environ)
    try:
        for n in (1, 2):
            assert cell(iso, "import os\nos.environ.get('MY_NOTEBOOK_VAR')", n)["result"] == "'hello'"
    finally:
        iso.close()


def test_locale_follows_the_host(template, tmp_path) -> None:
    """The host's compiled locales are in the view and LANG/LC_* are forwarded: setlocale with the
    user's settings gives what it gives on the host."""
    import subprocess
    import sys
    code = "import locale\nlocale.setlocale(locale.LC_ALL, '')\nprint(locale.getlocale(), locale.localeconv()['decimal_point'])"
    env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    host = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert host.returncode == 0, host.stderr
    s = Session(template, project_dir=str(tmp_path), environ=env)
    try:
        r = cell(s, code)
        assert r["status"] == "ok", r
        assert r["stdout"] == host.stdout
        assert cell(s, "import os\nos.path.isdir('/usr/lib/locale')", 2)["result"] == str(os.path.isdir("/usr/lib/locale"))
    finally:
        s.close()


# ---- items 7 and 11: memory -----------------------------------------------------------------------

def test_memory_size_settings() -> None:
    from zeroboot_kernel import guest_memory_size as gm
    assert gm.parse_size("8G") == 8 << 30 and gm.parse_size("8GiB") == 8 << 30
    assert gm.parse_size("1536M") == 1536 << 20 and gm.parse_size("2048") == 2 << 30
    for bad in ("lots", "1K", "100T", ""):
        with pytest.raises(gm.MemorySizeError):
            gm.parse_size(bad)
    assert gm.default_memory({"ZEROBOOT_MEMORY": "6G"}) == 6 << 30
    host = gm.host_memory()
    assert gm.default_memory({}) == max(gm.MINIMUM, min(host or gm.DEFAULT_CAP, gm.DEFAULT_CAP) // gm.ALIGN * gm.ALIGN)


def test_memory_limit_and_message(template, tmp_path) -> None:
    s = Session(template, project_dir=str(tmp_path), environ={})
    try:
        total = int(template.manifest["memory"])
        # the default template follows the host: more than the old fixed 1 GiB where the host has it
        assert total >= min(2 << 30, __import__("zeroboot_kernel.guest_memory_size", fromlist=["x"]).host_memory())
        r = cell(s, "import numpy as np\nbig = [np.ones(10_000_000) for _ in range(8)]\nlen(big)")
        assert r["status"] == "ok", r
        cell(s, "big = None", 2)
        s.set_memory(1 << 30)
        out: list[str] = []
        reply = s.execute("import numpy as np\nx = np.ones(2**28)", execution_count=3,
                          on_message=lambda mt, c: out.append("\n".join(c.get("traceback", []))) if mt == "error" else None)
        assert reply["status"] == "error" and reply["ename"] == "MemoryError", reply
        assert "%sandbox memory SIZE" in "".join(out) and "ZEROBOOT_MEMORY" in "".join(out)
        # the limit holds across a rollback/restore of the session
        s.restart()
        assert s.stats()["guest_memory_limit_mib"] == 1024.0
        with pytest.raises(Exception, match="ZEROBOOT_MEMORY"):
            s.set_memory(total + (1 << 30))
    finally:
        s.close()


# ---- item 5: /proc in guest terms ---------------------------------------------------------------

def test_a_mount_table_for_df_and_psutil(template, tmp_path) -> None:
    """/proc/mounts, /proc/self/mounts and /proc/self/mountinfo describe the sandbox (one file system
    at /, and /proc), so df, findmnt and psutil.disk_partitions work without warnings ("df: cannot
    read table of mounted file systems" before); no host mount or device shows."""
    s = Session(template, project_dir=str(tmp_path))
    try:
        r = cell(s, "import subprocess, psutil\n"
                    "df = subprocess.run(['df', '-h', '/'], capture_output=True, text=True)\n"
                    "(df.returncode, df.stderr, df.stdout.split()[-1], open('/proc/mounts').read() == "
                    "open('/proc/self/mounts').read(), open('/proc/self/mounts').read().split()[:3], "
                    "len(open('/proc/self/mountinfo').read().splitlines()), "
                    "[p.mountpoint for p in psutil.disk_partitions(all=True)])")
        assert r["status"] == "ok", r
        import ast
        assert ast.literal_eval(r["result"]) == (0, "", "/", True, ["zeroboot", "/", "zeroboot"], 2, ["/", "/proc"]), r
    finally:
        s.close()


def test_proc_files_in_guest_terms(template, tmp_path) -> None:
    s = Session(template, project_dir=str(tmp_path), environ={})
    try:
        code = ("import os, re\n"
                "maps = open('/proc/self/maps').read().splitlines()\n"
                "libs = [l.split()[-1] for l in maps if l.split()[-1].endswith('.so') or '.so.' in l.split()[-1]]\n"
                "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines())\n"
                "mem = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/meminfo')}\n"
                "stat = open('/proc/self/stat').read().split()\n"
                "(all(re.match(r'^[0-9a-f]+-[0-9a-f]+ [r-][w-][x-]p ', l) for l in maps), any('libpython' in p or 'numpy' in p for p in libs),"
                " status['Pid'], status['Threads'], int(status['VmRSS'].split()[0]) > 100_000,"
                " mem['MemTotal'] == os.sysconf('SC_PHYS_PAGES') * 4, len(stat), stat[0],"
                " open('/proc/self/cgroup').read(), 'processor\\t: 0' in open('/proc/cpuinfo').read(),"
                " os.path.isfile('/proc/self/statm'), 'Rss:' in open('/proc/self/smaps_rollup').read(),"
                " sorted(os.listdir('/proc/self')))")
        r = cell(s, code)
        assert r["status"] == "ok", r
        import ast
        assert ast.literal_eval(r["result"]) == (True, True, '1', '1', True, True, 52, '1', '0::/\n', True, True, True,
                                                 ['cgroup', 'cmdline', 'cwd', 'exe', 'fd', 'fdinfo', 'maps', 'mountinfo', 'mounts', 'smaps_rollup',
                                                  'stat', 'statm', 'status']), r
        # the host's pid appears nowhere
        host_pid = str(os.getpid())
        r = cell(s, "open('/proc/self/status').read() + open('/proc/self/stat').read()", 2)
        assert f"\\t{host_pid}\\n" not in r["result"]
        # read-only, and CPU times count
        r = cell(s, "sum(range(5_000_000))\ntry:\n    open('/proc/self/maps', 'w')\nexcept PermissionError as e:\n    w = 'denied'\n"
                    "(w, int(open('/proc/self/stat').read().split()[13]) > 0)", 3)
        assert r["result"] == "('denied', True)", r
    finally:
        s.close()


# ---- item 2: directory times --------------------------------------------------------------------

def test_directory_times_follow_entry_changes(template, tmp_path) -> None:
    """Creating, renaming and deleting entries changes the directory's mtime and ctime (Python's
    import cache and make-like tools rely on it), in /tmp, the home and the notebook's folder."""
    s = Session(template, project_dir=str(tmp_path), environ={})
    try:
        code = ("import os, time\n"
                "def changed(op, d):\n"
                "    before = os.stat(d)\n"
                "    time.sleep(0.01)\n"
                "    op()\n"
                "    after = os.stat(d)\n"
                "    return after.st_mtime_ns > before.st_mtime_ns and after.st_ctime_ns > before.st_ctime_ns\n"
                "out = []\n"
                "for d in ('/tmp', os.path.expanduser('~'), os.getcwd()):\n"
                "    a, b = os.path.join(d, 'zb_a'), os.path.join(d, 'zb_b')\n"
                "    out += [changed(lambda: open(a, 'w').close(), d), changed(lambda: os.rename(a, b), d),\n"
                "            changed(lambda: os.unlink(b), d), changed(lambda: os.mkdir(a), d), changed(lambda: os.rmdir(a), d)]\n"
                "before = os.stat('/tmp').st_ctime_ns\n"
                "open('/tmp/zb_c', 'w').close(); c0 = os.stat('/tmp/zb_c').st_ctime_ns; time.sleep(0.01)\n"
                "os.chmod('/tmp/zb_c', 0o600)\n"
                "out.append(os.stat('/tmp/zb_c').st_ctime_ns > c0)\n"
                "out")
        r = cell(s, code)
        assert r["status"] == "ok", r
        assert r["result"] is not None and "False" not in r["result"], r["result"]
    finally:
        s.close()


# ---- item 13: shell commands run as guest processes (issue 15) -----------------------------------

def test_shell_commands_run_in_the_sandbox(template, tmp_path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    s = Session(template, project_dir=str(tmp_path), environ={})
    try:
        r = cell(s, "!head -1 data.csv", 1)
        assert r["status"] == "ok" and r["stdout"] == "a,b\r\n", r
        assert cell(s, "x = !ls\nx", 2)["result"] == "['data.csv']"
        assert cell(s, "import os\nos.system('exit 3') >> 8", 3)["result"] == "3"
        assert cell(s, "%sx echo sx", 4)["result"] == "['sx']"
        r = cell(s, "import os\n'JOBLIB_MULTIPROCESSING' in os.environ", 5)  # joblib's loky runs
        assert r["result"] == "False"
    finally:
        s.close()


# ---- item 6: writable shared mappings of overlay files work (tests/test_guest_shared_map.py); of
# host files (the notebook folder in readwrite mode) the refusal says what and why ---------------

def test_shared_writable_mappings_of_host_files_are_refused_clearly(template, tmp_path) -> None:
    s = Session(template, project_dir=str(tmp_path), files="readwrite", environ={})
    try:
        cases = ["import numpy as np\nnp.memmap('m.dat', dtype='float64', mode='w+', shape=(10,))",
                 "import mmap\nf = open('m2', 'w+b'); f.write(b'x' * 4096); f.flush()\nmmap.mmap(f.fileno(), 4096)",
                 "import sqlite3\ncon = sqlite3.connect('w.db')\ncon.execute('PRAGMA journal_mode=wal')\n"
                 "con.execute('create table t (x)')"]
        for n, code in enumerate(cases, start=1):
            out: list[str] = []
            r = s.execute(code, execution_count=n,
                          on_message=lambda mt, c: out.append("\n".join(c.get("traceback", []))) if mt == "error" else None)
            assert r["status"] == "error", (code, r)
            assert "writable shared file mappings are not supported" in "".join(out), (code, out)
        # copy-on-write and read-only mappings of host files work
        r = cell(s, "m = np.memmap('m.dat', dtype='float64', mode='c', shape=(10,))\nm[:] = 2\nfloat(m.sum())", 9)
        assert r["result"] == "20.0", r
        # the same mappings of overlay files (/tmp) work, with no note
        r = cell(s, "w = np.memmap('/tmp/m.dat', dtype='float64', mode='w+', shape=(10,))\nw[:] = 3\nw.flush()\n"
                    "float(np.fromfile('/tmp/m.dat').sum())", 10)
        assert r["status"] == "ok" and r["result"] == "30.0", r
    finally:
        s.close()


def test_sandbox_files_says_what_is_shown() -> None:
    from zeroboot_kernel import magics as mg
    text = mg.format_files({"directory": "/home/u/course", "notebook": "/home/u/course/notebooks", "mode": "overlay"})
    assert "/home/u/course (overlay" in text and "/home/u/course/notebooks is the working directory" in text
    assert "ZEROBOOT_PROJECT_ROOT" in text
    assert "no host folder" in mg.format_files({})
    assert mg.parse_magic("sandbox", "memory 2G") == mg.SandboxCommand("memory", "2G")
    for bad in ("memory lots", "memory 1K", "memory 2G 3G"):
        with pytest.raises(mg.MagicUsageError):
            mg.parse_magic("sandbox", bad)
