/* page_reprotect.c - when a page left writable after a snapshot is write-protected again.
 *
 * With manual dirty-log protection (kvm_vm.c) a page the guest wrote stays writable and stays in
 * KVM's dirty log after a snapshot: each later snapshot (and restore) compares it with what it
 * should hold, and a page found unchanged costs nothing to keep. CPython writes many pages and puts
 * them back as they were (reference counts), so most written pages are found unchanged; KVM cannot
 * say whether they were written again since. Two prices to balance:
 *   - left writable, a page costs a compare at every snapshot (~0.3-0.5 us);
 *   - protected, its next write costs a write-protect fault (~20-25 us on the nested test host,
 *     ~3 us on bare metal) and it is back in the log.
 * A fixed count of unchanged finds before protecting suits neither the pages every cell touches
 * (protected after a few cells, then faulted in again: ~450 faults in every fifth `1+1` cell, ~1,400
 * in a pandas describe() after a restart) nor the pages a cell touched once (compared for nothing).
 * So the count adapts per page: a page starts at PROTECT_AFTER finds, and each time it is written
 * again after being protected (it is back in the log) the count doubles, PROTECT_LEVEL_MAX times at
 * most (128 finds). A page touched once is compared PROTECT_AFTER times and protected for good; a
 * page every cell touches stays writable for up to 128 snapshots between faults.
 *
 * Bounded cost: when a pass found more than MAX_WRITABLE_UNCHANGED pages unchanged, the next pass
 * protects every page at the first count again, so no snapshot compares more than about that many
 * pages longer than before. All of this only decides when pages are protected again: whether a page
 * changed is always found by comparison, so no choice made here can lose a write. */
#include "util.h"
#include "memory.h"

#define PROTECT_AFTER 4          /* unchanged finds in a row before a page is protected, at first */
#define PROTECT_LEVEL_MAX 5      /* ... doubled up to this many times: 128 finds */
#define MAX_WRITABLE_UNCHANGED 16384 /* pages (64 MiB) a pass may find unchanged and leave writable */

typedef struct zb_reprotect {
    uint8_t *runs;           /* per page: unchanged finds in a row while writable */
    uint8_t *level;          /* per page: doublings of its count (it came back after protection) */
    uint64_t *protected_now; /* bitmap: protected here and not seen written since */
    uint64_t unchanged_this_pass, unchanged_last_pass;
} zb_reprotect;

/* The sandbox's policy state, made when first needed; NULL when out of memory (then every
 * unchanged page is protected at once, which is only slower). */
static zb_reprotect *state_of(zb_memory *m) {
    if (m->reprotect) return m->reprotect;
    zb_reprotect *r = calloc(1, sizeof *r);
    uint8_t *bytes = calloc(m->npages, 2);
    uint64_t *bits = calloc((m->npages + 63) / 64, sizeof *bits);
    if (!r || !bytes || !bits) { free(r); free(bytes); free(bits); return NULL; }
    r->runs = bytes;
    r->level = bytes + m->npages;
    r->protected_now = bits;
    m->reprotect = r;
    return r;
}

void zb_reprotect_free(zb_memory *m) {
    zb_reprotect *r = m->reprotect;
    if (!r) return;
    free(r->runs); /* runs and level are one allocation */
    free(r->protected_now);
    free(r);
    m->reprotect = NULL;
}

/* Page pfn is in the log although we protected it: it was written since. */
static void came_back(zb_reprotect *r, uint64_t pfn) {
    if (!zb_bit(r->protected_now, pfn)) return;
    zb_bit_clear(r->protected_now, pfn);
    if ((unsigned)r->level[pfn] < PROTECT_LEVEL_MAX) r->level[pfn]++;
}

void zb_reprotect_pass_begin(zb_memory *m) {
    zb_reprotect *r = m->reprotect;
    if (!r) return;
    r->unchanged_last_pass = r->unchanged_this_pass;
    r->unchanged_this_pass = 0;
}

int zb_reprotect_unchanged(zb_memory *m, uint64_t pfn, int logged) {
    m->unchanged_finds++;
    zb_reprotect *r = state_of(m);
    if (!r) { m->pages_reprotected++; return 1; }
    if (logged) came_back(r, pfn);
    r->unchanged_this_pass++;
    unsigned limit = r->unchanged_last_pass > MAX_WRITABLE_UNCHANGED ? PROTECT_AFTER
                                                                     : (unsigned)PROTECT_AFTER << r->level[pfn];
    if (++r->runs[pfn] < limit) return 0;
    r->runs[pfn] = 0;
    zb_bit_set(r->protected_now, pfn);
    m->pages_reprotected++;
    return 1;
}

void zb_reprotect_changed(zb_memory *m, uint64_t pfn, int logged) {
    zb_reprotect *r = m->reprotect;
    if (!r) return;
    if (logged) came_back(r, pfn);
    r->runs[pfn] = 0;
}
