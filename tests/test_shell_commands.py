"""Shell commands in cells (issue 15): `!cmd`, `x = !cmd`, `%%bash`, `os.system` and `subprocess` run
as guest processes (a fork of the sandbox that execs the system view's /bin/sh), their output
streams into the cell as under ipykernel (`!cmd` on a pseudo-terminal through IPython's own
pexpect-based `system`, with a terminal's line ends), and an interrupt stops them."""
from __future__ import annotations

import threading

import pytest

from session_helpers import cell, ok
from zeroboot_kernel import fanout
from zeroboot_kernel.session import Session

LISTED = ["alpha.txt", "bravo.csv", "charlie", "delta.py", "echo.json", "foxtrot.md"]


@pytest.fixture
def s(template, tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n3,4\n")
    session = Session(template, project_dir=str(tmp_path), environ={})
    yield session
    session.close()


def test_bang_commands_print_as_under_ipykernel(s: Session) -> None:
    assert ok(cell(s, "!echo hi; echo to-stderr >&2", 1)) == "hi\r\nto-stderr\r\n"
    assert ok(cell(s, "!wc -l < data.csv", 2)) == "3\r\n"
    assert ok(cell(s, "!seq 1 100000 | sort -n | tail -1", 3)) == "100000\r\n"
    assert ok(cell(s, "name = 'data.csv'\n!grep -c , $name", 4)) == "3\r\n"  # IPython's $var expansion
    assert ok(cell(s, "!exit 3\nprint(_exit_code)", 5)) == "3\n"
    assert cell(s, "lines = !cat data.csv\nlines", 6)["result"] == "['a,b', '1,2', '3,4']"


def test_bang_commands_run_on_a_terminal_as_under_ipykernel(s: Session, tmp_path) -> None:
    """IPython's system runs the command on a pty (pexpect, 80 columns): ls prints columns, the
    command's stdout is a terminal, a carriage return is the command's own, the exit code is kept."""
    listing = tmp_path / "listing"
    listing.mkdir()
    for name in LISTED:
        (listing / name).write_text("x")
    assert ok(cell(s, "!ls listing", 1)) == "  ".join(LISTED) + "\r\n"  # one row of columns
    assert ok(cell(s, "!python3 -c 'import sys; print(sys.stdout.isatty(), sys.stdin.isatty())'", 2)) == "True True\r\n"
    assert ok(cell(s, "!printf 'a\\rb\\n'", 3)) == "a\rb\r\n"
    assert ok(cell(s, "!stty size", 4)) == "24 80\r\n"  # pexpect's window size
    assert ok(cell(s, "!false\nprint(_exit_code)", 5)) == "1\n"
    assert ok(cell(s, "!kill -TERM $$\nprint(_exit_code)", 6)) == "-15\n"  # killed by a signal: minus it
    r = cell(s, "!sleep 1 &", 7)
    assert r["status"] == "error" and r["ename"] == "OSError", r  # as ipykernel: no background `!cmd`
    assert ok(cell(s, "%%sh\ntest -t 1 && echo terminal || echo pipe", 8)) == "pipe\n"  # %%sh: pipes, as ipykernel


def test_a_commands_terminal_has_its_name_as_under_ipykernel(s: Session) -> None:
    """The pty `!cmd` runs on is /dev/pts/N (tty, os.ttyname through the /dev/pts listing), a name
    the guest can open and stat; a cell's own Python sees the entries of the ptys it opens."""
    tty = ok(cell(s, "!tty", 1))
    assert tty.startswith("/dev/pts/") and tty[len("/dev/pts/"):-2].isdigit() and tty.endswith("\r\n"), tty
    code = "!python3 -c 'import os; n = os.ttyname(0); print(n[:9], os.stat(n).st_rdev == os.fstat(0).st_rdev, n in os.popen(\"tty\").read())'"
    assert ok(cell(s, code, 2)) == "/dev/pts/ True True\r\n"
    code = ("m, t = os.openpty()\nname = os.ttyname(t)\nfd = os.open(name, os.O_RDWR | os.O_NOCTTY)\n"
            "os.write(m, b'ping\\n')\nprint(name[:9], os.read(fd, 10), os.ttyname(m), os.path.basename(name) in os.listdir('/dev/pts'))\n"
            "os.close(m); print(os.path.exists(name)); os.close(t); os.close(fd)")
    assert ok(cell(s, "import os\n" + code, 3)) == "/dev/pts/ b'ping\\n' /dev/ptmx True\nFalse\n"


def test_bash_cell_streams_a_slow_loop(s: Session) -> None:
    """%%bash (IPython's script magic, on pipes as under ipykernel): each line reaches the host as
    it is printed: the loop waits for the host to have seen the previous line before printing the next."""
    out: list[str] = []
    seen = threading.Condition()

    def on_stream(name: str, text: str) -> None:
        with seen:
            out.append(text)
            seen.notify_all()

    # the loop prints i, then waits until the file `ack_i` exists, which the host writes once
    # it has received line i: without streaming, the cell could never end.
    code = "%%bash\nfor i in 1 2 3; do echo line $i; while [ ! -e ack_$i ]; do sleep 0.05; done; done; echo done"
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(
        s.execute(code, execution_count=1, on_stream=on_stream)), daemon=True)
    runner.start()
    project = s.project_dir
    for i in (1, 2, 3):
        with seen:
            assert seen.wait_for(lambda: f"line {i}" in "".join(out), timeout=120), out
        open(f"{project}/ack_{i}", "w").close()
    runner.join(120)
    assert result.get("status") == "ok", result
    assert "".join(out) == "line 1\nline 2\nline 3\ndone\n"


