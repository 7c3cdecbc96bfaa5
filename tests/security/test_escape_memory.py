"""Escape battery, memory: a fork writes a secret; its siblings, later forks of the template, and
the same sandbox after it is restored scan their *entire* guest-physical memory for it (guest
page tables map all of it, so ctypes can read every byte above the supervisor region) and must
not find it. A fork also cannot write into the template: a fork made afterwards reads the
template's bytes at the address the first fork overwrote."""
from __future__ import annotations

import secrets


from zeroboot_kernel.session import Session

LOW = 2 << 20


def text(r) -> str:
    return r.result["text/plain"] if r.result else ""


def plant(sb, token: str) -> int:
    """Write ZBMARK:<token> into a fresh ctypes buffer (and a numpy array); return its address."""
    r = sb.execute(f"import ctypes, numpy as np\nzb_buf = ctypes.create_string_buffer(b'ZBMARK:' + {token!r}.encode(), 4096)\n"
                   f"zb_arr = np.frombuffer(b'ZBMARK:' + {token!r}.encode() * 1000, dtype=np.uint8).copy()\n"
                   "ctypes.addressof(zb_buf)")
    assert r.status == "ok", r.error
    return int(text(r))


def scan(sb, mem: int) -> list[bytes]:
    """Every 'ZBMARK:' in the guest's memory and the 40 bytes after it (the scanning code itself
    holds the marker, never a token: the token is only ever sent to the planting fork)."""
    r = sb.execute(
        "import ctypes\nzb_found = set()\n"
        f"for zb_base in range({LOW}, {mem}, 2 << 20):\n"
        "    zb_chunk = ctypes.string_at(zb_base, 2 << 20)\n"
        "    zb_i = zb_chunk.find(b'ZBMARK' b':')\n"
        "    while zb_i >= 0:\n"
        "        zb_found.add(bytes(zb_chunk[zb_i:zb_i + 47]))\n"
        "        zb_i = zb_chunk.find(b'ZBMARK' b':', zb_i + 1)\n"
        "    del zb_chunk\n"
        "sorted(zb_found)", timeout=120)
    assert r.status == "ok", r.error
    return eval(text(r))  # a list of bytes literals


def test_siblings_later_forks_and_the_template_never_see_a_fork_s_memory(template):
    mem = int(template.manifest.get("memory", 1 << 30))
    token = "T" + secrets.token_hex(16)
    with template.fork() as a, template.fork() as sibling:
        addr = plant(a, token)
        assert any(token.encode() in f for f in scan(a, mem))  # the scan does find it where it is
        with template.fork() as later:
            for other in (sibling, later):
                found = scan(other, mem)
                assert not any(token.encode() in f for f in found), found
                # the planting fork's address holds whatever the template has there
                r = other.execute(f"import ctypes\nctypes.string_at({addr}, 7)")
                assert "ZBMARK" not in text(r)


def test_a_restored_sandbox_keeps_nothing_of_the_undone_cell(template):
    mem = int(template.manifest.get("memory", 1 << 30))
    token = "R" + secrets.token_hex(16)
    s = Session(template, mode="isolated")
    try:
        reply = s.execute(f"import ctypes\nzb_keep = ctypes.create_string_buffer(b'ZBMARK:' + {token!r}.encode(), 1 << 20)\n"
                          f"open('/tmp/zb_secret', 'w').write({token!r})", execution_count=1)
        assert reply["status"] == "ok", reply
        out: list[str] = []
        reply = s.execute("import os\nprint(os.path.exists('/tmp/zb_secret'))", execution_count=2,
                          on_stream=lambda name, t: out.append(t))
        assert "".join(out) == "False\n"
        found = scan(s.sandbox, mem)
        assert not any(token.encode() in f for f in found), found
    finally:
        s.close()
