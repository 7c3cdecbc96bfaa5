"""Issue 21: zeroboot-kernel works with the Python the user has, as the user they are.

For each interpreter on the machine (Debian's /usr/bin/python3 and pyenv's 3.11+ builds) a fresh
venv gets the package from a wheel built from the sdist (non-editable, outside the checkout: every
command runs in a scratch folder and the test checks that zeroboot_kernel, zeroboot_guest and the
guest's agent all come from the venv's site-packages), then `zeroboot-kernel install --user` (into
a JUPYTER_DATA_DIR of its own), `zeroboot-kernel run -c` and a short notebook through nbclient run
in it; Debian's venv gets the lowest ipykernel pyproject.toml allows, the others the newest. A `pip
install --user` layout does the same; and a non-root user created here (member of `kvm`, `ulimit -n
1024`) starts from ./setup.sh with Debian's python3 while root runs a notebook, after which both
users run kernels at once from their own templates.

What runs: ZEROBOOT_MATRIX=full (the default when CI=true, as `.ci/run` sets) runs all of it;
=quick (the default elsewhere) only Debian's python3 in a venv, the setup.sh message for a user
without build tools and the /dev/kvm message for a user outside the kvm group; =off skips it. Wall time on a loaded 2-core machine: quick ~4 min, full
~15 min; pip's cache is shared, the wheel is built once, each environment builds its template once.

The non-root part needs root: it adds a `kvm` group if the machine has none and gives it access to
/dev/kvm (root:kvm 0660, what Debian's udev rule sets up), and creates the user `zbmatrix`, whose
home and pip cache are kept between runs. The checkout may live where that user cannot read (/root,
/work, /tmp/pytest-of-root): the tree is copied to a world-readable temporary directory.
"""
from __future__ import annotations

import glob
import grp
import importlib.util
import json
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Iterator

import pytest

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
MODE = os.environ.get("ZEROBOOT_MATRIX") or ("full" if os.environ.get("CI") == "true" else "quick")
USER = "zbmatrix"
TIMINGS = ROOT / "build" / "python-matrix.json"

pytestmark = pytest.mark.skipif(MODE == "off", reason="ZEROBOOT_MATRIX=off")

NOTEBOOK = """
import json, sys, time
import nbformat
from nbclient import NotebookClient

cells = ["import os, sys, numpy as np\\nx = np.arange(10)",
         "print(int(x.sum()), '%d.%d' % sys.version_info[:2], os.uname().nodename, os.getuid(), sys.prefix)",
         "print(sys.modules['_zeroboot_agent'].__file__)"]  # where the guest read its agent from
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
t0 = time.monotonic()
NotebookClient(nb, kernel_name="zeroboot", timeout=300, startup_timeout=600).execute()
print(json.dumps({"text": nb.cells[1].outputs[0]["text"], "agent": nb.cells[2].outputs[0]["text"].strip(),
                  "seconds": time.monotonic() - t0}))
"""


def ipykernel_floor() -> str:
    """The lowest ipykernel pyproject.toml allows (`ipykernel>=X`)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (floor,) = [m.group(1) for d in deps if (m := re.fullmatch(r"ipykernel>=([\d.]+)", d.replace(" ", "")))]
    return floor


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def interpreters() -> list[tuple[str, str]]:
    """(label, path) of each CPython >= 3.11 here: Debian's, then the newest pyenv build per minor."""
    found = []
    if (_version("/usr/bin/python3") or (0, 0)) >= (3, 11):
        found.append(("debian", "/usr/bin/python3"))
    if MODE != "full":
        return found
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    newest: dict[tuple[int, int], tuple[tuple[int, ...], str]] = {}
    for d in glob.glob(os.path.join(pyenv, "versions", "3.*")):
        m = re.fullmatch(r"3\.(\d+)\.(\d+)", os.path.basename(d))
        exe = os.path.join(d, "bin", "python3")
        if m and int(m.group(1)) >= 11 and os.access(exe, os.X_OK):
            minor, patch = int(m.group(1)), int(m.group(2))
            if (3, minor) not in newest or newest[(3, minor)][0] < (patch,):
                newest[(3, minor)] = ((patch,), exe)
    found += [(f"pyenv-3.{minor}", exe) for (_, minor), (_, exe) in sorted(newest.items())]
    return found


