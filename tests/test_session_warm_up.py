"""The warm-up request a new session runs before its first cell (Session.warm_up): it must leave
nothing a cell can see, so the first cell shows what it shows in a session without it (and what a
new ipykernel shows)."""
from __future__ import annotations

import json

from session_helpers import cell, ok
from zeroboot_kernel.session import Session

FIRST_CELL = ("import json, sys, random\nip = get_ipython()\n"
              "print(json.dumps([ip.execution_count, ip.last_execution_result is None, ip.last_execution_succeeded,"
              " len(In), len(Out), repr(_), sorted(k for k in globals() if not k.startswith('_'))[:40],"
              " hasattr(sys, 'last_value')]))")


def test_the_first_cell_sees_no_trace_of_the_warm_up(template) -> None:
    seen = []
    for warm in (False, True):
        s = Session(template)
        try:
            if warm:
                s.warm_up()
            seen.append(json.loads(ok(cell(s, FIRST_CELL)).strip().splitlines()[-1]))
            # the random state is seeded afresh for each session either way
            seen.append(ok(cell(s, "print(random.random() != random.random())", 2)).strip())
        finally:
            s.close()
    assert seen[0] == seen[2], seen
    assert seen[0][1:3] == [True, True], seen[0]  # no earlier result, as in a new ipykernel
    assert seen[1] == seen[3] == "True"


def test_warm_up_is_only_before_the_first_cell(template) -> None:
    s = Session(template)
    try:
        ok(cell(s, "x = 41"))
        s.warm_up()  # too late: nothing runs, the state is the cell's
        r = cell(s, "x + 1", 2)
        assert r["result"] == "42" and r["execution_count"] == 2, r
    finally:
        s.close()
