"""The kernel process's own host writes (%sandbox export, export.write) land only inside the
notebook's folder: host symlinks placed in the folder, '..', absolute names, names with control
characters, hard links, and symlinks swapped in while an export runs (issue 11, "also required").
No VM needed: the plan and the file data are what a hostile engine reply could hold."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from zeroboot_kernel import export, listing
from zeroboot_kernel.export import ExportError, PlanEntry

pytestmark = pytest.mark.without_kvm  # plans and chunks as a hostile engine could send them


def reader(files: dict[tuple[str, ...], bytes], hook=None):
    def read(parts: tuple[str, ...], offset: int, size: int) -> bytes:
        if hook:
            hook(parts, offset)
        return files[parts][offset:offset + size]
    return read


@pytest.fixture
def folder(tmp_path: Path):
    """The notebook's folder, and a file outside it that nothing may change."""
    nb = tmp_path / "nb"
    nb.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("original")
    return nb, outside


def tree() -> tuple[list[PlanEntry], dict[tuple[str, ...], bytes]]:
    entries = [PlanEntry((), "d"), PlanEntry(("a.txt",), "f", 5), PlanEntry(("sub",), "d"),
               PlanEntry(("sub", "b.txt"), "f", 3)]
    return entries, {("a.txt",): b"hello", ("sub", "b.txt"): b"bye"}


def unchanged(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "original"


def test_a_tree_is_written_inside_the_folder(folder):
    nb, outside = folder
    entries, files = tree()
    report = export.write(entries, reader(files), "out", str(nb))
    assert (nb / "out" / "a.txt").read_bytes() == b"hello"
    assert (nb / "out" / "sub" / "b.txt").read_bytes() == b"bye"
    assert len(report.written) == 2 and report.bytes == 8
    assert not [p for p in nb.rglob(".zb-export-*")]  # no temporary file left


@pytest.mark.parametrize("dest", ["../outside/x", "/etc/zeroboot-x", "sub/../../outside/x", ".", "", "/"])
def test_a_destination_outside_the_folder_is_refused(folder, dest):
    nb, outside = folder
    entries, files = tree()
    with pytest.raises(ExportError):
        export.write(entries, reader(files), dest, str(nb))
    unchanged(outside)


def test_an_absolute_destination_inside_the_folder_is_allowed(folder):
    nb, _ = folder
    entries, files = tree()
    export.write(entries, reader(files), str(nb / "abs"), str(nb))
    assert (nb / "abs" / "a.txt").read_bytes() == b"hello"


def test_a_host_symlink_as_the_destination_is_not_followed(folder):
    nb, outside = folder
    os.symlink(outside, nb / "out")
    entries, files = tree()
    with pytest.raises(ExportError):
        export.write(entries, reader(files), "out", str(nb))
    unchanged(outside)


def test_a_host_symlink_on_the_way_to_the_destination_is_not_followed(folder):
    nb, outside = folder
    os.symlink(outside, nb / "link")
    entries, files = tree()
    with pytest.raises(ExportError):
        export.write(entries, reader(files), "link/out", str(nb))
    unchanged(outside)


def test_host_symlinks_inside_the_destination_are_not_followed(folder):
    nb, outside = folder
    (nb / "out").mkdir()
    os.symlink(outside / "victim.txt", nb / "out" / "a.txt")
    entries, files = tree()
    with pytest.raises(ExportError, match="symlink"):
        export.write(entries, reader(files), "out", str(nb))
    unchanged(outside)
    (nb / "out" / "a.txt").unlink()
    os.symlink(outside, nb / "out" / "sub")
    with pytest.raises(ExportError):
        export.write(entries, reader(files), "out", str(nb))
    unchanged(outside)


def test_a_hard_link_in_the_folder_is_replaced_not_written_through(folder):
    nb, outside = folder
    (nb / "out").mkdir()
    os.link(outside / "victim.txt", nb / "out" / "a.txt")
    entries, files = tree()
    export.write(entries, reader(files), "out", str(nb))
    assert (nb / "out" / "a.txt").read_bytes() == b"hello"
    unchanged(outside)


@pytest.mark.parametrize("parts", [["..", "x"], ["a/b"], ["/etc"], ["."], [""], ["a\x00b"],
                                   ["sub", ".."], ["x" * 256]])
def test_plans_with_unusable_names_are_refused(parts):
    rows = [{"parts": [], "kind": "d", "size": 0}]
    for i in range(1, len(parts)):
        rows.append({"parts": parts[:i], "kind": "d", "size": 0})
    rows.append({"parts": parts, "kind": "f", "size": 1})
    with pytest.raises((ExportError, listing.ListingError)):
        export.plan_from_wire(rows)


@pytest.mark.parametrize("rows", [
    None, [], {"parts": []}, [{"parts": [], "kind": "l", "size": 0}],
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a", "b"], "kind": "f", "size": 1}],  # no parent
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a"], "kind": "f", "size": 1},
     {"parts": ["a", "b"], "kind": "f", "size": 1}],                                          # parent is a file
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a"], "kind": "f", "size": 1},
     {"parts": ["a"], "kind": "f", "size": 1}],                                               # duplicate
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a"], "kind": "f", "size": -1}],
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a"], "kind": "f", "size": 3 << 30}],
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a"], "kind": "f", "size": 1.5}],
    [{"parts": [], "kind": "d", "size": 0}, {"parts": ["a"], "kind": "f", "size": True}],
    [{"parts": [], "kind": "d", "size": 0}, {"parts": "a", "kind": "f", "size": 1}],
])
def test_malformed_plans_are_refused(rows):
    with pytest.raises(ExportError):
        export.plan_from_wire(rows)