def test_bang_commands_in_isolated_mode_and_in_fanout(s: Session) -> None:
    s.set_mode("isolated")
    assert ok(cell(s, "!echo isolated; test -t 1 && echo tty", 1)) == "isolated\r\ntty\r\n"
    assert ok(cell(s, "!false\nprint(_exit_code)", 2)) == "1\n"
    s.set_mode("chained")
    out: list[str] = []
    reply = fanout.run(s, "%%fanout v in [1, 2]\n!echo value $v; test -t 1 && echo tty", execution_count=3,
                       on_stream=lambda name, t: out.append(t), on_message=lambda mt, c: None)
    assert reply["status"] == "ok", reply
    text = "".join(out)
    assert "value 1\r\ntty\r\n" in text and "value 2\r\ntty\r\n" in text, text


def test_os_system_and_subprocess(s: Session) -> None:
    assert cell(s, "import os\nos.system('exit 5') >> 8", 1)["result"] == "5"
    assert cell(s, "import subprocess\nsubprocess.run(['sh', '-c', 'echo $((6*7))'], capture_output=True, "
                   "text=True, check=True).stdout", 2)["result"] == "'42\\n'"
    r = cell(s, "subprocess.run(['false'], check=True)", 3)
    assert r["status"] == "error" and r["ename"] == "CalledProcessError", r
    assert cell(s, "subprocess.check_output(['ls', '.'], text=True)", 4)["result"] == "'data.csv\\n'"


def test_a_popen_kept_across_cells(s: Session) -> None:
    ok(cell(s, "import subprocess\np = subprocess.Popen(['cat'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)", 1))
    assert cell(s, "p.communicate(b'through cat')", 2)["result"] == "(b'through cat', None)"
    assert cell(s, "p.returncode", 3)["result"] == "0"


def interrupted_once_started(s: Session, code: str) -> tuple[dict, str]:
    """Run code, interrupting it once "started" reached the host: (its reply, its stream text)."""
    started = threading.Event()
    out: list[str] = []

    def on_stream(name: str, text: str) -> None:
        out.append(text)
        if "started" in "".join(out):
            started.set()

    def interrupt_when_started() -> None:
        if started.wait(60):
            s.sandbox.interrupt()

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    reply = s.execute(code, execution_count=1, on_stream=on_stream)
    assert started.is_set(), (reply, out)
    return reply, "".join(out)


