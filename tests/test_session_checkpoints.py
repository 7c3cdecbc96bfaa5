"""Chained-mode checkpoints at the session level, with the next cell's checkpoint prepared between
cells (Session.prepare_next_cell, which the engine server calls after each reply): rollbacks,
%rewind, completion and mode changes must see exactly the states they would without it."""
from __future__ import annotations

import pytest

from zeroboot_kernel.engine_requests import REQUESTED
from zeroboot_kernel.session import Session


@pytest.fixture
def session(template):
    s = Session(template)
    yield s
    s.close()


def run(s: Session, code: str, n: int, checkpoint: bool = True) -> dict:
    """One cell as the engine server runs it: execute, then prepare the next checkpoint."""
    results: list[str] = []
    reply = s.execute(code, execution_count=n, wants_checkpoint=checkpoint,
                      on_message=lambda mt, c: results.append(c["data"]["text/plain"]) if mt == "execute_result" else None)
    s.prepare_next_cell()
    reply["result"] = results[0] if results else None
    return reply


def test_the_prepared_checkpoint_becomes_the_next_cells(session) -> None:
    run(session, "x = 1", 1)
    assert session.ready is not None
    prepared = session.ready
    run(session, "x = 2", 2)
    assert session.checkpoints[-1].snapshot is prepared and session.checkpoints[-1].number == 2
    assert run(session, "x", 3)["result"] == "2"


def test_a_crash_rolls_back_to_the_state_after_the_previous_cell(session) -> None:
    run(session, "x = 1", 1)
    reply = run(session, "x = 99\nimport ctypes\nctypes.string_at(0)", 2)
    assert reply["status"] == "error" and reply["ename"] == "SandboxCrashed"
    assert run(session, "x", 3)["result"] == "1"


def test_rewind_drops_the_prepared_checkpoint_and_goes_back(session) -> None:
    for n, code in enumerate(["x = 1", "x = 2", "x = 3"], 1):
        run(session, code, n)
    assert session.ready is not None
    assert session.rewind(2).startswith("rewound 2")
    assert session.ready is None
    assert run(session, "x", 4)["result"] == "1"
    session.rewind(1)  # undoes the cell that read x: back to x = 1 with no prepared state left over
    assert run(session, "x", 5)["result"] == "1"


def test_completion_between_cells_keeps_the_prepared_state(session) -> None:
    run(session, "alpha_value = 41", 1)
    prepared = session.ready
    matches = session.complete("alpha_v", 7)["matches"]
    assert "alpha_value" in matches
    assert session.ready is prepared  # used as the throwaway's snapshot, still the state
    assert run(session, "alpha_value + 1", 2)["result"] == "42"


def test_restart_and_mode_changes_drop_the_prepared_checkpoint(session) -> None:
    run(session, "x = 1", 1)
    session.set_mode("isolated")
    assert session.ready is None
    assert run(session, "'x' in dir()", 2)["result"] == "False"
    assert session.ready is None  # isolated cells start from the template: nothing to prepare
    session.set_mode("chained")
    assert run(session, "x", 3)["result"] == "1"
    session.restart()
    assert session.ready is None
    assert run(session, "'x' in dir()", 4)["result"] == "False"


def test_isolated_cells_start_clean_when_reset_between_cells(template) -> None:
    s = Session(template, mode="isolated")
    try:
        run(s, "leak = 1", 1)
        assert s.reset_done  # reset to the template right after the reply
        assert run(s, "'leak' in dir()", 2)["result"] == "False"
        run(s, "leak = 2", 3)
        s.complete("lea", 3)  # a completion between cells leaves the sandbox clean
        assert run(s, "'leak' in dir()", 4)["result"] == "False"
        reply = run(s, "leak = 3\nimport ctypes\nctypes.string_at(0)", 5)
        assert reply["ename"] == "SandboxCrashed"
        assert run(s, "'leak' in dir()", 6)["result"] == "False"
        s.set_mode("chained")
        assert not s.reset_done
    finally:
        s.close()


def test_requested_checkpoints_only_before_the_cells_that_ask(template) -> None:
    """The batch executor's policy: no checkpoint is prepared after a reply or taken before a cell
    that does not ask; a crash of such a cell goes back to the last checkpoint there is (the one
    a cell asked for, else the clean sandbox) and says so."""
    s = Session(template, checkpoint_policy=REQUESTED)
    try:
        run(s, "x = 1", 1, checkpoint=False)
        assert s.ready is None and not s.checkpoints
        run(s, "x = 2", 2, checkpoint=True)  # its checkpoint holds x = 1
        assert s.ready is None and [cp.number for cp in s.checkpoints] == [2]
        run(s, "x = 3", 3, checkpoint=False)
        assert [cp.number for cp in s.checkpoints] == [2]
        reply = run(s, "x = 4\nimport ctypes\nctypes.string_at(0)", 4, checkpoint=False)
        assert reply["ename"] == "SandboxCrashed"
        assert "had no checkpoint of its own" in reply["evalue"] and "before cell [2]" in reply["evalue"]
        assert run(s, "x", 5, checkpoint=False)["result"] == "1"
        reply = run(s, "x = 6\nimport ctypes\nctypes.string_at(0)", 6, checkpoint=False)
        assert "rolled back to the clean sandbox" in reply["evalue"]
        assert run(s, "'x' in dir()", 7, checkpoint=False)["result"] == "False"
        # a cell that asks: a crash costs that cell only, as under the default policy
        run(s, "y = 1", 8, checkpoint=False)
        reply = run(s, "y = 2\nimport ctypes\nctypes.string_at(0)", 9, checkpoint=True)
        assert reply["ename"] == "SandboxCrashed" and "before this cell" in reply["evalue"]
        assert run(s, "y", 10, checkpoint=False)["result"] == "1"
    finally:
        s.close()


def test_every_cell_policy_ignores_a_cell_that_asks_for_none(session) -> None:
    """The kernel's sessions: every chained cell has its checkpoint, whatever the request says."""
    run(session, "x = 1", 1, checkpoint=False)
    assert session.ready is not None
    reply = run(session, "x = 2\nimport ctypes\nctypes.string_at(0)", 2, checkpoint=False)
    assert "before this cell" in reply["evalue"]
    assert run(session, "x", 3)["result"] == "1"
    with pytest.raises(ValueError, match="checkpoint policy"):
        Session(session.template, checkpoint_policy="sometimes")
