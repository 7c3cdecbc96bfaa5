"""The messages the kernel process sends its engine process (docs/PROTOCOL.md, "The engine channel").

One table for both ends: engine_server.py serves exactly the requests listed here (its handler
table is checked against this one by tests/test_wire_contracts.py), the kernel names them through
the constants below, and EngineClient refuses a request or field this table does not have. The
request table in docs/PROTOCOL.md is generated from it (`python -m zeroboot_kernel.engine_requests`
prints it; the test checks that the document holds what it prints).

Transport: engine_wire.py (a u32 length, then a JSON object). A request is `{"op": name, "id": n,
...fields}`; the engine answers with any number of events `{"event": kind, "id": n, ...}` and one
`{"event": "reply", "id": n, "content": {...}}`, whose content is `{"status": "ok", ...}` with the
fields the table names, or an error: `{"status": "error", "ename": str, "evalue": str,
"traceback": [str]}`. Control messages carry no id and get no reply of their own.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    name: str
    type: str            # what the value is, for the documentation
    required: bool = True


@dataclass(frozen=True)
class Request:
    op: str
    fields: tuple[Field, ...]
    reply: str           # the reply's fields besides "status", for the documentation
    sent_by: str         # which part of the kernel sends it
    control: bool = False  # a control message: no id, no reply; read while a cell runs

    @property
    def field_names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)


def _opt(name: str, type_: str) -> Field:
    return Field(name, type_, required=False)


EXECUTE = "execute"
COMPLETE = "complete"
INSPECT = "inspect"
REWIND = "rewind"
MODE = "mode"
TIMEOUT = "timeout"
MEMORY = "memory"
FILES = "files"
DIFF = "diff"
EXPORT_LIST = "export_list"
EXPORT_CHUNK = "export_chunk"
LOCKDOWN_CHECK = "lockdown_check"
CHECKPOINTS = "checkpoints"
CHECKPOINT_BUDGET = "checkpoint_budget"
STATS = "stats"
RESTART = "restart"
NEW_SESSION = "new_session"
SAVE = "save"
FANOUT_BASE = "fanout_base"
SAVE_CHUNK = "save_chunk"
RESUME = "resume"
SHUTDOWN = "shutdown"
COMM = "comm"
COMM_INFO = "comm_info"
# control messages
INTERRUPT = "interrupt"
INPUT_REPLY = "input_reply"

TEXT_REPLY = '`text`: str, what the magic prints'

# new_session's `checkpoints`: which chained cells get a checkpoint (session.py): every one, as the
# kernel needs for %rewind and for a crash that costs one cell, or only those whose execute request
# asks with `checkpoint: true` (the batch executor: a crash of any other cell ends its notebook)
EVERY_CELL = "every_cell"
REQUESTED = "requested"
CHECKPOINT_POLICIES = (EVERY_CELL, REQUESTED)

REQUESTS: dict[str, Request] = {r.op: r for r in (
    Request(EXECUTE, (Field("code", "str"), Field("execution_count", "int"), _opt("silent", "bool"),
                      _opt("store_history", "bool (default true)"), _opt("user_expressions", "{name: expr}"),
                      _opt("allow_stdin", "bool"), _opt("parent_header", "the execute_request's header"),
                      _opt("fanout_share", "[first, stop]: a %%fanout worker's values (fanout_jobs.py)"),
                      _opt("checkpoint", "bool (default true): the cell gets a checkpoint; read only by a session "
                                         "with `checkpoints` \"requested\"")),
            "events `stream`, `display_data`, `update_display_data`, `execute_result`, `error`, "
            "`clear_output`, `input_request`, `comm`, then execute_reply's fields (`user_expressions`, `payload`; "
            "`ename`, `evalue`, `traceback` when `status` is error) and `restored`: bool (the sandbox went back "
            "to an older state since the last request: the kernel resynchronises the comms); with ZEROBOOT_TRACE=1, "
            "`trace`: {stamp: ns} (latency_trace.py)",
            "a cell (do_execute)"),
    Request(COMM, (Field("kind", '"comm_open", "comm_msg" or "comm_close"'), Field("comm_id", "str"),
                   _opt("target_name", "str (comm_open)"), _opt("target_module", "str"), _opt("data", "{}"),
                   _opt("metadata", "{}"), _opt("buffers", "[base64 str]"),
                   Field("parent_header", "the comm message's header")),
            "events `stream`, `display_data`, `update_display_data`, `clear_output`, `error`, `comm`; then "
            "`delivered`: bool (false in isolated mode), `restored`: bool (a rollback)",
            "the frontend's comm_open/comm_msg/comm_close"),
    Request(COMM_INFO, (_opt("target_name", "str or null"), _opt("sync", "[comm id] the frontend has, or null")),
            "events `comm` (a resync's widget states); `comms`: {comm id: {`target_name`}}",
            "comm_info_request; the resync after a restore"),
    Request(COMPLETE, (Field("code", "str"), Field("cursor_pos", "int")),
            "complete_reply's fields (`matches`, `cursor_start`, `cursor_end`, `metadata`)",
            "complete_request"),
    Request(INSPECT, (Field("code", "str"), Field("cursor_pos", "int"), _opt("detail_level", "0 or 1")),
            "inspect_reply's fields (`found`, `data`, `metadata`)", "inspect_request"),
    Request(REWIND, (_opt("n", "int (default 1)"),), TEXT_REPLY, "`%rewind [N]`"),
    Request(MODE, (Field("mode", '"chained" or "isolated"'),), TEXT_REPLY, "`%sandbox mode MODE`"),
    Request(TIMEOUT, (Field("seconds", "float (0: no limit)"),), TEXT_REPLY, "`%sandbox timeout SECONDS`"),
    Request(MEMORY, (Field("bytes", "int"),), TEXT_REPLY, "`%sandbox memory SIZE`"),
    Request(FILES, (Field("mode", '"overlay", "readonly" or "readwrite"'),), TEXT_REPLY,
            "`%sandbox files MODE`"),
    Request(DIFF, (), '`changes`: [[tag, path]] with tags A, M, D, ! (listing.TAGS), at most 8 MiB of '
                      'paths; `more`: int, the changes left out', "`%sandbox diff`"),
    Request(EXPORT_LIST, (Field("path", "str"),),
            '`entries`: [{`parts`: [names], `kind`: "d", "f", "l" or "o", `size`: int}]', "`%sandbox export`"),
    Request(EXPORT_CHUNK, (Field("path", "str"), Field("parts", "[str]"), Field("offset", "int"),
                           Field("size", "int")),
            '`data`: base64 of at most 1 MiB', "`%sandbox export`"),
    Request(LOCKDOWN_CHECK, (), '`checks`: {"network", "server", "netlink", "spawn", "host_file_write": '
                                '"allowed" or an errno name}', "tests"),
    Request(CHECKPOINTS, (), '`checkpoints`: [row], `budget`: {...} (Session.describe_checkpoints, '
                             'describe_budget)', "`%sandbox checkpoints`"),
    Request(CHECKPOINT_BUDGET, (_opt("size", "str (SIZE or auto), null: show"),),
            TEXT_REPLY + "; a bad SIZE is a `UsageError`", "`%sandbox checkpoints budget [SIZE]`"),
    Request(STATS, (), '`stats`: {...} (Session.stats)',
            "`%sandbox stats`, `%sandbox memory`, `%sandbox files`"),
    Request(SAVE, (Field("notebook", "str"), Field("key", "hex str: the user's save key")),
            '`size`: int, the bytes of the save (held by the engine for `save_chunk`); `manifest`: {...}',
            "`%sandbox save`, autosave on shutdown"),
    Request(FANOUT_BASE, (Field("code", "str: the %%fanout cell"), Field("key", "hex str: the user's save key")),
            '`count`: int, the values; `size`: int, the bytes of a save of the values\' fork (held for `save_chunk`); '
            '`timeout`: seconds or null, `memory_limit`: bytes or null (the session\'s, for the workers)',
            "`%%fanout --jobs N` (fanout_jobs.py)"),
    Request(SAVE_CHUNK, (Field("offset", "int"), Field("size", "int")),
            '`data`: base64 of at most 1 MiB of the held save; the last chunk frees it', "`%sandbox save`"),
    Request(RESUME, (Field("path", "str: the save file, chosen by the kernel"), Field("key", "hex str")),
            '`manifest`: {...}; the session now continues from the save, every checkpoint dropped',
            "`%sandbox resume`, ZEROBOOT_RESUME, autosave at start"),
    Request(RESTART, (), 'nothing more: the sandbox is back to its clean state, every checkpoint dropped',
            "`%sandbox reset`"),
    Request(NEW_SESSION, (_opt("project", "str: the notebook's folder (null: none)"), Field("mode", '"chained" or "isolated"'),
                          _opt("timeout", "float (0: no limit)"), _opt("hide", "[str]: paths in the project the guest "
                                                                       "does not see"),
                          _opt("checkpoints", '"every_cell" (default) or "requested": which chained cells get a '
                                              'checkpoint')),
            "nothing more: the engine's session is replaced by a new one forked from the template",
            "`zeroboot-kernel execute` (batch.py), once per notebook"),
    Request(SHUTDOWN, (), "none: the engine process exits", "EngineClient.close"),
    Request(INTERRUPT, (Field("target", "int: the id of the request to interrupt"),),
            "none; acts only while that request runs a cell (PROTOCOL.md, Interrupts)", "EngineClient.interrupt",
            control=True),
    Request(INPUT_REPLY, (Field("value", "str"),),
            "none: the answer to the running cell's `input_request` event", "the kernel's stdin handler",
            control=True),
)}


def check_request(op: str, fields: dict[str, Any]) -> None:
    """A message the kernel is about to send is one of the table's, with its fields: a mistake in
    the kernel's own code is reported here instead of as an engine error reply."""
    request = REQUESTS.get(op)
    if request is None:
        raise ValueError(f"{op!r} is not an engine request (zeroboot_kernel/engine_requests.py lists them)")
    unknown = set(fields) - request.field_names
    missing = {f.name for f in request.fields if f.required} - set(fields)
    if unknown or missing:
        raise ValueError(f"engine request {op!r}: unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")


def markdown_table() -> str:
    """The request table of docs/PROTOCOL.md."""
    rows = ["| request | fields (`?`: optional) | reply (besides `status`) | sent by |", "|---|---|---|---|"]
    for r in REQUESTS.values():
        cells = [f"`{r.op}`" + (" (control)" if r.control else ""),
                 ", ".join(f"`{f.name}`{'' if f.required else '?'}: {f.type}" for f in r.fields) or "-",
                 r.reply, r.sent_by]
        if any("|" in cell for cell in cells):
            raise ValueError(f"request {r.op!r}: a '|' would split its row of the Markdown table")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
