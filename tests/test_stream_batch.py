"""Stream output is batched into IOPub messages as ipykernel's OutStream batches it (issue 13 item 9):
what a cell prints at once is one message, anything else published flushes first, and a timer
flushes what a long-running cell printed."""
from __future__ import annotations

import threading

import pytest

from zeroboot_kernel.stream_batch import StreamBatcher

pytestmark = pytest.mark.without_kvm


def test_one_message_for_what_is_printed_at_once() -> None:
    sent: list[tuple[str, str]] = []
    b = StreamBatcher(lambda name, text: sent.append((name, text)), interval=3600)
    b.write("stdout", "[[0 1 2 3]\n [4 5 6 7]]")
    b.write("stdout", "\n")
    assert sent == []  # nothing until the interval or an explicit flush
    b.flush()
    assert sent == [("stdout", "[[0 1 2 3]\n [4 5 6 7]]\n")]


def test_flush_order_and_streams() -> None:
    sent: list[tuple[str, str]] = []
    b = StreamBatcher(lambda name, text: sent.append((name, text)), interval=3600)
    b.write("stderr", "warn\n")
    b.write("stdout", "a\n")
    b.write("stdout", "b\n")
    b.write("bogus", "c\n")  # an unknown name is stdout, as the kernel has no other stream
    b.flush()
    b.flush()  # nothing pending: nothing sent
    assert sent == [("stdout", "a\nb\nc\n"), ("stderr", "warn\n")]


def test_timer_flushes_a_long_cell_s_output() -> None:
    got = threading.Event()
    sent: list[tuple[str, str]] = []

    def publish(name: str, text: str) -> None:
        sent.append((name, text))
        got.set()

    b = StreamBatcher(publish, interval=0.01)
    b.write("stdout", "epoch 1\n")
    assert got.wait(60), "the timer never flushed"
    assert sent == [("stdout", "epoch 1\n")]
