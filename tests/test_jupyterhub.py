"""A JupyterHub class with the zeroboot kernel (issue 18, part 4): a local hub on loopback
(DummyAuthenticator, SimpleLocalProcessSpawner, the Python configurable-http-proxy) starts a
single-user server per student, each opens a notebook with the `zeroboot` kernel through the hub's
proxy and runs its cells at the same time as the others (zeroboot_kernel/bench/hub.py, the load
test's own code at its smallest size). Every cell's output is checked; nothing here is timed."""
from __future__ import annotations

import pytest

pytest.importorskip("jupyterhub")

from zeroboot_kernel.bench import hub  # noqa: E402
from zeroboot_kernel.bench.kernel import OURS  # noqa: E402


def test_a_class_of_three_runs_its_notebook_in_zeroboot_kernels_through_the_hub():
    res = hub.measure(students=3, runs=2, timeout=900.0, kinds=(OURS,))
    ours = res[OURS]
    assert ours["failures"] == 0, ours["failure_examples"]
    assert ours["cells"] == 3 * 2 * len(hub.CELLS)
    # the hub's servers really started this project's kernel, not the stock one
    assert ours["implementations"] == ["zeroboot"]


def test_a_wrong_output_counts_as_a_failure():
    """The load test's check is what makes its failure count mean something."""
    reply = {"content": {"status": "ok"}}
    result = {"header": {"msg_type": "execute_result"}, "content": {"data": {"text/plain": "3"}}}
    stream = {"header": {"msg_type": "stream"}, "content": {"text": "hello 45\n"}}
    png = {"header": {"msg_type": "display_data"}, "content": {"data": {"image/png": "iVBOR"}}}
    assert hub._check(reply, [result], "2")
    assert hub._check(reply, [result], "3") == ""
    assert hub._check(reply, [stream], "hello 45") == ""
    assert hub._check(reply, [stream], "image/png")
    assert hub._check(reply, [png], "image/png") == ""
    assert hub._check({"content": {"status": "error", "evalue": "boom"}}, [result], "3")