def _run(cmd: list[str], *, timeout: float = 1200, **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}"
    return r


def _record(label: str, **numbers: object) -> None:
    TIMINGS.parent.mkdir(exist_ok=True)
    data = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    data[label] = numbers
    TIMINGS.write_text(json.dumps(data, indent=2) + "\n")
    print(f"matrix {label}: {numbers}")


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """A world-readable scratch directory (the non-root user reads the copied tree from it)."""
    base = Path(tempfile.mkdtemp(prefix="zeroboot-matrix-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _copy_tree(dest: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored; no .venv, build outputs, caches)."""
    try:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".xdg", "build", "dist", "__pycache__", ".pytest_cache"}
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and p.suffix not in (".so", ".o")]
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for d in [dest, *[p for p in dest.rglob("*") if p.is_dir()]]:
        d.chmod(0o755)
    return dest


@pytest.fixture(scope="module")
def wheel(work: Path) -> Path:
    """sdist of a copy of the checkout, then one wheel from that sdist (abi3: every interpreter),
    each built the normal way: PEP 517 in an isolated environment with pyproject's build requires."""
    src = _copy_tree(work / "src")
    dist = work / "dist"
    dist.mkdir()
    t0 = time.monotonic()
    source: Path = src
    if importlib.util.find_spec("build"):  # the test extras have it
        _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(src)], cwd=work)
        (source,) = list(dist.glob("*.tar.gz"))
    else:
        log.warning("no `build` module here: building the wheel from the tree, not from an sdist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)], cwd=work)
    (whl,) = dist.glob("zeroboot_kernel-*.whl")
    assert "-abi3-" in whl.name, whl.name
    _record("wheel", seconds=round(time.monotonic() - t0, 1), name=whl.name)
    return whl


def _check_run(stdout: str, version: tuple[int, int]) -> None:
    assert stdout.split() == ["42", f"{version[0]}.{version[1]}"], stdout


def _prefix(python: str, env: dict[str, str] | None = None) -> str:
    """sys.prefix of `python`: the environment a kernel of it must run in."""
    return _run([python, "-c", "import sys; print(sys.prefix)"], env=env, timeout=60).stdout.strip()


def _check_notebook(stdout: str, version: tuple[int, int], prefix: str, agent_dir: Path,
                    guest_uid: int = 1000) -> float:
    result = json.loads(stdout.strip().splitlines()[-1])
    # 45 from numpy, the interpreter's version, the guest's identity (it ran in a sandbox) and the
    # environment: the kernel is the one of the Python under test, not another kernelspec of the
    # same name that Jupyter found first (JUPYTER_PATH, ~/.local/share/jupyter)
    assert result["text"].split() == ["45", f"{version[0]}.{version[1]}", "zeroboot", str(guest_uid), prefix], result
    # and the guest ran the agent of that installation (a wheel's site-packages, a checkout's guest/)
    assert result["agent"] == str(agent_dir / "_zeroboot_agent" / "__init__.py"), result
    return float(result["seconds"])


def _installed(python: str, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Where `python` imports the packages from, its site folders, and the versions it has."""
    code = ("import importlib.metadata as m, json, pathlib, site, sysconfig, ipykernel, zeroboot_guest, zeroboot_kernel; "
            "d = lambda mod: str(pathlib.Path(mod.__file__).resolve().parent); "
            "print(json.dumps({'kernel': d(zeroboot_kernel), 'guest': d(zeroboot_guest), "
            "'purelib': sysconfig.get_path('purelib'), 'usersite': site.getusersitepackages(), "
            "'version': zeroboot_kernel.__version__, 'dist_version': m.version('zeroboot-kernel'), "
            "'ipykernel': ipykernel.__version__}))")
    return json.loads(_run([python, "-c", code], env=env, cwd=cwd, timeout=120).stdout)


def _check_installed_from(site: dict[str, str], where: str) -> None:
    """A non-editable install: both packages in the interpreter's `where` site folder ('purelib' of
    a venv, 'usersite' of pip --user), nothing from the checkout (or its copy), one version."""
    folder = Path(site[where]).resolve()
    for key in ("kernel", "guest"):
        assert Path(site[key]).parent == folder, (key, site)
        assert not Path(site[key]).is_relative_to(ROOT), site
    init = (ROOT / "zeroboot_kernel" / "__init__.py").read_text()
    assert f'__version__ = "{site["version"]}"' in init and site["dist_version"] == site["version"], site


def _exercise(label: str, python: str, command: str, env: dict[str, str], nb_dir: Path, t_install: float,
              install_args: list[str], where: str, *, data_dir: Path | None = None,
              ipykernel: str | None = None) -> None:
    """Install the kernelspecs + template, run -c, and the notebook with the `zeroboot-kernel`
    command of the installation under test, all from a folder outside the checkout (`python -m`
    from the checkout would import the checkout's package); record the timings."""
    version = _version(python)
    assert version is not None
    nb_dir.mkdir()
    site = _installed(python, env, nb_dir)
    _check_installed_from(site, where)
    if ipykernel is not None:
        assert site["ipykernel"] == ipykernel, site
    t0 = time.monotonic()
    out = _run([command, "install", *install_args], env=env, cwd=nb_dir)
    t_template = time.monotonic() - t0
    if data_dir is not None:  # --user: the kernelspec went to the Jupyter data dir, running this Python
        spec = json.loads((data_dir / "kernels" / "zeroboot" / "kernel.json").read_text())
        assert spec["argv"][0] == python, spec
    t0 = time.monotonic()
    r = _run([command, "run", "-c", "import sys, numpy; print(6*7, '%d.%d' % sys.version_info[:2])"], env=env,
             cwd=nb_dir, timeout=600)
    t_run = time.monotonic() - t0
    _check_run(r.stdout, version)
    seconds = _check_notebook(_run([python, "-c", NOTEBOOK], env=env, cwd=nb_dir, timeout=900).stdout, version,
                              _prefix(python, env), Path(site["guest"]))
    built = re.search(r"built in ([\d.]+) s", out.stderr)
    _record(label, python=f"{version[0]}.{version[1]}", install_s=round(t_install, 1),
            template_build_s=float(built.group(1)) if built else None, install_and_template_s=round(t_template, 1),
            run_c_s=round(t_run, 2), notebook_s=round(seconds, 2), ipykernel=site["ipykernel"])


def _root_env(work: Path, label: str) -> dict[str, str]:
    """root's environment for the venv of `label`: the template cache and the Jupyter data dir
    (`install --user` writes the kernelspecs there) of the matrix, not root's own."""
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "root-cache"), "JUPYTER_DATA_DIR": str(work / f"jupyter-{label}")}
    env.pop("JUPYTER_PATH", None)  # the tests' own kernelspecs (kernel_helpers) would run .venv's kernel
    return env


