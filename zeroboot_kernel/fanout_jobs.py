"""`%%fanout NAME in EXPR --jobs N`: the values run in N worker engine processes (the kernel's side).

The engine process is locked down (it may start no process and create no host file), so the kernel
runs this: it asks its engine for `fanout_base` (EXPR evaluated in a fork of the live state, that
fork as a delta save in session_save's format, signed with the user's save key), fetches it in
chunks into a private file (a 0700 folder of its own, the file 0600), starts N worker engines as it
starts its own (EngineClient: the same confinement, network policy, notebook folder and files mode),
gives each the session's cell timeout and memory limit, and has each `resume` the save (validated
like any save: checksum, template, state format, the engine's own state loader) and run a
contiguous share of the values (`execute` with `fanout_share`: fanout.run in the worker). The
shares' output goes out in the order of the values: the first share's live, each next one's once
the one before it has finished. The results (checked: base64 text or None, bounded) become
`_fanout` in the kernel's own engine, through one ordinary silent cell, as without --jobs; the live
state is not changed otherwise.

A worker that dies or cannot start costs only its share's values that had not reported (each named
in a line of stderr). An interrupt (interrupt()) goes to every worker: each ends its running value
and runs no more, and the values that did not run are named. The workers are closed and the save
file removed whatever happens.

`run` yields the events EngineClient.request yields (stream, display_data, ..., then the reply),
so the kernel forwards them as a cell's.
"""
from __future__ import annotations

import base64
import logging
import queue
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

from . import engine_requests as req
from . import fanout
from . import session_save
from .engine_client import EngineClient
from .errors import ZerobootError

log = logging.getLogger("zeroboot_kernel.fanout_jobs")

MakeWorker = Callable[[], EngineClient]
_DONE = object()


def shares(count: int, jobs: int) -> list[tuple[int, int]]:
    """count values cut into at most `jobs` contiguous, non-empty shares as even as can be."""
    jobs = max(1, min(jobs, count))
    size, extra = divmod(count, jobs)
    out, first = [], 0
    for k in range(jobs):
        stop = first + size + (1 if k < extra else 0)
        out.append((first, stop))
        first = stop
    return [s for s in out if s[1] > s[0]]


def _stream(name: str, text: str) -> dict[str, Any]:
    return {"event": "stream", "name": name, "text": text}


def _reply(count: int, status: str = "ok", **error: Any) -> dict[str, Any]:
    content = {"status": status, "execution_count": count, "user_expressions": {}, "payload": [], "restored": False}
    return {"event": "reply", "content": {**content, **error}}


def _results(content: dict[str, Any], first: int, stop: int) -> list[str | None]:
    """A worker's `fanout_results` (guest-derived: each must be base64 text or None; at most one
    per value of the share), or ValueError."""
    got = content.get("fanout_results")
    if not isinstance(got, list) or len(got) > stop - first:
        raise ValueError("malformed fanout_results")
    for item in got:
        if item is not None and (not isinstance(item, str) or not fanout.B64.fullmatch(item)):
            raise ValueError("a result that is not base64 text")
    return list(got)


