"""The battery of notebook idioms of the differential test (tests/test_compat_differential.py).

Each cell runs, in this order and in one session, under the stock `python3` kernel and under
`zeroboot`, both started in the same notebook folder (NOTEBOOK below, inside a small project) with
the same environment (ENV). A cell's id is the row of docs/COMPATIBILITY.md that reports it.

`compare` says what must match:
  "text"     outcome (status, ename), MIME types in order, normalised output text and payloads
  "outcome"  outcome, MIME types and payload sources only (output legitimately varies: profiles,
             histories, timings that normalisation cannot tame)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    id: str
    code: str
    compare: str = "text"
    stdin: str | None = None   # the answer to an input() request


# The environment both kernels get (the kernelspec's env). ZEROBOOT_CHECKPOINT_SPILL_BEHIND=wait:
# under the default (drop) the spill writer's timing decides whether a checkpoint of the big
# allocation cells is dropped, and so whether a later cell says so on stderr; waiting makes the
# battery's outputs the same in every run (the default is tested in tests/test_checkpoint_spill.py).
ENV = {"MY_NOTEBOOK_VAR": "hello", "OPENBLAS_CORETYPE": "Haswell", "LANG": "C.UTF-8",
       "ZEROBOOT_CHECKPOINT_SPILL_BEHIND": "wait",
       "SHELL": "/bin/bash"}  # a bash user's `!cmd` (IPython runs `$SHELL -c cmd`)

# The project the notebook lives in: {relative path: content}; the notebook folder is "notebooks".
PROJECT = {
    "pyproject.toml": "[project]\nname = 'course'\n",
    "data/x.csv": "a,b\n1,2\n3,4\n",
    **{f"data/listing/{name}": "x\n" for name in ("alpha.txt", "bravo.csv", "charlie", "delta.py", "echo.json",
                                                  "foxtrot.md", "golf", "hotel.txt", "india_long_name.py")},
    "src/__init__.py": "",
    "src/features.py": "def double(x):\n    return 2 * x\n",
    "notebooks/helper.py": "ANSWER = 42\n",
    "notebooks/pkg/__init__.py": "NAME = 'pkg'\n",
    "notebooks/agent.py": "MINE = 'user agent module'\n",
}
NOTEBOOK = "notebooks"

CELLS: list[Cell] = [
    # item 1: local imports
    Cell("import-local-module", "import helper, pkg\n(helper.ANSWER, pkg.NAME)"),
    Cell("import-user-agent-module", "import agent\nagent.MINE"),
    Cell("sys-path-head", "import sys, os\n(os.path.basename(sys.path[sys.path.index('') + 1]), os.getcwd() in sys.path)"),
    Cell("import-written-module", "with open('fresh_mod.py', 'w') as f:\n    f.write('V = 7\\n')\nimport fresh_mod\nfresh_mod.V"),
    Cell("autoreload", "%load_ext autoreload\n%autoreload 2\nimport time\ntime.sleep(1.1)\n"
                       "with open('helper.py', 'w') as f:\n    f.write('ANSWER = 43\\n')"),
    Cell("autoreload-read", "helper.ANSWER"),
    Cell("import-from-project", "sys.path.insert(0, '..')\nfrom src.features import double\ndouble(21)"),
    # item 2: directory times
    Cell("dir-mtime-overlay", "import os, time\nbefore = os.stat('.').st_mtime_ns\ntime.sleep(0.05)\n"
                              "open('new_file.txt', 'w').close()\nos.stat('.').st_mtime_ns > before"),
    Cell("dir-mtime-tmp", "import tempfile\nd = tempfile.mkdtemp()\nbefore = os.stat(d).st_mtime_ns\n"
                          "time.sleep(0.05)\nopen(os.path.join(d, 'f'), 'w').close()\nos.stat(d).st_mtime_ns > before"),
    Cell("dir-mtime-rename-delete", "def changed(op, d):\n    before = os.stat(d).st_mtime_ns, os.stat(d).st_ctime_ns\n"
                                    "    time.sleep(0.05)\n    op()\n    after = os.stat(d).st_mtime_ns, os.stat(d).st_ctime_ns\n"
                                    "    return after[0] > before[0] and after[1] > before[1]\n"
                                    "open(os.path.join(d, 'g'), 'w').close()\n"
                                    "(changed(lambda: os.rename(os.path.join(d, 'g'), os.path.join(d, 'h')), d),\n"
                                    " changed(lambda: os.unlink(os.path.join(d, 'h')), d),\n"
                                    " changed(lambda: os.mkdir('sub_dir'), '.'), changed(lambda: os.rmdir('sub_dir'), '.'))"),
    # item 3: environment
    Cell("env-var", "os.environ.get('MY_NOTEBOOK_VAR')"),
    Cell("env-magic", "%env MY_NOTEBOOK_VAR"),
    Cell("openblas-det", "import numpy as np\nrng = np.random.default_rng(0)\nm = rng.random((50, 50))\nrepr(np.linalg.det(m))"),
    # resource limits: the deep-recursion idiom raises the stack's
    Cell("rlimit-stack-raise", "import resource\n"
                               "resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
                               "resource.getrlimit(resource.RLIMIT_STACK)"),
    # item 4: CPU times
    Cell("getrusage", "import resource\nsum(range(3_000_000))\nr = resource.getrusage(resource.RUSAGE_SELF)\n"
                      "(r.ru_utime > 0, r.ru_maxrss > 0)"),
    Cell("os-times", "t = os.times()\n(t.user > 0, t.children_user)"),
    Cell("time-magic", "%time sum(range(100_000))"),
    Cell("cwd-access", "import os\nos.access('.', os.W_OK), os.access('.', os.R_OK | os.X_OK)"),
    # a sleep is no CPU time (bounds at half the sleep: a loaded host deschedules the engine too)
    Cell("sleep-cpu-time", "import time, resource\nr0 = resource.getrusage(resource.RUSAGE_SELF)\np0 = time.process_time()\n"
                           "time.sleep(0.5)\nr1 = resource.getrusage(resource.RUSAGE_SELF)\n"
                           "(r1.ru_stime - r0.ru_stime < 0.25, time.process_time() - p0 < 0.25)"),
    Cell("timeit-magic", "%timeit -n1 -r1 sum(range(100))"),
    # item 5: /proc
    Cell("proc-self-maps", "sorted(p for p in ('/proc/self/maps', '/proc/self/status', '/proc/self/statm', "
                           "'/proc/meminfo', '/proc/cpuinfo', '/proc/self/cgroup', '/proc/self/smaps_rollup') "
                           "if os.path.exists(p))"),
    # item 6: shared writable file mappings
    Cell("memmap-w+", "mm = np.memmap('mm.dat', dtype='float64', mode='w+', shape=(100,))\nmm[:] = 1.5\nmm.flush()\n"
                      "del mm\nrp = np.memmap('mm.dat', dtype='float64', mode='r+', shape=(100,))\nrp[:10] = 3\n"
                      "(float(np.fromfile('mm.dat').sum()), float(rp.sum()))"),
    Cell("memmap-copy-on-write", "mc = np.memmap('mm.dat', dtype='float64', mode='c', shape=(100,))\nmc[:] = 2\n"
                                 "(float(mc.sum()), float(np.fromfile('mm.dat').sum()) != 200.0)"),
    Cell("sqlite-wal", "import sqlite3\ncon = sqlite3.connect('wal.db')\nmode = con.execute('PRAGMA journal_mode=wal').fetchone()[0]\n"
                       "con.execute('create table if not exists t (x)')\n"
                       "con.executemany('insert into t values (?)', [(i,) for i in range(100)])\n"
                       "con.commit()\n(mode, con.execute('select count(*), sum(x) from t').fetchone())"),
    # items 7 and 11: memory
    Cell("alloc-2gib", "a = np.zeros(2**28)\na[::4096] = 1\nint(a.sum())"),
    Cell("alloc-610mb", "a = None\nbig = [np.ones(10_000_000) for _ in range(8)]\nlen(big)"),
    Cell("alloc-free", "big = None\n'freed'"),
    # item 8: locale
    Cell("locale", "import locale\nlocale.setlocale(locale.LC_ALL, '')\nlocale.getlocale()"),
    # item 9: small differences
    Cell("store-magic", "stored_value = 5\n%store stored_value"),
    Cell("writefile", "%%writefile script_run.py\nscript_x = 5\nprint('ran')\n"),
    Cell("run-script", "%run script_run.py\nscript_x"),
    Cell("print-array", "print(np.arange(12).reshape(3, 4))"),
    Cell("warning-filename", "import warnings\nwarnings.warn('careful')"),
    Cell("traceback", "def failing():\n    return 1 / 0\nfailing()"),
    # item 10: a Jupyter kernel to libraries
    Cell("shell-class", "ip = get_ipython()\n(type(ip).__name__, 'zmq' in str(type(ip)).lower(), hasattr(ip, 'kernel'), "
                        "'IPKernelApp' in ip.config)"),
    Cell("sys-argv", "import argparse, os, sys\n(os.path.basename(sys.argv[0]), os.path.isfile(sys.argv[0]), "
                     "sys.argv[1], os.path.dirname(sys.argv[2]) == os.path.dirname(sys.argv[2].rstrip('/')), "
                     "argparse.ArgumentParser().parse_known_args()[1][:1])"),
    Cell("pandas-max-columns", "import pandas as pd\npd.get_option('display.max_columns')"),
    Cell("pandas-wide-frame", "df = pd.DataFrame([range(12)] * 3, columns=[f'column_{i}' for i in range(12)])\ndf"),
    Cell("pandas-print-frame", "print(df)"),
    Cell("pandas-categorical", "pd.Categorical(list('abcabcabca') * 5)"),
    Cell("pandas-styler", "df.style.highlight_max()"),
    Cell("tqdm-auto", "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), disable=True):\n    pass\ntqdm.__module__"),
    Cell("matplotlib-backend", "import matplotlib\nmatplotlib.get_backend()"),
    Cell("matplotlib-figure", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"),
    # item 12: the project
    Cell("read-parent-data", "pd.read_csv('../data/x.csv').values.tolist()"),
    Cell("list-parent", "sorted(os.listdir('..'))"),
    # item 13: shell commands, joblib
    Cell("shell-command", "!echo hi"),
    Cell("shell-ls-columns", "!ls ../data/listing"),
    Cell("shell-isatty", "!python3 -c 'import sys; print(sys.stdout.isatty())'"),
    Cell("shell-tty", "!tty | sed 's,[0-9][0-9]*,N,'"),  # /dev/pts/N: the number varies on the host
    Cell("shell-ttyname", "!python3 -c 'import os; print(os.ttyname(0).rstrip(\"0123456789\"), os.ttyname(1) == os.ttyname(0))'"),
    Cell("shell-carriage-return", "!printf 'a\\rb\\n'"),
    Cell("shell-exit-code", "!false\nprint(_exit_code)"),
    Cell("bash-slow-loop", "%%bash\nfor i in 1 2 3; do echo line $i; sleep 0.2; done"),
    Cell("sh-stdout-kind", "%%sh\ntest -t 1 && echo terminal || echo pipe"),
    Cell("os-system", "os.system('true')"),
    # the user's shell, pipelines whose processes reap each other, errors and exit codes
    Cell("shared-offset-fork", "fd = os.open('/tmp/so.txt', os.O_RDWR | os.O_CREAT | os.O_TRUNC)\npid = os.fork()\n"
                               "if pid == 0:\n    os.write(fd, b'child'); os._exit(0)\nos.waitpid(pid, 0)\nos.write(fd, b'parent')\n"
                               "os.lseek(fd, 0, 0); r = os.read(fd, 100); os.close(fd); r"),
    Cell("append-three-processes", "fd = os.open('/tmp/ap.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)\npids = []\n"
                                   "for i in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
                                   "        for _ in range(50): os.write(fd, b'%d' % i)\n        os._exit(0)\n    pids.append(pid)\n"
                                   "[os.waitpid(p, 0) for p in pids]\nos.close(fd)\ndata = open('/tmp/ap.txt', 'rb').read()\n"
                                   "(len(data), sorted(set(data)))"),
    Cell("sigchld-ignored-reaps", "import signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\npid = os.fork()\n"
                                  "if pid == 0:\n    os._exit(0)\ntime.sleep(0.2)\ntry:\n    os.waitpid(pid, 0); r = 'waited'\n"
                                  "except ChildProcessError:\n    r = 'reaped'\nsignal.signal(signal.SIGCHLD, signal.SIG_DFL)\nr"),
    Cell("killpg-new-session", "import signal, subprocess\np = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
                               "os.killpg(p.pid, signal.SIGTERM)\np.wait()"),
    Cell("select-two-children", "import select, subprocess\n"
                                "ps = [subprocess.Popen(['sh', '-c', f'sleep 0.{i}; echo {i}'], stdout=subprocess.PIPE) for i in (2, 1)]\n"
                                "out = []\nwhile len(out) < 2:\n    r, _, _ = select.select([p.stdout for p in ps], [], [], 10)\n"
                                "    for f in r:\n        line = f.readline()\n        if line: out.append(line.strip())\n"
                                "[p.wait() for p in ps]\nsorted(out)  # the order is the scheduler's"),
    Cell("mp-value-lock", "import multiprocessing as mp\nv = mp.Value('i', 0)\ndef inc(v):\n    for _ in range(100):\n"
                          "        with v.get_lock(): v.value += 1\nps = [mp.Process(target=inc, args=(v,)) for _ in range(3)]\n"
                          "[p.start() for p in ps]; [p.join() for p in ps]\nv.value"),
    Cell("scandir-attributes", "os.makedirs('sd/sub', exist_ok=True); open('sd/f.txt', 'w').write('x'); os.symlink('f.txt', 'sd/ln')\n"
                               "r = sorted((e.name, e.is_file(), e.is_dir(), e.is_symlink(), e.stat(follow_symlinks=False).st_size > 0)\n"
                               "           for e in os.scandir('sd'))\nimport shutil; shutil.rmtree('sd'); r"),
    Cell("shell-ps", "!ps -o comm= -p $$"),
    Cell("dir-size", "os.makedirs('dsz/sub', exist_ok=True)\n"
                     "r = [os.stat(p).st_size > 0 for p in ('dsz', 'dsz/sub', '/tmp')]\nos.rmdir('dsz/sub'); os.rmdir('dsz'); r"),
    Cell("threads-subprocess", "import threading, subprocess\nres = [None] * 4\n"
                               "def run(i):\n    res[i] = subprocess.run(['sh', '-c', f'echo {i}'], capture_output=True, text=True).stdout\n"
                               "ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]\n"
                               "[t.start() for t in ts]; [t.join() for t in ts]\nres"),
    Cell("sqlite-two-processes", "import sqlite3, multiprocessing as mp\n"
                                 "c = sqlite3.connect('two.db'); c.execute('create table t(x)'); c.commit(); c.close()\n"
                                 "def ins(n):\n    c = sqlite3.connect('two.db', timeout=30)\n"
                                 "    for i in range(n):\n        c.execute('insert into t values (?)', (i,)); c.commit()\n    c.close()\n"
                                 "ps = [mp.Process(target=ins, args=(50,)) for _ in range(2)]\n[p.start() for p in ps]; [p.join() for p in ps]\n"
                                 "c = sqlite3.connect('two.db'); n = c.execute('select count(*) from t').fetchone()[0]; c.close()\n"
                                 "os.remove('two.db'); (n, [p.exitcode for p in ps])"),
    Cell("flock-excludes-subprocess", "import fcntl, subprocess\nwith open('lockfile', 'w') as f:\n    fcntl.flock(f, fcntl.LOCK_EX)\n"
                                      "    held = subprocess.run(['flock', '-n', 'lockfile', 'true']).returncode\n"
                                      "os.remove('lockfile')\nheld"),
    Cell("shell-is-users", "!test -n \"$BASH_VERSION\" && echo bash || echo sh"),
    Cell("shell-pipeline-xargs", "!pwd | xargs basename"),
    Cell("shell-missing-file", "!cat no-such-file; echo rc=$?"),
    Cell("bash-stderr-exit", "%%bash\necho out\necho err >&2\nexit 3"),
    Cell("script-python", "%%script python3\nprint('from script')"),
    Cell("check-output-pipeline", "import subprocess\n"
                                  "subprocess.check_output('seq 1 1000 | sort -rn | head -3', shell=True, text=True)"),
    Cell("popen-communicate", "p = subprocess.Popen(['cat'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
                              "len(p.communicate(b'x' * 100000)[0])"),
    Cell("os-popen", "os.popen('echo hi').read()"),
    Cell("process-pool-executor", "from concurrent.futures import ProcessPoolExecutor\nimport math\n"
                                  "with ProcessPoolExecutor(2) as ex:\n    r = list(ex.map(math.factorial, range(10)))\nr[-1]"),
    Cell("threading-timer", "import threading\nev = threading.Event(); threading.Timer(0.05, ev.set).start()\nev.wait(5)"),
    Cell("event-loop-running", "import asyncio\nasyncio.get_event_loop().is_running()"),
    # the kernel's asyncio loop: cells run inside it, its tasks and timers run between cells
    Cell("asyncio-running-loop", "asyncio.get_running_loop() is asyncio.get_event_loop()"),
    Cell("asyncio-task-between-cells", "async def five():\n    return 5\ntask5 = asyncio.ensure_future(five())"),
    Cell("asyncio-task-done", "task5.done(), task5.result()"),
    Cell("asyncio-run-refused", "c = five()\ntry:\n    asyncio.run(c)\nexcept RuntimeError as e:\n    print(e)\n"
                                "c.close()"),
    Cell("asyncio-timer-await", "fut7 = asyncio.get_running_loop().create_future()\n"
                                "asyncio.get_running_loop().call_later(0.05, fut7.set_result, 7)\nawait fut7"),
    Cell("asyncio-thread-wakes-loop", "import threading\nwoken = []\nloop = asyncio.get_running_loop()\n"
                                      "th = threading.Thread(target=loop.call_soon_threadsafe, args=(woken.append, 1))\n"
                                      "th.start(); th.join()"),
    Cell("asyncio-thread-woke-loop", "woken"),
    Cell("asyncio-interrupt-cancels-await", "import os, signal\n"
                                            "asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)\n"
                                            "await asyncio.sleep(60)", compare="outcome"),
    Cell("asyncio-after-interrupt", "await asyncio.sleep(0.01); 'still serving'"),
    Cell("sigint-handler", "import signal\nsignal.getsignal(signal.SIGINT) is signal.default_int_handler"),
    # issue 15: multiprocessing with the fork start method, a forked child's print
    Cell("multiprocessing-pool", "import multiprocessing\nwith multiprocessing.Pool(2) as pool:\n"
                                 "    print(pool.map(abs, [-3, -2, -1, 0, 1]))"),
    Cell("multiprocessing-manager", "with multiprocessing.Manager() as m:\n    d = m.dict()\n"
                                    "    ps = [multiprocessing.Process(target=d.__setitem__, args=(i, i * i)) for i in range(3)]\n"
                                    "    [p.start() for p in ps]; [p.join() for p in ps]\n    print(sorted(d.items()))"),
    # TCP on the sandbox's own loopback: a local server and its client in one cell
    Cell("tcp-loopback-http", "import http.server, threading, urllib.request\n"
                              "class Hello(http.server.BaseHTTPRequestHandler):\n"
                              "    def do_GET(self):\n"
                              "        self.send_response(200); self.end_headers(); self.wfile.write(b'hello ' + self.path.encode())\n"
                              "    def log_message(self, *args): pass\n"
                              "with http.server.HTTPServer(('localhost', 0), Hello) as srv:\n"
                              "    threading.Thread(target=srv.handle_request).start()\n"
                              "    print(urllib.request.urlopen(f'http://localhost:{srv.server_port}/page').read())"),
    Cell("asyncio-tcp-loopback", "async def upper(reader, writer):\n"
                                 "    writer.write((await reader.readline()).upper()); await writer.drain(); writer.close()\n"
                                 "server = await asyncio.start_server(upper, '127.0.0.1', 0)\n"
                                 "reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())\n"
                                 "writer.write(b'shout\\n'); print(await reader.readline()); writer.close()\n"
                                 "server.close(); await server.wait_closed()"),
    Cell("multiprocessing-listener", "from multiprocessing.connection import Listener, Client\n"
                                     "with Listener(authkey=b'k') as l:\n"
                                     "    p = multiprocessing.Process(target=lambda a: Client(a, authkey=b'k').send('hi'), args=(l.address,))\n"
                                     "    p.start()\n    with l.accept() as c:\n        print(c.recv())\n    p.join()\n"
                                     "    kind = type(l.address).__name__\n(p.exitcode, kind)"),
    Cell("fork-child-print", "pid = os.fork()\nif pid == 0:\n    print('from the child', flush=True)\n    os._exit(3)\n"
                             "os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])"),
    Cell("proc-meminfo", "mem = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/meminfo')}\n"
                         "(mem['MemTotal'] * 1024 == os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'), mem['MemAvailable'] > 0)"),
    Cell("proc-self-status", "st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
                             "(int(st['Pid']) == os.getpid(), int(st['VmRSS'].split()[0]) > 0)"),
    # the signal sets of status (what CPython's test_subprocess and ps read), in hex, bit sig-1
    Cell("proc-self-status-signals", "import signal\n"
                                     "old = signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
                                     "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
                                     "st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
                                     "signal.signal(signal.SIGUSR1, old); signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})\n"
                                     "bit = lambda key, sig: int(st[key], 16) >> (sig - 1) & 1\n"
                                     "(bit('SigIgn', signal.SIGUSR1), bit('SigBlk', signal.SIGUSR2), bit('SigCgt', signal.SIGINT),\n"
                                     " bit('SigIgn', signal.SIGUSR2), int(st['Threads']) >= 1, len(st['ShdPnd'].strip()))"),
    # /proc/self/fd, fdinfo and cwd (psutil's num_fds, open_files and cwd read them; Dask's
    # Client() asks num_fds as it starts)
    Cell("proc-self-fd", "r, w = os.pipe()\nfdf = open('fd_probe.txt', 'w')\n"
                         "links = {n: os.readlink('/proc/self/fd/' + n) for n in os.listdir('/proc/self/fd') "
                         "if n in (str(r), str(w), str(fdf.fileno()))}\n"
                         "(links[str(r)].startswith('pipe:['), links[str(fdf.fileno())] == os.path.abspath('fd_probe.txt'), "
                         "os.path.islink(f'/proc/self/fd/{r}'), os.readlink('/proc/self/cwd') == os.getcwd(), "
                         "os.path.exists('/proc/self/fd/999'))"),
    Cell("proc-self-fdinfo", "fdf.write('abc'); fdf.flush()\n"
                             "info = dict(l.split(':', 1) for l in open(f'/proc/self/fdinfo/{fdf.fileno()}').read().splitlines())\n"
                             "(int(info['pos']), int(info['flags'], 8) & 3, bool(int(info['flags'], 8) & os.O_CLOEXEC))"),
    Cell("psutil-fds-files-cwd", "import psutil\np = psutil.Process()\n"
                                 "(p.num_fds() == len(os.listdir('/proc/self/fd')), "
                                 "[o.position for o in p.open_files() if o.path == os.path.abspath('fd_probe.txt')], "
                                 "p.cwd() == os.getcwd())"),
    # the rest of the battery
    Cell("dhist", "import os\n[os.path.samefile(d, os.getcwd()) for d in _dh]"),
    Cell("who", "%who_ls int"),
    Cell("capture", "%%capture captured\nprint('hidden')"),
    Cell("capture-read", "captured.stdout"),
    Cell("prun", "%prun -q sum(range(1000))", compare="outcome"),
    Cell("history", "%history -l 1", compare="outcome"),
    Cell("load", "%load script_run.py", compare="outcome"),
    Cell("pager", "len?", compare="outcome"),
    Cell("underscore", "40 + 2"),
    Cell("underscore-read", "_ + 1"),
    Cell("html-magic", "%%html\n<b>bold</b>"),
    Cell("latex-magic", "%%latex\n$x^2$"),
    Cell("display-mimes", "from IPython.display import HTML, Markdown, Latex, JSON, SVG, Math, Javascript, Image, display\n"
                          "import base64\n"
                          "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n"
                          "display(HTML('<i>h</i>'), Markdown('**m**'), Latex('$y$'), JSON({'a': 1}), "
                          "SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"></svg>'), "
                          "Math('z'), Javascript('1'), Image(png))"),
    Cell("display-update", "h = display('first', display_id=True)\nh.update('second')"),
    Cell("sqlite-memory", "con2 = sqlite3.connect(':memory:')\ncon2.execute('create table t (x)')\n"
                          "con2.executemany('insert into t values (?)', [(1,), (2,)])\ncon2.execute('select sum(x) from t').fetchone()"),
    Cell("pickle-roundtrip", "import pickle\npickle.dump({'k': [1, 2]}, open('/tmp/p.pkl', 'wb'))\npickle.load(open('/tmp/p.pkl', 'rb'))"),
    Cell("csv-roundtrip", "df.to_csv('out.csv', index=False)\npd.read_csv('out.csv').shape"),
    Cell("json-roundtrip", "import json\njson.dump({'a': [1, 2]}, open('out.json', 'w'))\njson.load(open('out.json'))"),
    Cell("input", "answer = input('value? ')\nanswer", stdin="forty-two"),
    Cell("pdb-set-trace", "def stepped():\n    y = 3\n    import pdb; pdb.set_trace()\n    return y\nstepped()",
         stdin="c"),
    Cell("breakpoint-no-debugger", "x_bp = 41\nbreakpoint()\nx_bp + 1"),
    Cell("sys-exit", "import sys\nsys.exit(3)"),
    Cell("recursion-error", "def r(n):\n    return r(n + 1)\nr(0)", compare="outcome"),
    Cell("top-level-await", "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'"),
    Cell("signal-alarm", "import signal\nsignal.signal(signal.SIGALRM, lambda *a: print('alarm'))\nsignal.alarm(1)\n"
                         "time.sleep(1.5)"),
    # issue 16: widgets (the comm messages themselves are compared by tests/test_comms.py)
    Cell("ipywidgets-slider", "import ipywidgets as widgets\ns = widgets.IntSlider(value=3)\ns"),
    Cell("ipywidgets-interact", "@widgets.interact(x=5)\ndef f(x):\n    print('twice', 2 * x)"),
    Cell("ipywidgets-output", "out = widgets.Output()\nwith out:\n    print('captured')\nout"),
    Cell("tqdm-notebook", "from tqdm.notebook import tqdm\nsum(i for i in tqdm(range(3), desc='bar'))"),
]