@pytest.mark.parametrize("label,python", interpreters())
def test_venv(label: str, python: str, wheel: Path, work: Path) -> None:
    """The wheel in a fresh venv, the way a user installs it: `pip install zeroboot_kernel-*.whl`,
    `zeroboot-kernel install --user`, a notebook. Debian's venv gets ipykernel's floor."""
    venv = work / f"venv-{label}"
    floor = ipykernel_floor() if label == "debian" else None
    t0 = time.monotonic()
    _run([python, "-m", "venv", str(venv)], cwd=work)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel), "nbclient", "nbformat",
          *([f"ipykernel=={floor}"] if floor else [])], cwd=work)
    env = _root_env(work, label)
    _exercise(label, str(venv / "bin" / "python"), str(venv / "bin" / "zeroboot-kernel"), env, work / f"nb-{label}",
              time.monotonic() - t0, ["--user"], "purelib", data_dir=Path(env["JUPYTER_DATA_DIR"]), ipykernel=floor)


@pytest.mark.skipif(MODE != "full", reason="the full matrix runs with CI=true or ZEROBOOT_MATRIX=full")
def test_pip_install_user_layout(wheel: Path, work: Path) -> None:
    """`pip install --user` into a base interpreter (no venv): PYTHONUSERBASE stands for ~/.local."""
    bases = [exe for label, exe in interpreters() if label.startswith("pyenv")]
    if not bases:
        pytest.skip("no pyenv interpreter to install --user into")
    python = bases[-1]
    userbase = work / "userbase"
    env = {**os.environ, "PYTHONUSERBASE": str(userbase), "XDG_CACHE_HOME": str(work / "root-cache"),
           "JUPYTER_PATH": str(userbase / "share" / "jupyter"), "PIP_BREAK_SYSTEM_PACKAGES": "1"}
    t0 = time.monotonic()
    _run([python, "-m", "pip", "install", "-q", "--user", str(wheel), "nbclient", "nbformat"], env=env, cwd=work)
    _exercise("user-layout-%d.%d" % (_version(python) or (0, 0)), python, str(userbase / "bin" / "zeroboot-kernel"), env,
              work / "nb-user-layout", time.monotonic() - t0, ["--prefix", str(userbase)], "usersite")