class FanoutJobs:
    """One --jobs fan-out: run() yields its events; interrupt() may be called from any thread."""

    def __init__(self, client: EngineClient, make_worker: MakeWorker) -> None:
        self.client = client
        self.make_worker = make_worker
        self.workers: list[EngineClient] = []
        self.executing: list[EngineClient] = []   # workers whose share's execute request is out
        self.lock = threading.Lock()
        self.interrupted = threading.Event()
        self.closed = False                        # run() ended: a worker that starts now closes itself
        self.threads: list[threading.Thread] = []

    def interrupt(self) -> bool:
        """Interrupt EXPR in the kernel's engine, or every worker's running value. An engine drops
        an interrupt that names a request other than the running cell, so only workers whose
        execute request is out are interrupted here; one still starting or resuming sees the flag
        (under the same lock, see _share_sent) and interrupts its own share or never starts it."""
        with self.lock:
            self.interrupted.set()
            workers = list(self.executing)
        done = self.client.interrupt()
        for w in workers:
            try:
                done = w.interrupt() or done
            except ZerobootError as exc:  # a worker that died: its values are reported as not run
                log.info("zeroboot: fan-out worker not interrupted: %s", exc)
        return done

    def run(self, code: str, count: int, jobs: int) -> Iterator[dict[str, Any]]:
        try:
            name = fanout.parse_all(code)[0]
        except ZerobootError as exc:
            yield _reply(count, "error", ename="UsageError", evalue=str(exc), traceback=[f"UsageError: {exc}"])
            return
        limit = fanout.max_jobs()
        if jobs > limit:
            yield _stream("stderr", f"%%fanout --jobs {jobs}: capped at {limit} workers (the host's CPUs, or "
                                    f"ZEROBOOT_FANOUT_JOBS)\n")
            jobs = limit
        key = session_save.save_key()
        base: dict[str, Any] = {}
        for ev in self.client.request(req.FANOUT_BASE, code=code, key=key.hex()):
            if ev["event"] == "reply":
                base = ev["content"]
            else:
                yield ev
        if base.get("status") != "ok":
            ename, evalue = str(base.get("ename", "SandboxError")), str(base.get("evalue", "%%fanout failed"))
            content = {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
            yield {"event": "error", "content": content}
            yield _reply(count, "error", **content)
            return
        values, size = base.get("count"), base.get("size")
        if type(values) is not int or not 0 <= values <= fanout.MAX_VALUES or type(size) is not int or size < 0:
            raise ZerobootError("malformed fanout_base reply from the engine")
        folder = Path(tempfile.mkdtemp(prefix="zeroboot-fanout-"))  # 0700, this user's
        try:
            path = folder / f"base{session_save.SUFFIX}"
            session_save.write_file(path, self._chunks(size))
            results = yield from self._run_shares(code, count, name, values, jobs, path, key, base)
        finally:
            self._close_workers()
            shutil.rmtree(folder, ignore_errors=True)
        reply: dict[str, Any] = {}
        for ev in self.client.request(req.EXECUTE, code=fanout.listing_code(results), execution_count=count,
                                      silent=True, store_history=False):
            if ev["event"] == "reply":
                reply = ev["content"]
        if reply.get("status") != "ok":
            yield _stream("stderr", f"_fanout could not be set: {str(reply.get('evalue'))[:500]}\n")
        yield _reply(count)

    def _chunks(self, size: int) -> Iterator[bytes]:
        from .export import CHUNK
        off = 0
        while off < size:
            n = min(CHUNK, size - off)
            got = self.client.call(req.SAVE_CHUNK, offset=off, size=n)
            data = base64.b64decode(str(got.get("data", "")))
            if got.get("status") != "ok" or len(data) != n:
                raise ZerobootError(f"the engine sent {len(data)} bytes of the fan-out's save where {n} were asked for")
            yield data
            off += n

    def _run_shares(self, code: str, count: int, name: str, values: int, jobs: int, path: Path, key: bytes,
                    base: dict[str, Any]) -> Generator[dict[str, Any], None, list[str | None]]:
        """Every share in a worker of its own (threads); their events in the order of the values;
        the results, one per value (None for a value that failed or did not run)."""
        parts = shares(values, jobs)
        queues: list[queue.Queue[Any]] = [queue.Queue() for _ in parts]
        threads = [threading.Thread(target=self._worker, args=(code, count, part, path, key, base, q),
                                    name=f"zeroboot-fanout-{k}", daemon=True)
                   for k, (part, q) in enumerate(zip(parts, queues))]
        self.threads = threads
        for t in threads:
            t.start()
        results: list[str | None] = []
        total = 0
        not_run: list[int] = []
        for (first, stop), q in zip(parts, queues):
            got: list[str | None] = []
            while True:
                item = q.get()
                if item is _DONE:
                    break
                if isinstance(item, tuple):  # ("results", list) or ("died", text)
                    if item[0] == "results":
                        got = item[1]
                    else:
                        yield _stream("stderr", item[1])
                    continue
                yield item
            for b in got:
                if b is not None and total + len(b) > fanout.MAX_RESULT_BYTES:
                    yield _stream("stderr", "%%fanout: the results together are too large for _fanout: None\n")
                    b = None
                total += len(b or "")
                results.append(b)
            missing = list(range(first + len(got), stop))
            not_run += missing
            results += [None] * len(missing)
        for t in threads:
            t.join()
        if not_run:
            why = "interrupted" if self.interrupted.is_set() else "their worker ended"
            shown = ", ".join(f"[{i}]" for i in not_run[:50]) + (" ..." if len(not_run) > 50 else "")
            yield _stream("stderr", f"%%fanout ({why}): {len(not_run)} values did not run (or did not report): "
                                    f"{name} {shown}\n")
        return results

    def _worker(self, code: str, count: int, part: tuple[int, int], path: Path, key: bytes,
                base: dict[str, Any], q: queue.Queue[Any]) -> None:
        first, stop = part
        try:
            if self.interrupted.is_set():
                return
            w = self.make_worker()
            with self.lock:
                if not self.closed:
                    self.workers.append(w)
            if self.closed:
                w.close(timeout=2)
                return
            if self.interrupted.is_set():
                return
            timeout = base.get("timeout")
            if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
                self._checked(w.call(req.TIMEOUT, seconds=float(timeout)), "set the cell timeout")
            memory = base.get("memory_limit")
            if type(memory) is int and memory > 0:
                self._checked(w.call(req.MEMORY, bytes=memory), "set the memory limit")
            self._checked(w.call(req.RESUME, path=str(path), key=key.hex()), "resume the fan-out's save")
            if self.interrupted.is_set():
                return
            for ev in w.request(req.EXECUTE, code=code, execution_count=count, silent=False, store_history=False,
                                fanout_share=[first, stop], on_sent=lambda: self._share_sent(w)):
                if ev["event"] == "reply":
                    content = ev["content"]
                    if content.get("status") != "ok":
                        raise ZerobootError(str(content.get("evalue", "the worker's run failed"))[:500])
                    q.put(("results", _results(content, first, stop)))
                elif ev["event"] in ("input_request", "comm", "log"):
                    continue  # no stdin or widgets in a worker's run
                else:
                    q.put(ev)
        except (ZerobootError, OSError, ValueError) as exc:
            q.put(("died", f"%%fanout: the worker for values [{first}] to [{stop - 1}] failed: {exc}\n"))
        finally:
            q.put(_DONE)

    def _share_sent(self, w: EngineClient) -> None:
        """w's execute request is out. Under the lock interrupt() takes, so exactly one of the two
        interrupts it: interrupt() if it came after this, else this (it came while w was starting
        or resuming, when w's engine would have dropped it)."""
        with self.lock:
            self.executing.append(w)
            late = self.interrupted.is_set()
        if late:
            w.interrupt()

    @staticmethod
    def _checked(content: dict[str, Any], what: str) -> None:
        if content.get("status") != "ok":
            raise ZerobootError(f"could not {what}: {str(content.get('evalue'))[:500]}")

    def _close_workers(self) -> None:
        """Every worker closed (the ones still starting close themselves), their threads ended."""
        with self.lock:
            self.closed = True
            workers, self.workers, self.executing = list(self.workers), [], []
        for w in workers:
            try:
                w.close(timeout=2)
            except Exception:  # noqa: BLE001 - closing the others matters more
                log.exception("zeroboot: closing a fan-out worker failed")
        for t in self.threads:
            t.join(timeout=60)  # a closed worker's request ends at once (EngineDied)
