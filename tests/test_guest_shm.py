"""Memory shared between the processes of a sandbox (issue 15, multiprocessing): MAP_SHARED
anonymous and /dev/shm mappings that stay shared across fork, named semaphores and non-private
futexes woken across processes, and hostile mappings (guest_programs/shm.c)."""
from __future__ import annotations

import pytest

import guest_c

pytestmark = pytest.mark.skipif(not guest_c.have_gcc(), reason="needs gcc for the guest programs")


@pytest.mark.parametrize("test", ["anon_shared", "devshm", "semaphores", "futex", "timed_wait", "hostile"])
def test_shared_memory(test: str) -> None:
    guest_c.check("shm", test, timeout=120.0)


def test_a_shared_mapping_past_the_file_systems_limit_is_enomem() -> None:
    guest_c.check("shm", "fs_limit", timeout=120.0, mem=1 << 30)