# ---- a non-root user ----

def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a test user needs root")
    for tool in ("useradd", "runuser"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")


def _ensure_user() -> pwd.struct_passwd:
    """The user `zbmatrix` in group kvm; /dev/kvm root:kvm 0660 as Debian's udev makes it."""
    try:
        grp.getgrnam("kvm")
    except KeyError:
        _run(["groupadd", "--system", "kvm"])
    st = os.stat("/dev/kvm")
    kvm_gid = grp.getgrnam("kvm").gr_gid
    if st.st_gid != kvm_gid or (st.st_mode & 0o060) != 0o060:
        os.chown("/dev/kvm", -1, kvm_gid)
        os.chmod("/dev/kvm", stat.S_IMODE(st.st_mode) | 0o060)
    try:
        pwd.getpwnam(USER)
        _run(["usermod", "-aG", "kvm", USER])
    except KeyError:
        _run(["useradd", "--create-home", "--shell", "/bin/bash", "--groups", "kvm", USER])
    return pwd.getpwnam(USER)


def _as_user(user: pwd.struct_passwd, script: str, *, cwd: Path, path: str = "/usr/local/bin:/usr/bin:/bin",
             extra_env: dict[str, str] | None = None) -> list[str]:
    """A command running `script` in bash as `user` with a login-like environment (its own HOME and
    caches, Debian's python3 first on PATH, the machine's pip index settings) and ulimit -n 1024."""
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "PATH": path, "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_") and k != "PIP_CACHE_DIR"},
           **(extra_env or {})}
    return ["runuser", "-u", user.pw_name, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
            "bash", "-c", f"ulimit -n 1024 && cd {cwd} && {script}"]


@pytest.fixture(scope="module")
def user_tree(work: Path) -> tuple[pwd.struct_passwd, Path]:
    _need_root()
    user = _ensure_user()
    src = _copy_tree(work / "user-src")
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(src)], check=True)
    # a fresh start: no venv, no templates (the pip cache in its home is kept between runs)
    shutil.rmtree(Path(user.pw_dir) / ".cache" / "zeroboot-kernel", ignore_errors=True)
    return user, src