@pytest.mark.parametrize("code, exit_check", [
    ("!echo started; sleep 100", "_exit_code"),
    ("%%bash\necho started\nsleep 100", None),
])
def test_output_streams_and_an_interrupt_stops_the_command(s: Session, code: str, exit_check: str | None) -> None:
    """The first line reaches the host while the command still runs (it cannot end by itself before
    the cell's timeout): that is streaming; the interrupt sent then stops it and the cell ends."""
    reply, text = interrupted_once_started(s, code)
    assert "started" in text, (reply, text)
    if exit_check:  # IPython's system: the interrupt stops the command, the cell ends normally
        assert reply["status"] == "ok", reply
        assert cell(s, exit_check, 2)["result"] == "-2"
    else:  # the %%bash magic reports the interrupt as ipykernel's does (no error either)
        assert reply["status"] in ("ok", "error"), reply
    assert ok(cell(s, "print('alive')", 3)) == "alive\n"


def test_an_interrupt_is_ctrl_c_on_the_commands_terminal(s: Session) -> None:
    """As under ipykernel, the interrupt makes IPython write ^C to the pty: the line discipline echoes
    it and sends SIGINT to the command's foreground process group, whose shell runs its trap."""
    reply, text = interrupted_once_started(s, "!trap 'echo got-int; exit 7' INT; echo started; while :; do sleep 0.1; done")
    assert reply["status"] == "ok", reply
    assert text == "started\r\n^C\r\ngot-int\r\n", text
    assert cell(s, "_exit_code", 2)["result"] == "7"


def test_a_command_ignoring_ctrl_c_is_terminated_with_its_group(s: Session) -> None:
    """^C is ignored, so IPython terminates the shell (SIGHUP, or SIGKILL if it is slow to go); the
    shell led the terminal's session, so its exit hangs up the foreground group as on Linux: the
    `sleep 100` it started goes too, no process is left (the next cell has its checkpoint, no note)."""
    reply, text = interrupted_once_started(s, "!trap '' INT; echo started; sleep 100")
    assert reply["status"] == "ok", reply
    assert text == "started\r\n^C\r\n", text
    r = cell(s, "_exit_code", 2)
    assert r["result"] in ("-1", "-9") and r["stdout"] == "", r  # a process left would be noted here


def test_files_a_command_writes_are_the_notebooks(s: Session) -> None:
    """One file system for the sandbox's processes, as one mount namespace on Linux: what `!cmd`
    or a child writes (the notebook folder, /tmp) is there for the notebook, and the other way."""
    ok(cell(s, "!echo from-sh > made.txt; mkdir -p /tmp/d && printf 'x,y\\n1,2\\n' > /tmp/d/t.csv", 1))
    assert cell(s, "open('made.txt').read()", 2)["result"] == "'from-sh\\n'"
    assert cell(s, "import pandas as pd\npd.read_csv('/tmp/d/t.csv').values.tolist()", 3)["result"] == "[[1, 2]]"
    ok(cell(s, "open('/tmp/from_py', 'w').write('from python')", 4))
    assert ok(cell(s, "!cat /tmp/from_py; rm /tmp/from_py", 5)) == "from python"
    assert cell(s, "import os\nos.path.exists('/tmp/from_py')", 6)["result"] == "False"


def test_a_forked_child_shares_open_files_and_their_offsets(s: Session) -> None:
    out = ok(cell(s, "import os\n"
                     "f = open('/tmp/shared.txt', 'w+b', buffering=0)\n"
                     "f.write(b'parent;')\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    f.write(b'child;')  # the same open file description: the same offset\n"
                     "    os._exit(0)\n"
                     "os.waitpid(pid, 0)\n"
                     "f.write(b'parent again')\n"
                     "os.unlink('/tmp/shared.txt')  # unlinked while open: it lives on\n"
                     "f.seek(0)\n"
                     "print(f.read(), os.path.exists('/tmp/shared.txt'))\n"
                     "f.close()", 1))
    assert out == "b'parent;child;parent again' False\n", out