def test_names_with_control_characters_are_not_created(folder):
    nb, outside = folder
    entries = [PlanEntry((), "d"), PlanEntry(("\nd\t..",), "f", 1), PlanEntry(("\x1b[31mred",), "d"),
               PlanEntry(("\x1b[31mred", "x"), "f", 1), PlanEntry(("ok\u202etxt.exe",), "f", 1),
               PlanEntry(("fine",), "f", 1)]
    files = {e.parts: b"x" for e in entries}
    report = export.write(entries, reader(files), "out", str(nb))
    assert sorted(p.name for p in (nb / "out").iterdir()) == ["fine"]
    assert len(report.skipped) == 3
    text = export.format_report("out", report)
    assert "\x1b" not in text and "\u202e" not in text and "\\n" in text


def test_symlinks_and_special_files_in_the_plan_are_reported_not_created(folder):
    nb, _ = folder
    entries = [PlanEntry((), "d"), PlanEntry(("S",), "l"), PlanEntry(("fifo",), "o"), PlanEntry(("f",), "f", 1)]
    report = export.write(entries, reader({("f",): b"1"}), "out", str(nb))
    assert sorted(p.name for p in (nb / "out").iterdir()) == ["f"]
    assert [s.split(" ")[0] for s in report.skipped] == ["out/S", "out/fifo"]


def test_a_symlink_swapped_in_for_the_target_while_writing_is_not_followed(folder):
    nb, outside = folder
    entries = [PlanEntry((), "d"), PlanEntry(("big",), "f", 3 * export.CHUNK)]
    data = {("big",): b"z" * (3 * export.CHUNK)}

    def swap(parts, offset):  # between two chunks, the target name becomes a symlink out
        target = nb / "out" / "big"
        if offset == export.CHUNK and not target.is_symlink():
            os.symlink(outside / "victim.txt", target)

    export.write(entries, reader(data, swap), "out", str(nb))
    unchanged(outside)
    assert (nb / "out" / "big").read_bytes() == data[("big",)]  # the symlink name was replaced


def test_a_directory_swapped_for_a_symlink_during_an_export_is_not_followed(folder):
    nb, outside = folder
    entries = [PlanEntry((), "d"), PlanEntry(("a.txt",), "f", 5), PlanEntry(("sub",), "d"),
               PlanEntry(("sub", "b.txt"), "f", 3)]
    files = {("a.txt",): b"hello", ("sub", "b.txt"): b"bye"}
    entries = [entries[0], entries[2], entries[1], entries[3]]  # sub exists before a.txt is read

    def swap(parts, offset):
        sub = nb / "out" / "sub"
        if parts == ("a.txt",) and not sub.is_symlink():
            sub.rmdir()
            os.symlink(outside, sub)

    with pytest.raises(ExportError):
        export.write(entries, reader(files, swap), "out", str(nb))
    unchanged(outside)


def test_the_folder_itself_swapped_for_a_symlink_is_not_followed(folder):
    """Only the destination's parents inside the folder are walked; the folder is opened once."""
    nb, outside = folder
    (nb / "d").mkdir()
    entries, files = tree()

    def swap(parts, offset):
        if not (nb / "d").is_symlink():
            os.rename(nb / "d", nb / "d-moved")
            os.symlink(outside, nb / "d")

    export.write(entries, reader(files, swap), "d/out", str(nb))
    unchanged(outside)
    assert (nb / "d-moved" / "out" / "a.txt").read_bytes() == b"hello"  # the directory that was opened


def test_chunks_larger_than_asked_are_refused():
    import base64
    with pytest.raises(ExportError):
        export.chunk_from_wire({"data": base64.b64encode(b"xx").decode()}, 1)
    with pytest.raises(ExportError):
        export.chunk_from_wire({"data": "not base64!"}, 10)
    with pytest.raises(ExportError):
        export.chunk_from_wire([], 10)


def test_the_kernel_writes_below_the_folder_it_opened_at_start(folder):
    """The kernel opens the notebook's folder once; a symlink put at the folder's path later
    (the folder moved away) does not redirect an export."""
    nb, outside = folder
    fd = os.open(nb, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.rename(nb, nb.parent / "nb-moved")
        os.symlink(outside, nb)
        entries, files = tree()
        export.write(entries, reader(files), "out", str(nb), fd)
    finally:
        os.close(fd)
    unchanged(outside)
    assert (nb.parent / "nb-moved" / "out" / "a.txt").read_bytes() == b"hello"
