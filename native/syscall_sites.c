/* syscall_sites.c - rewriting the guest's `syscall` instructions into the port's `out`.
 *
 * On PVM the `syscall` instruction itself costs ~13 us of a ~52 us round trip here: the trip to
 * LSTAR, where the entry's `out` then exits. An `out` to ZB_PORT_SYSCALL from user code exits at
 * once (guest_abi.h). So when a syscall exits through the entry, the two bytes of the `syscall`
 * that made it (just before its return address, rcx) are rewritten into that `out`, the same
 * length: every later call from the site (glibc has one per wrapper: write, openat, mmap, futex,
 * ...) saves that trip. As gVisor's systrap does with its own trampolines, only where nothing
 * but the process itself can see it:
 *  - the bytes there are `syscall` (0f 05): a jump to LSTAR with some other rcx is left alone;
 *  - both bytes in one page of the process's own, allocated user memory (zb_guest_ptr), which is
 *    copy-on-write (a host file or the template's image is never written through); never a
 *    MAP_SHARED mapping, whose bytes are a file's or another process's (shared_map.h);
 *  - not for the numbers the entry answers in the guest, while it does (ZB_ENTRY_ANSWERED_NRS:
 *    an answer without any exit beats the shorter exit);
 *  - at the site's second exit, not its first: a rewrite copies the page and makes the guest
 *    fault it in again (~30 us), which a site run once (most of a short program's start-up:
 *    execve, arch_prctl, set_tid_address, ...) never earns back.
 * The rewrite is guest memory like any other write of the engine: snapshots, forks and restores
 * carry it, a rollback to a state before it brings the `syscall` back (rewritten again at its
 * next exit). What differs from Linux: a process reading its own code sees `out` where its file
 * has `syscall`.
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "shared_map.h"
#include "run.h"

static const uint64_t answered_nrs[] = {ZB_ENTRY_ANSWERED_NRS};
_Static_assert(ZB_SITE_SEEN == 64, "zb_syscall_site_rewrite hashes a site to 6 bits");

static int answered_in_guest(uint64_t nr) {
    for (size_t i = 0; i < sizeof answered_nrs / sizeof answered_nrs[0]; i++)
        if (answered_nrs[i] == nr) return 1;
    return 0;
}

void zb_syscall_site_rewrite(zb_sandbox *sb, const zb_vm *vm, uint64_t nr, uint64_t return_rip) {
    if (!vm->site_rewrite || (vm->guest_answers && answered_in_guest(nr))) return;
    if (return_rip < ZB_LOW_REGION + 2) return;
    uint64_t site = return_rip - 2;
    if ((site & (ZB_PAGE - 1)) == ZB_PAGE - 1) return; /* across two pages */
    const uint8_t *now = zb_guest_ptr(sb, site, 2, 0);
    if (!now || now[0] != 0x0f || now[1] != 0x05 || zb_shmap_find(&sb->mem, site, 2)) return;
    uint64_t *seen = &sb->site_seen[(site * 0x9e3779b97f4a7c15ull) >> 58]; /* 64 slots: the top 6 bits */
    if (*seen != site) {
        *seen = site;
        return;
    }
    *seen = 0;
    uint8_t *code = zb_guest_ptr(sb, site, 2, 1); /* marks the page written, for the next snapshot */
    if (!code) return;
    code[0] = ZB_SITE_OUT_0;
    code[1] = ZB_PORT_SYSCALL;
    sb->stats.syscall_sites++;
}
