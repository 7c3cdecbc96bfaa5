"""The guest's view of the Python installation (issue 21): every loader, library and symlink chain
the interpreter resolves through is in the guest exactly as on the host."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zeroboot_kernel import elf_deps
from zeroboot_kernel.guest_view import python_spec, python_view
from zeroboot_kernel.runner import run_to_completion


def _guest_json(code: str, extra_view: list[str] | None = None) -> object:
    out, err = io.BytesIO(), io.BytesIO()
    status = run_to_completion(python_spec(["-c", code], extra_view=extra_view), timeout=300, stdout=out, stderr=err)
    assert status == 0, err.getvalue().decode()[-3000:]
    return json.loads(out.getvalue().decode().split("RESULT=", 1)[1])


def _chain(path: str) -> list[str]:
    """Every symlink met while resolving `path`, with its target, in order (like namei)."""
    seen: list[str] = []
    todo = path
    for _ in range(40):
        parts = todo.split("/")
        for i in range(2, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if os.path.islink(prefix):
                target = os.readlink(prefix)
                seen.append(f"{prefix} -> {target}")
                base = os.path.dirname(prefix)
                todo = os.path.normpath(os.path.join(base, target, *parts[i:]))
                break
        else:
            return seen
    return seen


CHAIN_SRC = _chain.__doc__ and __import__("inspect").getsource(_chain)


def test_every_view_path_resolves_in_the_guest_as_on_the_host() -> None:
    """Each path of the view (loader, libraries by the names ld.so uses, the interpreter as
    sys.executable spells it, the stdlib, site-packages): exists in the guest, resolves to the
    same file, through the same symlinks."""
    paths = sorted(set(python_view()) | {sys.executable})
    host = {p: [os.path.realpath(p), _chain(p)] for p in paths}
    code = ("import json, os\n" + CHAIN_SRC + "\n"
            f"paths = {paths!r}\n"
            "print('RESULT=' + json.dumps({p: [os.path.realpath(p), _chain(p)] if os.path.exists(p) else None "
            "for p in paths}))\n")
    guest = _guest_json(code)
    assert isinstance(guest, dict)
    missing = [p for p in paths if guest[p] is None]
    assert not missing
    differ = {p: (host[p], guest[p]) for p in paths if guest[p] != host[p]}
    assert not differ


@pytest.mark.without_kvm  # the view is computed on the host
def test_loader_and_libraries_are_named_as_the_loader_names_them() -> None:
    """The ELF interpreter of sys.executable is in the view by its PT_INTERP string (on merged-/usr
    Debian /lib64/ld-linux-x86-64.so.2, through two symlinks), and every library the closure found
    by its unresolved path."""
    info = elf_deps.read_elf(os.path.realpath(sys.executable))
    assert info is not None and info.interp
    assert info.interp in python_view()
    libs, _ = elf_deps.library_closure([], programs=[sys.executable])
    assert info.interp in libs
    assert all(p in python_view() for p in libs)


def test_libraries_found_through_ld_so_cache_load_in_the_guest() -> None:
    """A library the interpreter's extension modules need, opened by soname in the guest: ld.so
    finds it through the guest's /etc/ld.so.cache and the path that cache names."""
    code = ("import ctypes, json, zlib, ssl, sqlite3\n"
            "ctypes.CDLL('libz.so.1'); ctypes.CDLL('libm.so.6')\n"
            "print('RESULT=' + json.dumps([zlib.decompress(zlib.compress(b'ok')).decode(), "
            "sqlite3.connect(':memory:').execute('select 6*7').fetchone()[0]]))\n")
    assert _guest_json(code) == ["ok", 42]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_origin_rpath_through_a_symlinked_directory(tmp_path: Path) -> None:
    """$ORIGIN is the directory of the path an object was opened by (glibc does not resolve
    symlinks for it): an extension reached through a symlinked directory finds its library there,
    and the view holds that spelled path, so the guest loads it the same way."""
    real = tmp_path / "real"
    (real / "lib").mkdir(parents=True)
    (real / "mod").mkdir()
    (tmp_path / "b.c").write_text("int forty_two(void) { return 42; }\n")
    (tmp_path / "a.c").write_text("int forty_two(void); int answer(void) { return forty_two(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(real / "lib" / "libzbtestb.so"), str(tmp_path / "b.c")],
                   check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(real / "mod" / "libzbtesta.so"), str(tmp_path / "a.c"),
                    f"-L{real / 'lib'}", "-lzbtestb", "-Wl,-rpath,$ORIGIN/../lib"], check=True)
    (tmp_path / "link").symlink_to("real")
    module = str(tmp_path / "link" / "mod" / "libzbtesta.so")
    libs, missing = elf_deps.library_closure([module])
    assert not missing
    assert str(tmp_path / "link" / "mod" / ".." / "lib" / "libzbtestb.so") in libs
    code = (f"import ctypes, json\nprint('RESULT=' + json.dumps(ctypes.CDLL({module!r}).answer()))\n")
    assert _guest_json(code, extra_view=[module, *sorted(libs)]) == 42