def test_setup_sh_without_build_tools_says_what_to_install(user_tree: tuple[pwd.struct_passwd, Path],
                                                           work: Path) -> None:
    """A normal user without gcc/objcopy: setup.sh names the Debian packages and the command to ask
    for, and stops before pip (instead of failing inside apt-get)."""
    user, src = user_tree
    bin_dir = work / "bin-without-gcc"
    bin_dir.mkdir(exist_ok=True)
    bin_dir.chmod(0o755)
    for tool in ("bash", "env", "dirname", "id", "stat", "python3", "grep", "cut"):
        found = shutil.which(tool, path="/usr/bin:/bin")
        assert found, tool
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    r = subprocess.run(_as_user(user, "./setup.sh", cwd=src, path=str(bin_dir)), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "missing Debian packages needed to build the engine: build-essential binutils" in r.stderr, r.stderr
    assert "sudo apt-get install build-essential binutils" in r.stderr, r.stderr
    assert not (src / ".venv").exists()


@pytest.mark.skipif(MODE != "full", reason="the full matrix runs with CI=true or ZEROBOOT_MATRIX=full")
def test_non_root_user_from_setup_sh(user_tree: tuple[pwd.struct_passwd, Path], work: Path) -> None:
    """setup.sh as a kvm-group user with Debian's python3 while root runs a notebook; then both
    users run kernels at once, each from the template in their own cache."""
    user, src = user_tree
    debian = "/usr/bin/python3"
    if (_version(debian) or (0, 0)) < (3, 11):
        pytest.skip("no Debian python3 >= 3.11")
    version = _version(debian)
    assert version is not None
    root_venv = work / "venv-debian"
    root_python = str(root_venv / "bin" / "python")
    root_env = _root_env(work, "debian")
    if not root_venv.exists():
        pytest.skip("needs test_venv[debian] (root's kernel next to the user's)")
    root_prefix = _prefix(root_python)
    root_agent = Path(_installed(root_python, root_env, work)["guest"])  # its wheel's site-packages
    root_templates = sorted(p.name for p in (work / "root-cache" / "zeroboot-kernel" / "templates").iterdir())

    t0 = time.monotonic()
    setup = subprocess.Popen(_as_user(user, "./setup.sh", cwd=src), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    # meanwhile (the user's engine build, pip installs and template build) root's kernels keep
    # working from root's own templates
    nb_root = work / "nb-root-during-setup"
    nb_root.mkdir()
    root_notebooks = 0
    while setup.poll() is None and time.monotonic() - t0 < 1500:
        _check_notebook(_run([root_python, "-c", NOTEBOOK], env=root_env, cwd=nb_root, timeout=900).stdout, version,
                        root_prefix, root_agent)
        root_notebooks += 1
        time.sleep(10)
    out, _ = setup.communicate(timeout=1800)
    t_setup = time.monotonic() - t0
    assert setup.returncode == 0, out[-6000:]
    assert "template 'default' ready at" in out, out[-3000:]

    home = Path(user.pw_dir)
    cache = home / ".cache" / "zeroboot-kernel" / "templates"
    st = cache.stat()
    assert st.st_uid == user.pw_uid and stat.S_IMODE(st.st_mode) == 0o700
    assert [p for p in cache.iterdir() if p.name.startswith("default-")]
    assert sorted(p.name for p in (work / "root-cache" / "zeroboot-kernel" / "templates").iterdir()) == root_templates

    # both users at once: the user's notebook and run -c, root's notebook
    nb_user = src / "nb"
    nb_user.mkdir()
    subprocess.run(["chown", f"{user.pw_uid}:{user.pw_gid}", str(nb_user)], check=True)
    user_nb = subprocess.Popen(_as_user(user, f"{src}/.venv/bin/python -c {_sh_quote(NOTEBOOK)}", cwd=nb_user),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root_nb = subprocess.Popen([root_python, "-c", NOTEBOOK], env=root_env, cwd=nb_root, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    user_out, user_err = user_nb.communicate(timeout=900)
    root_out, root_err = root_nb.communicate(timeout=900)
    assert user_nb.returncode == 0, user_err[-4000:]
    assert root_nb.returncode == 0, root_err[-4000:]
    # setup.sh installs editable: the user's guest reads the agent from the checkout's guest/
    seconds = _check_notebook(user_out, version, str(src / ".venv"), (src / "guest").resolve())
    _check_notebook(root_out, version, root_prefix, root_agent)
    r = _run(_as_user(user, ".venv/bin/zeroboot-kernel run -c 'import sys, numpy; print(6*7, \"%d.%d\" % sys.version_info[:2])'",
                      cwd=src), timeout=600)
    _check_run(r.stdout, version)
    built = re.search(r"built in ([\d.]+) s", out)
    assert root_notebooks >= 1
    _record("non-root-debian", python=f"{version[0]}.{version[1]}", setup_sh_s=round(t_setup, 1),
            root_notebooks_during_setup=root_notebooks,
            template_build_s=float(built.group(1)) if built else None, notebook_s=round(seconds, 2))


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def test_user_outside_the_kvm_group_is_told_what_to_do(work: Path) -> None:
    """`nobody` (not in kvm) running zeroboot-kernel from root's Debian venv: a clear message naming
    the kvm group, not a crash or a traceback."""
    _need_root()
    _ensure_user()  # /dev/kvm root:kvm 0660, so nobody cannot open it
    python = work / "venv-debian" / "bin" / "python"  # root's own interpreter may be unreadable (/root)
    if not python.exists():
        pytest.skip("needs test_venv[debian]")
    nobody = pwd.getpwnam("nobody")
    r = subprocess.run(_as_user(nobody, f"{python} -m zeroboot_kernel run -c 'print(1)'", cwd=work,
                                extra_env={"XDG_CACHE_HOME": str(work / "nobody-cache")}),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "permission denied opening /dev/kvm: add your user to the 'kvm' group" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
