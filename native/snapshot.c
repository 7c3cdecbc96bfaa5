/* snapshot.c - snapshots of sandboxes, forks from them, and restoring a sandbox in place.
 *
 * A snapshot's memory is its base image (a template's memory file, or nothing = zeros) plus, per
 * 2 MiB chunk, the pages that differ from it. Those pages live in stores (memfds); a snapshot
 * copies only the pages its sandbox changed since the previous snapshot (KVM's dirty log + the
 * engine's own writes) and shares every other chunk with that previous snapshot, so a chain of
 * per-cell checkpoints costs what the cells wrote.
 *
 * A fork maps the image copy-on-write and applies the snapshot's pages (long runs are mapped from
 * the store, short ones copied). A restore applies only the pages that can differ: those written
 * since the sandbox's base snapshot and those where the two snapshots' chunks differ. So
 * resetting a sandbox after a cell costs what the cell wrote, and its other pages stay warm.
 */
#include "util.h"
#include "memory.h"
#include "shared_map_state.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "shared_map.h"
#include "sandbox.h"
#include "snapshot.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- stores and chunks ---- */

/* Snapshots taken in this process (zb_snapshot_take), the clock of a store's age. */
static atomic_uint_fast64_t snapshots_taken;

static zb_store *store_new(uint64_t npages, char *err) {
    zb_store *s = calloc(1, sizeof *s);
    if (!s) { zb_seterr(err, "out of memory"); return NULL; }
    atomic_init(&s->refs, 1);
    s->npages = npages;
    s->born = atomic_load(&snapshots_taken);
    if (!(s->page_refs = calloc(ZB_MAX(npages, 1), sizeof *s->page_refs))) { zb_seterr(err, "out of memory"); free(s); return NULL; }
    s->fd = memfd_create("zeroboot-snapshot", MFD_CLOEXEC);
    if (s->fd < 0 || ftruncate(s->fd, (off_t)(ZB_MAX(npages, 1) * ZB_PAGE)) < 0) {
        zb_seterr(err, "cannot create snapshot store: %s", strerror(errno));
        if (s->fd >= 0) close(s->fd);
        free(s->page_refs);
        free(s);
        return NULL;
    }
    s->map = mmap(NULL, ZB_MAX(npages, 1) * ZB_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->map == MAP_FAILED) {
        zb_seterr(err, "cannot map snapshot store: %s", strerror(errno));
        close(s->fd);
        free(s->page_refs);
        free(s);
        return NULL;
    }
    return s;
}

static void dead_forget(zb_store *s);

static void store_unref(zb_store *s) {
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        dead_forget(s); /* its memfd goes now, and every page with it: nothing left to punch */
        munmap(s->map, ZB_MAX(s->npages, 1) * ZB_PAGE);
        close(s->fd); /* a sandbox that maps some of its pages keeps the memory of those alive */
        free(s->page_refs);
        free(s);
    }
}

void zb_store_hold(zb_store *s) { atomic_fetch_add(&s->refs, 1); }
void zb_store_release(zb_store *s) { store_unref(s); }

/* A page entry starts or stops pointing at a store page. */
static void page_hold(zb_store *s, uint32_t index) {
    atomic_fetch_add(&s->refs, 1);
    if (s->page_refs[index]++ == 0) s->live_pages++;
}

/* Give back the memory of store pages no snapshot uses any more (MADV_REMOVE punches them out of
 * the memfd), so that a store costs its live pages, not every page it was made with: a cell's
 * store keeps a few hundred interpreter pages alive long after the arrays it also holds were
 * replaced, and would otherwise hold those arrays too (issue 23: 400 MB per cell). Safe because
 * no sandbox maps a store page that its base snapshot does not use (see apply_memory and the
 * dead-store copies in zb_sandbox_snapshot). */
static int spare_push(zb_store *s, uint32_t first, uint32_t n);

/* Give n dead pages from first back to the host (their memfd's memory). */
static void store_punch(zb_store *s, uint32_t first, uint32_t n) {
    (void)madvise(s->map + (uint64_t)first * ZB_PAGE, (uint64_t)n * ZB_PAGE, MADV_REMOVE);
}

/* ---- dead store pages given back in batches ----
 *
 * Each run of dead pages punched out costs a madvise and shmem's walk of its page cache, and the
 * runs of small cells are short: the pages a cell rewrites are scattered over the interpreter's
 * memory, so a chained `1+1` cell punched ~75 runs of 1-2 pages, about a fifth of its checkpoint's
 * time (and a session's close ~150 per checkpoint). Dead runs therefore wait on their store until
 * DEAD_BATCH_PAGES of them wait in all (or zb_snapshot_give_back_dead, between cells when idle),
 * and are then punched store by store, sorted and merged with the runs next to them that died in
 * other chunks or later cells; a store that dies meanwhile (its memfd closed) needs no punching at
 * all. At most DEAD_BATCH_PAGES of dead pages (8 MiB) are held this way; a big run (a replaced
 * array's pages) passes the bound at once and is punched in the same call as before. Dead pages
 * are used by no snapshot and mapped by no sandbox (see store_punch's callers), and a waiting run
 * is never handed out again (only spare runs are), so holding them changes nothing anyone sees.
 * Single-threaded, as every snapshot call. */
#define DEAD_BATCH_PAGES 2048
static struct {
    zb_store **stores; /* the stores with waiting runs (each at its dead_slot) */
    size_t n, cap;
    uint64_t pages;    /* dead pages waiting, in all */
} dead_waiting;

static int run_cmp(const void *a, const void *b) {
    const zb_page_run *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* Punch out s's waiting runs, merged where they touch (dead_forget then takes it off the list). */
static void dead_punch_store(zb_store *s) {
    qsort(s->dead, s->ndead, sizeof *s->dead, run_cmp);
    zb_page_run cur = s->dead[0];
    for (uint32_t i = 1; i < s->ndead; i++) {
        if (s->dead[i].first == cur.first + cur.n) { cur.n += s->dead[i].n; continue; }
        store_punch(s, cur.first, cur.n);
        cur = s->dead[i];
    }
    store_punch(s, cur.first, cur.n);
}

/* s has no waiting runs any more: off the list (the last store takes its slot). */
static void dead_forget(zb_store *s) {
    if (s->ndead) {
        zb_store *last = dead_waiting.stores[--dead_waiting.n];
        dead_waiting.stores[s->dead_slot] = last;
        last->dead_slot = s->dead_slot;
        dead_waiting.pages -= s->dead_pages;
    }
    free(s->dead);
    s->dead = NULL;
    s->ndead = s->capdead = 0;
    s->dead_pages = 0;
}

uint64_t zb_snapshot_dead_waiting_bytes(void) { return dead_waiting.pages * ZB_PAGE; }

void zb_snapshot_give_back_dead(void) {
    while (dead_waiting.n) {
        zb_store *s = dead_waiting.stores[dead_waiting.n - 1];
        dead_punch_store(s);
        dead_forget(s);
    }
}

/* n dead pages of s from first: they wait for the next batch (punched now if they cannot). */
static void store_punch_later(zb_store *s, uint32_t first, uint32_t n) {
    if (s->ndead == s->capdead) {
        uint32_t cap = s->capdead ? s->capdead * 2 : 8;
        zb_page_run *grown = realloc(s->dead, cap * sizeof *grown);
        if (!grown) { store_punch(s, first, n); return; }
        s->dead = grown;
        s->capdead = cap;
    }
    if (!s->ndead) {
        if (dead_waiting.n == dead_waiting.cap) {
            size_t cap = dead_waiting.cap ? dead_waiting.cap * 2 : 64;
            zb_store **grown = realloc(dead_waiting.stores, cap * sizeof *grown);
            if (!grown) { store_punch(s, first, n); return; }
            dead_waiting.stores = grown;
            dead_waiting.cap = cap;
        }
        s->dead_slot = dead_waiting.n;
        dead_waiting.stores[dead_waiting.n++] = s;
    }
    s->dead[s->ndead++] = (zb_page_run){first, n};
    s->dead_pages += n;
    dead_waiting.pages += n;
    if (dead_waiting.pages >= DEAD_BATCH_PAGES) zb_snapshot_give_back_dead();
}

static void store_free_pages(zb_store *s, uint32_t first, uint32_t n) {
    if (n && !spare_push(s, first, n)) store_punch_later(s, first, n);
}

/* ---- spare store pages: pages that died just before a snapshot, refilled by it ----
 *
 * A checkpoint after a cell that replaced 400 MB copies 400 MB into fresh shmem pages, and the
 * checkpoint the budget then drops gives 400 MB back: on the test host allocating a fresh page
 * costs ~3x copying into one that exists (400 MB: pwrite into a fresh memfd 0.73-0.79 s, into
 * existing pages 0.27-0.37 s, memcpy of warm memory 0.09 s) and punching it out again costs more
 * still. While kept (zb_snapshot_keep_spare), pages that die are not punched out but kept here,
 * with a reference to their store, and the next snapshot writes its new pages into them; what it
 * does not use is punched out when keeping ends. The session drops the checkpoints the budget
 * would drop anyway, and releases the one that fell past its count (`keep`), just before the
 * snapshot instead of just after it (session.py), so no extra memory is held: the kept pages only
 * exist between that drop and the end of the snapshot. A chained `1+1` cell's checkpoint writes
 * ~360 pages and the released one gives back about as many: 5.4 -> 4.5 ms per checkpoint.
 * A dead page is used by no snapshot, so no sandbox maps it (the same rule that makes punching it
 * out safe): rewriting it changes nothing anyone sees. Single-threaded, as every snapshot call. */
typedef struct { zb_store *store; uint32_t first, n; } spare_run;
static uint64_t spare_reused; /* pages written into spare pages, in this process */
static struct {
    int keeping;
    spare_run *runs;
    size_t nruns, cap, head;  /* runs[head..nruns) still hold pages */
} spare;

/* Keep a run of dead pages of s for the next snapshot; 0 if not keeping (or out of memory). */
static int spare_push(zb_store *s, uint32_t first, uint32_t n) {
    if (!spare.keeping) return 0;
    if (spare.nruns == spare.cap) {
        size_t cap = spare.cap ? spare.cap * 2 : 64;
        spare_run *grown = realloc(spare.runs, cap * sizeof *grown);
        if (!grown) return 0;
        spare.runs = grown;
        spare.cap = cap;
    }
    atomic_fetch_add(&s->refs, 1);
    spare.runs[spare.nruns++] = (spare_run){s, first, n};
    return 1;
}

/* Refilling a store's dead pages keeps the store alive. A store to empty (store_to_empty: mostly
 * dead, or small) is left to die once it is older than this many snapshots: its dead pages are
 * punched out instead, and its live ones are copied out by the snapshots that look for such stores
 * (take_pages), so that stores do not fragment without end (each with a few live pages, an fd and
 * a mapping). Younger ones are refilled: the checkpoint `keep` (20) cells old that a session
 * retires just before its next checkpoint gives back most of its pages, and that checkpoint writes
 * about as many. */
#define SPARE_REFILL_AGE 24
static int store_to_empty(const zb_store *s);

static int store_past_refill_age(const zb_store *s) { return atomic_load(&snapshots_taken) - s->born > SPARE_REFILL_AGE; }

static int spare_refillable(const zb_store *s) { return !store_past_refill_age(s) || !store_to_empty(s); }

/* A kept dead page for a new snapshot's page (the caller takes its own reference with page_set),
 * or 0 when none is left. */
static int spare_take(zb_store **store, uint32_t *index) {
    while (spare.head < spare.nruns && (!spare.runs[spare.head].n || !spare_refillable(spare.runs[spare.head].store))) {
        spare_run *r = &spare.runs[spare.head++];
        if (r->n) store_punch_later(r->store, r->first, r->n);
        store_unref(r->store);
    }
    if (spare.head == spare.nruns) return 0;
    spare_run *r = &spare.runs[spare.head];
    *store = r->store;
    *index = r->first++;
    r->n--;
    spare_reused++;
    return 1;
}

void zb_snapshot_keep_spare(int on) {
    if (on) { spare.keeping = 1; return; }
    spare.keeping = 0;
    for (size_t i = spare.head; i < spare.nruns; i++) {
        spare_run *r = &spare.runs[i];
        store_free_pages(r->store, r->first, r->n); /* not keeping now: punched out */
        store_unref(r->store);
    }
    free(spare.runs);
    memset(&spare, 0, sizeof spare);
}

uint64_t zb_snapshot_spare_reused_bytes(void) { return spare_reused * ZB_PAGE; }

uint64_t zb_snapshot_spare_bytes(void) {
    uint64_t pages = 0;
    for (size_t i = spare.head; i < spare.nruns; i++) pages += spare.runs[i].n;
    return pages * ZB_PAGE;
}

/* Runs of consecutive store pages that died, freed with one madvise each. */
typedef struct { zb_store *store; uint32_t first, n; } dead_run;

static void dead_flush(dead_run *r) {
    if (r->n) store_free_pages(r->store, r->first, r->n);
    r->n = 0;
}

static void dead_add(dead_run *r, zb_store *s, uint32_t index) {
    if (r->n && r->store == s && index == r->first + r->n) { r->n++; return; }
    dead_flush(r);
    *r = (dead_run){s, index, 1};
}

/* One page entry less points at store page `index`; a page nobody uses goes into `run`. */
static void page_release(zb_store *s, uint32_t index, dead_run *run) {
    if (--s->page_refs[index] == 0) {
        s->live_pages--;
        dead_add(run, s, index);
    }
}

static void page_drop(zb_store *s, uint32_t index) {
    if (!s) return;
    dead_run run = {0};
    page_release(s, index, &run);
    dead_flush(&run);
    store_unref(s);
}

/* Fewer than half of the store's pages are still used by any snapshot. */
static int store_mostly_dead(const zb_store *s) { return 2 * s->live_pages < s->npages; }

static void chunk_unref(zb_chunk *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    /* first free the pages that died (their stores are still alive), then let go of the stores */
    dead_run run = {0};
    for (int i = 0; i < CHUNK_PAGES; i++)
        if (c->page[i].store) page_release(c->page[i].store, c->page[i].index, &run);
    dead_flush(&run);
    for (int i = 0; i < CHUNK_PAGES; i++) store_unref(c->page[i].store);
    free(c);
}

/* A private copy of a chunk (NULL = all image) that the caller may change. */
static zb_chunk *chunk_copy(const zb_chunk *src) {
    zb_chunk *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->refs, 1);
    if (src) {
        memcpy(c->page, src->page, sizeof c->page);
        for (int i = 0; i < CHUNK_PAGES; i++)
            if (c->page[i].store) page_hold(c->page[i].store, c->page[i].index);
    }
    return c;
}

static void page_set(zb_page *p, uint32_t kind, zb_store *store, uint32_t index) {
    if (store) page_hold(store, index);
    page_drop(p->store, p->index);
    p->store = store;
    p->index = index;
    p->kind = kind;
}

static const zb_page image_page = {NULL, 0, PAGE_IMAGE};

const zb_page *zb_snapshot_page(const zb_snapshot *s, uint64_t pfn) {
    const zb_chunk *c = s ? s->chunks[pfn / CHUNK_PAGES] : NULL;
    return c ? &c->page[pfn % CHUNK_PAGES] : &image_page;
}

static int page_is_zero(const uint8_t *p) {
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < ZB_PAGE / 8; i++)
        if (w[i]) return 0;
    return 1;
}

/* Does the guest page pfn of m hold what entry p says? -1: cannot tell cheaply (no image view). */
static int page_holds(const zb_memory *m, const zb_page *p, uint64_t pfn) {
    const uint8_t *now = m->host + pfn * ZB_PAGE;
    switch (p->kind) {
    case PAGE_ZERO: return page_is_zero(now);
    case PAGE_STORED: return !memcmp(now, p->store->map + (uint64_t)p->index * ZB_PAGE, ZB_PAGE);
    default:
        if (zb_image_page_is_hole(m->image, pfn)) return page_is_zero(now); /* without reading the hole */
        return m->image && m->image->map ? !memcmp(now, m->image->map + pfn * ZB_PAGE, ZB_PAGE) : -1;
    }
}

/* ---- the sandbox state next to memory ---- */

void zb_guest_state_free(zb_guest_state *st) {
    zb_cpu_free(&st->cpu);
    zb_threads_free(&st->threads);
    zb_uart_destroy(&st->uart);
    zb_fdtable_free(st->fds, NULL); /* the fs goes too: no open counts to keep */
    zb_fs_free(st->fs);
    zb_mem_meta_free(&st->mem);
    zb_lost_children_free(&st->lost);
    memset(st, 0, sizeof *st);
}

/* Copy a sandbox's (or a snapshot's) non-memory state: each component clones its own. */
static int state_copy(zb_guest_state *dst, const zb_cpu *cpu, const zb_signals *sig, const zb_threads *threads,
                      const zb_process *proc, const zb_uart *uart, uint64_t vdso_data, const zb_fs *fs,
                      const zb_fdtable *fds, size_t xsave_size) {
    memset(dst, 0, sizeof *dst);
    zb_signals_clone(&dst->sig, sig);
    zb_process_clone(&dst->proc, proc);
    dst->vdso_data = vdso_data;
    if (zb_cpu_clone(&dst->cpu, cpu, xsave_size) < 0 || zb_threads_clone(&dst->threads, threads, xsave_size) < 0 ||
        zb_uart_clone(&dst->uart, uart) < 0 ||
        !(dst->fs = zb_fs_clone(fs)) || !(dst->fds = zb_fdtable_clone(fds))) {
        zb_guest_state_free(dst);
        return -1;
    }
    return 0;
}

/* Replace the sandbox's non-memory state with a copy of the snapshot's. */
static int state_apply(zb_sandbox *sb, const zb_guest_state *st, char *err) {
    zb_guest_state fresh;
    if (state_copy(&fresh, &st->cpu, &st->sig, &st->threads, &st->proc, &st->uart, st->vdso_data, st->fs, st->fds,
                   sb->engine->xsave_size) < 0) {
        zb_seterr(err, "out of memory restoring sandbox state");
        return -1;
    }
    if (zb_mem_meta_apply(&sb->mem, &st->mem) < 0) {
        zb_guest_state_free(&fresh);
        zb_seterr(err, "out of memory restoring sandbox state");
        return -1;
    }
    zb_sandbox_free_state(sb);
    zb_cpu_free(&sb->cpu);
    zb_uart_destroy(&sb->uart);
    fresh.threads.max_threads = sb->threads.max_threads; /* a setting of this sandbox, not captured state */
    zb_threads_free(&sb->threads);
    sb->cpu = fresh.cpu;
    sb->sig = fresh.sig;
    sb->threads = fresh.threads;
    sb->proc = fresh.proc;
    sb->uart = fresh.uart;
    sb->vdso_data = fresh.vdso_data;
    sb->fs = fresh.fs;
    sb->fds = fresh.fds;
    return 0;
}

/* ---- applying pages to a sandbox's mapping, in runs ---- */

typedef struct {
    zb_sandbox *sb;
    uint64_t start, len;   /* current run, in pages */
    zb_page kind;          /* what the run becomes (store/index of its first page) */
    int error;
} run_batch;

static void flush_run(run_batch *b) {
    if (!b->len || b->error) { b->len = 0; return; }
    zb_memory *m = &b->sb->mem;
    uint64_t addr = b->start * ZB_PAGE, bytes = b->len * ZB_PAGE;
    int rc = 0;
    /* Short runs are rewritten in place: the pages stay mapped (in the host and in KVM's shadow
     * page tables), so the guest does not pay a 10-20 us fault when it touches them again, which
     * it usually does (a cell's working set). Long runs give their memory back instead. Image
     * pages are copied from the image's read-only view (a pooled reset rewrites ~1,000 of them in
     * runs of a few pages: one pread each cost a syscall and a page-cache lookup per page, a third
     * of the restore); holes are zeroed without reading them, so the view never faults a page
     * into a hole of the image file. */
    int in_place = b->len <= MAX_INPLACE_RUN;
    switch (b->kind.kind) {
    case PAGE_IMAGE:
        if (in_place && m->image && m->image->map && addr + bytes <= m->image->size) {
            for (uint64_t k = 0; k < b->len; k++) {
                uint64_t pfn = b->start + k;
                if (zb_image_page_is_hole(m->image, pfn)) memset(m->host + pfn * ZB_PAGE, 0, ZB_PAGE);
                else memcpy(m->host + pfn * ZB_PAGE, m->image->map + pfn * ZB_PAGE, ZB_PAGE);
            }
        } else if (in_place && m->image) {
            if (pread(m->image->fd, m->host + addr, bytes, (off_t)addr) != (ssize_t)bytes) rc = -EIO;
        } else {
            rc = zb_mem_revert_to_image(m, addr, bytes);
        }
        break;
    case PAGE_ZERO:
        if (in_place) memset(m->host + addr, 0, bytes);
        else rc = zb_mem_zero(m, addr, bytes);
        break;
    case PAGE_STORED:
        if (b->len >= MIN_MAP_RUN) {
            void *p = mmap(m->host + addr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
                           b->kind.store->fd, (off_t)b->kind.index * (off_t)ZB_PAGE);
            if (p == MAP_FAILED) rc = -errno;
            zb_bits_set_range(m->file_backed, b->start, b->len, 1);
            zb_bits_set_range(m->from_image, b->start, b->len, 0);
        } else {
            memcpy(m->host + addr, b->kind.store->map + (uint64_t)b->kind.index * ZB_PAGE, bytes);
        }
        break;
    }
    if (rc < 0) b->error = rc;
    b->len = 0;
}

static void add_page(run_batch *b, uint64_t pfn, const zb_page *p) {
    if (b->len && pfn == b->start + b->len && p->kind == b->kind.kind &&
        (p->kind != PAGE_STORED || (p->store == b->kind.store && p->index == b->kind.index + b->len))) {
        b->len++;
        return;
    }
    flush_run(b);
    b->start = pfn;
    b->len = 1;
    b->kind = *p;
}

static int page_same(const zb_page *a, const zb_page *b) {
    return a->kind == b->kind && (a->kind != PAGE_STORED || (a->store == b->store && a->index == b->index));
}

/* Make the sandbox's memory equal to snap's, where it can differ: pages written since its base
 * snapshot, and pages where base and snap disagree. With `protect` (a restore of a sandbox whose
 * logged pages were left writable), pages that already hold snap's content are left alone, so they
 * stay mapped and writable; those found so several times in a row are marked in `protect` to be
 * write-protected again. */
static int apply_memory(zb_sandbox *sb, const zb_snapshot *base, const zb_snapshot *snap, uint64_t *protect,
                        char *err) {
    run_batch b = {.sb = sb};
    zb_memory *m = &sb->mem;
    const uint64_t *dirty = m->host_dirty;
    if (protect) zb_reprotect_pass_begin(m);
    for (uint64_t c = 0; c < snap->nchunks; c++) {
        const zb_chunk *bc = base ? base->chunks[c] : NULL, *nc = snap->chunks[c];
        /* the same chunk table: only the dirty pages can differ, so only those are visited */
        uint64_t visit[CHUNK_PAGES / 64], any = 0;
        for (int w = 0; w < CHUNK_PAGES / 64; w++)
            any |= visit[w] = bc == nc ? dirty[c * (CHUNK_PAGES / 64) + w] : ~0ull;
        for (int w = 0; any && w < CHUNK_PAGES / 64; w++) for (uint64_t bits = visit[w]; bits; bits &= bits - 1) {
            uint64_t pfn = c * CHUNK_PAGES + (uint64_t)w * 64 + (uint64_t)__builtin_ctzll(bits);
            const zb_page *want = zb_snapshot_page(snap, pfn);
            if (!zb_bit(dirty, pfn) && page_same(zb_snapshot_page(base, pfn), want)) continue;
            /* a page mapped from a file other than the image may be a store page that `snap` does
             * not use (and that may be freed later): it is rewritten, never left alone */
            int foreign = zb_bit(m->file_backed, pfn) && !zb_bit(m->from_image, pfn);
            if (protect && !foreign && page_holds(m, want, pfn) == 1) {
                if (zb_reprotect_unchanged(m, pfn, zb_bit(dirty, pfn))) zb_bit_set(protect, pfn);
                continue;
            }
            zb_reprotect_changed(m, pfn, zb_bit(dirty, pfn));
            add_page(&b, pfn, want);
        }
    }
    flush_run(&b);
    if (b.error) {
        zb_seterr(err, "cannot rebuild guest memory: %s", strerror(-b.error));
        return -1;
    }
    memset(sb->mem.host_dirty, 0, ((sb->mem.npages + 63) / 64) * sizeof(uint64_t));
    return 0;
}

/* Make sb's memory, based on `from`, equal to snap's in place: what a restore and a fork onto
 * parked memory share. vm is the executor attached to sb, or NULL: attached, with manual
 * dirty-log protection, logged pages stay writable and are compared instead of all rewritten (a
 * page rewritten by the host stays mapped too), and those found unchanged several times are
 * write-protected again. Returns 0; -1 with err and the memory as it was; -2 with err and the
 * memory half rewritten (then memory_unknown is set). */
static int restore_memory(zb_sandbox *sb, zb_vm *vm, const zb_snapshot *from, const zb_snapshot *snap, char *err) {
    uint64_t *protect = vm && vm->manual_protect ? calloc((sb->mem.npages + 63) / 64, sizeof *protect) : NULL;
    if (vm && zb_vm_collect_dirty(vm, protect != NULL, err) < 0) { free(protect); return -1; }
    int released = zb_mem_release_stale(&sb->mem);
    if (released < 0) {
        free(protect);
        zb_seterr(err, "cannot give back freed guest memory: %s", strerror(-released));
        return -1;
    }
    if (apply_memory(sb, from, snap, protect, err) < 0) {
        free(protect);
        sb->memory_unknown = 1;
        return -2;
    }
    zb_mem_forget_dropped(&sb->mem); /* they held from's content, or were in the dirty set: snap's now */
    char ignored[ZB_ERRLEN];  /* if this fails the pages stay in the log: only slower */
    if (protect) (void)zb_vm_protect_pages(vm, protect, ignored);
    free(protect);
    return 0;
}

/* ---- public API ---- */

static void snapshot_free(zb_snapshot *s) {
    for (uint64_t c = 0; c < s->nchunks; c++) chunk_unref(s->chunks[c]);
    free(s->chunks);
    store_unref(s->own);
    free(s->ws);
    zb_image_unref(s->image);
    zb_guest_state_free(&s->st);
    free(s);
}

/* The page records of a spilled checkpoint (u64 words `index << 1 | zero`, as zb_snapshot_save_delta
 * writes them, and the stored pages' contents) into s, whose chunks are all still the image's. They
 * come from a file: every index must be within guest memory and above the one before, and the
 * stored pages as many as the record holds, before anything is allocated. */

/* Page record number `count` names a page of the guest, after the one before it. */
static int record_ok(uint64_t word, uint64_t count, uint64_t *last, uint64_t npages, char *err) {
    uint64_t index = word >> 1;
    if (index >= npages || (count && index <= *last)) {
        zb_seterr(err, "the saved pages are corrupt (record %llu names page %llu of %llu)",
                  (unsigned long long)count, (unsigned long long)index, (unsigned long long)npages);
        return -1;
    }
    *last = index;
    return 0;
}

/* The snapshot's page `index` is a zero page (contents NULL) or page `used` of its own store. */
static int set_record(zb_snapshot *s, uint64_t word, uint64_t used, char *err) {
    uint64_t index = word >> 1, c = index / CHUNK_PAGES;
    if (!s->chunks[c] && !(s->chunks[c] = chunk_copy(NULL))) { zb_seterr(err, "out of memory"); return -1; }
    zb_page *p = &s->chunks[c]->page[index % CHUNK_PAGES];
    if (word & 1) page_set(p, PAGE_ZERO, NULL, 0);
    else page_set(p, PAGE_STORED, s->own, (uint32_t)used);
    return 0;
}

int zb_snapshot_fill_index(zb_snapshot *s, const uint8_t *words, uint64_t nwords, uint64_t stored, int fd,
                           int direct_fd, uint64_t offset, zb_mac *mac, char *err) {
    uint64_t npages = s->nchunks * CHUNK_PAGES, nstored = 0, last = 0;
    if (nwords > npages) { zb_seterr(err, "the saved pages are more than the guest's memory"); return -1; }
    for (uint64_t i = 0; i < nwords; i++) {
        uint64_t word;
        memcpy(&word, words + 8 * i, 8);
        if (record_ok(word, i, &last, npages, err) < 0) return -1;
        nstored += !(word & 1);
    }
    if (nstored != stored) { zb_seterr(err, "the saved pages are corrupt (the index names another number of pages)"); return -1; }
    if (!(s->own = store_new(nstored, err))) return -1;
    int from = direct_fd >= 0 ? direct_fd : fd;
    for (uint64_t done = 0, total = nstored * ZB_PAGE; done < total;) { /* straight into the store */
        ssize_t k = pread(from, s->own->map + done, total - done, (off_t)(offset + done));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && from != fd) { /* a file system that takes no O_DIRECT read like this one */
            from = fd;
            continue;
        }
        if (k <= 0) {
            zb_seterr(err, "cannot read the saved pages: %s", k < 0 ? strerror(errno) : "the file is shorter (truncated)");
            return -1;
        }
        done += (uint64_t)k;
    }
    if (mac && zb_mac_update(mac, s->own->map, nstored * ZB_PAGE) < 0) { zb_seterr(err, "the MAC failed"); return -1; }
    for (uint64_t i = 0, used = 0; i < nwords; i++) {
        uint64_t word;
        memcpy(&word, words + 8 * i, 8);
        if (set_record(s, word, used, err) < 0) return -1;
        used += !(word & 1);
    }
    s->state_bytes = zb_fdtable_copy_bytes(s->st.fds) + s->st.uart.rx_cap + s->st.uart.tx_cap;
    return 0;
}

void zb_snapshot_release(zb_snapshot *s) {
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) snapshot_free(s);
}

uint64_t zb_snapshot_private_bytes(zb_snapshot *s) {
    if (!s) return 0;
    /* the overlay's metadata is shared copy-on-write: what only this snapshot holds changes as the
     * sandbox and later snapshots copy chunks, so it is counted now */
    return (s->own ? s->own->npages * ZB_PAGE : 0) + s->state_bytes + zb_ovl_private_bytes(s->st.fs);
}

/* Each call is one pass: chunks visited in it carry its number, so a chunk shared by many
 * snapshots is walked once, and each store met gets a bitmap of the pages the pass counted, so a
 * page shared by many snapshots is counted once. Single-threaded, as every snapshot call. */
static uint64_t memory_pass;

uint64_t zb_snapshots_memory(zb_snapshot **snaps, size_t n) {
    uint64_t pass = ++memory_pass, pages = 0;
    zb_store **met = NULL;
    size_t nmet = 0, capmet = 0;
    for (size_t i = 0; i < n; i++) {
        zb_snapshot *s = snaps[i];
        for (uint64_t c = 0; s && c < s->nchunks; c++) {
            zb_chunk *ch = s->chunks[c];
            if (!ch || ch->seen == pass) continue;
            ch->seen = pass;
            for (int p = 0; p < CHUNK_PAGES; p++) {
                zb_store *st = ch->page[p].store;
                if (!st) continue;
                if (st->seen != pass) {
                    if (nmet == capmet) {
                        size_t cap = capmet ? capmet * 2 : 64;
                        zb_store **grown = realloc(met, cap * sizeof *grown);
                        if (!grown) goto out;  /* cannot happen in practice; the count is then low */
                        met = grown;
                        capmet = cap;
                    }
                    free(st->counted);
                    if (!(st->counted = calloc((st->npages + 63) / 64, sizeof(uint64_t)))) goto out;
                    st->seen = pass;
                    met[nmet++] = st;
                }
                uint32_t idx = ch->page[p].index;
                if (!zb_bit(st->counted, idx)) { zb_bit_set(st->counted, idx); pages++; }
            }
        }
    }
out:
    for (size_t i = 0; i < nmet; i++) { free(met[i]->counted); met[i]->counted = NULL; }
    free(met);
    return pages * ZB_PAGE;
}

/* Bring the sandbox's dirty set and XSAVE image up to date from the VM it is attached to. */
static int sync_from_vm(zb_sandbox *sb, char *err) {
    zb_vm *vm = zb_vm_of(sb);
    if (!vm || vm->attached != sb) return 0;
    if (zb_vm_collect_dirty(vm, 1, err) < 0) return -1;
    return sb->finished ? 0 : zb_vm_save_xsave(vm, sb, err);
}

int64_t zb_sandbox_pending_bytes(zb_sandbox *sb, char *err) {
    if (sync_from_vm(sb, err) < 0) return -1;
    uint64_t pages = 0, words = (sb->mem.npages + 63) / 64;
    for (uint64_t w = 0; w < words; w++) pages += (uint64_t)__builtin_popcountll(sb->mem.host_dirty[w] & sb->mem.allocated[w]);
    return (int64_t)(pages * ZB_PAGE);
}

/* Take out of the sandbox's dirty set the pages whose content is still that of its base snapshot,
 * and return those to write-protect again (a bitmap, or NULL when there is nothing to compare or no
 * memory). The dirty set holds pages written since the base, and also pages the guest may have
 * written: those left writable after earlier snapshots (manual dirty-log protection). A page whose
 * content did not change costs the new snapshot nothing when it is shared with the base. Only
 * allocated pages are compared: a freed page must become a zero page. */
static uint64_t *drop_unchanged_pages(zb_sandbox *sb) {
    if (!sb->base) return NULL;
    zb_memory *m = &sb->mem;
    uint64_t words = (m->npages + 63) / 64, *dirty = m->host_dirty;
    uint64_t *protect = calloc(words, sizeof *protect);
    if (!protect) return NULL;
    zb_reprotect_pass_begin(m);
    for (uint64_t w = 0; w < words; w++) {
        for (uint64_t bits = dirty[w] & m->allocated[w]; bits; bits &= bits - 1) {
            uint64_t pfn = w * 64 + (uint64_t)__builtin_ctzll(bits);
            if (page_holds(m, zb_snapshot_page(sb->base, pfn), pfn) != 1) {
                zb_reprotect_changed(m, pfn, 1);
                continue;
            }
            zb_bit_clear(dirty, pfn);
            if (zb_reprotect_unchanged(m, pfn, 1)) zb_bit_set(protect, pfn);
        }
    }
    return protect;
}

/* A store whose used pages a new snapshot copies into its own store instead of sharing them, so
 * that it goes away once the older snapshots that still use it are released: one that is mostly
 * dead (fewer than half of its pages still used), or a small one past the refill age (a snapshot
 * whose new pages mostly went into spare pages makes a store of the few left over; if those stay
 * used, such stores add up, one per cell: 47 -> 137 memfds over 600 cells). */
#define STORE_SMALL_PAGES 256
static int store_to_empty(const zb_store *s) {
    return store_mostly_dead(s) || (s->npages < STORE_SMALL_PAGES && store_past_refill_age(s));
}

/* The pages a new snapshot s stores itself: those its sandbox wrote since the previous snapshot,
 * and those it would otherwise share from a store to empty. A store lives while any page of it is
 * used, so without the second kind one page that no later cell rewrites keeps a whole cell's store
 * alive for the session: a soak of 10,000 cells grew the engine by 1.2 GiB per 1,000 cells. */
static uint64_t *take_pages(const zb_snapshot *s, const uint64_t *dirty, uint64_t words, int look_for_dead) {
    uint64_t *take = malloc(words * sizeof *take);
    if (!take) return NULL;
    memcpy(take, dirty, words * sizeof *take);
    for (uint64_t c = 0; look_for_dead && c < s->nchunks; c++) {
        const zb_chunk *ch = s->chunks[c];
        for (uint64_t i = 0; ch && i < CHUNK_PAGES; i++) {
            const zb_page *p = &ch->page[i];
            if (p->kind == PAGE_STORED && store_to_empty(p->store)) zb_bit_set(take, c * CHUNK_PAGES + i);
        }
    }
    return take;
}

/* Pages going into a new store, written with pwritev in batches of consecutive store pages whose
 * sources may lie anywhere in guest memory (consecutive sources share an iovec). Copying through
 * the store's shared mapping costs a page fault per fresh shmem page, in which the kernel also
 * zeroes the page: on the nested test host 400 MB took 4.9-5.3 s that way and 1.5-1.7 s with pwrite
 * of 1 MiB runs (the write path allocates without faulting and skips the zeroing of pages it
 * fills whole). One call per batch, not per run of consecutive guest pages: a chained `1+1`
 * cell's checkpoint made ~250 pwrite calls, a process fork's ~27. */
typedef struct {
    int fd;               /* the batch's store */
    uint64_t index, len;  /* store page of the batch's first page; pages in the batch */
    struct iovec iov[STORE_WRITE_RUN];
    int niov;
    int error;
} store_writer;

static void store_write_flush(store_writer *w) {
    struct iovec *iov = w->iov;
    int n = w->niov;
    off_t at = (off_t)(w->index * ZB_PAGE);
    while (!w->error && n > 0) {
        ssize_t got = pwritev(w->fd, iov, n, at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) { w->error = got < 0 ? errno : EIO; break; }
        at += got;
        for (; n > 0 && (size_t)got >= iov->iov_len; iov++, n--) got -= (ssize_t)iov->iov_len;
        if (n > 0) { iov->iov_base = (uint8_t *)iov->iov_base + got; iov->iov_len -= (size_t)got; }
    }
    w->len = 0;
    w->niov = 0;
}

/* Copy the page at src into page index of the store with file fd. */
static void store_write(store_writer *w, int fd, const uint8_t *src, uint64_t index) {
    if (!w->len || fd != w->fd || index != w->index + w->len || w->len >= STORE_WRITE_RUN) {
        store_write_flush(w);
        w->fd = fd;
        w->index = index;
    }
    struct iovec *last = w->niov ? &w->iov[w->niov - 1] : NULL;
    if (last && (const uint8_t *)last->iov_base + last->iov_len == src) last->iov_len += ZB_PAGE;
    else w->iov[w->niov++] = (struct iovec){(void *)(uintptr_t)src, ZB_PAGE};
    w->len++;
}

zb_snapshot *zb_snapshot_take(zb_sandbox *sb, char *err) {
    if (sb->finished) { zb_seterr(err, "cannot snapshot a sandbox that has finished"); return NULL; }
    if (sync_from_vm(sb, err) < 0) return NULL;
    /* An exec'd process's dropped pages are free: a zero page each in this snapshot (memory.h) */
    int released = zb_mem_release_dropped(&sb->mem);
    if (released < 0) {
        zb_seterr(err, "cannot give back the memory of the program the process executed before: %s", strerror(-released));
        return NULL;
    }
    /* Freed pages kept for reuse (zb_mem_free_for_reuse) stay kept: they are logged as written and
     * not allocated, so this snapshot records them as zero pages, and whoever allocates them again
     * zeroes them first. The next cell's first big array then reuses the last cell's freed one. */
    uint64_t *protect = drop_unchanged_pages(sb);
    zb_mem_window_observe(&sb->mem); /* which parts of the unlogged window held still */
    zb_snapshot *s = calloc(1, sizeof *s);
    if (!s) { free(protect); zb_seterr(err, "out of memory"); return NULL; }
    atomic_init(&s->refs, 1);
    s->engine = sb->engine;
    s->image = sb->mem.image;
    zb_image_ref(s->image);
    s->mem_size = sb->mem.size;
    s->nchunks = sb->mem.npages / CHUNK_PAGES;
    uint8_t *copied = calloc(s->nchunks, 1);
    s->chunks = calloc(s->nchunks, sizeof *s->chunks);
    if (!copied || !s->chunks) { free(copied); zb_seterr(err, "out of memory"); goto fail; }
    for (uint64_t c = 0; c < s->nchunks; c++) {
        s->chunks[c] = sb->base ? sb->base->chunks[c] : NULL;
        if (s->chunks[c]) atomic_fetch_add(&s->chunks[c]->refs, 1);
    }
    const uint64_t *dirty = sb->mem.host_dirty, words = (sb->mem.npages + 63) / 64;
    /* looking costs a pass over every chunk (~0.2 ms), so only every 8th snapshot looks */
    uint64_t *take = take_pages(s, dirty, words, sb->snapshots_taken++ % 8 == 0), ntake = 0;
    atomic_fetch_add(&snapshots_taken, 1);
    if (!take) { free(copied); zb_seterr(err, "out of memory"); goto fail; }
    for (uint64_t w = 0; w < words; w++) ntake += (uint64_t)__builtin_popcountll(take[w]);
    if (!(s->own = store_new(ntake, err))) { free(copied); free(take); goto fail; }
    uint64_t used = 0, nnew = 0, mapped_fresh = 0;
    store_writer out = {.fd = -1};
    /* The guest's changed pages get their store pages after the old base is let go: if the session
     * dropped it, its pages that this snapshot does not share die then, and with kept spare pages
     * (zb_snapshot_keep_spare) the new pages are written into them instead of fresh ones. */
    typedef struct { zb_page *entry; uint64_t pfn; } new_page;
    new_page *fresh = malloc(ZB_MAX(ntake, 1) * sizeof *fresh);
    if (!fresh) { free(copied); free(take); zb_seterr(err, "out of memory"); goto fail; }
    for (uint64_t w = 0; w < words; w++) {
        for (uint64_t bits = take[w]; bits; bits &= bits - 1) {
            uint64_t pfn = w * 64 + (uint64_t)__builtin_ctzll(bits), c = pfn / CHUNK_PAGES;
            if (!copied[c]) {
                zb_chunk *nc = chunk_copy(s->chunks[c]);
                if (!nc) { free(copied); free(take); free(fresh); zb_seterr(err, "out of memory"); goto fail; }
                chunk_unref(s->chunks[c]);
                s->chunks[c] = nc;
                copied[c] = 1;
            }
            zb_page *p = &s->chunks[c]->page[pfn % CHUNK_PAGES];
            if (!zb_bit(dirty, pfn)) { /* unchanged, but its store is to be emptied: take a copy */
                const uint8_t *old = p->store->map + (uint64_t)p->index * ZB_PAGE;
                store_write(&out, s->own->fd, old, used);
                /* The sandbox may map the old store page itself (a restore maps long runs): give it
                 * a private copy, as the old page is freed once older snapshots let go of it. */
                if (zb_bit(sb->mem.file_backed, pfn) && !zb_bit(sb->mem.from_image, pfn))
                    memcpy(sb->mem.host + pfn * ZB_PAGE, old, ZB_PAGE);
                page_set(p, PAGE_STORED, s->own, (uint32_t)used);
                used++;
                continue;
            }
            const uint8_t *src = sb->mem.host + pfn * ZB_PAGE;
            page_set(p, PAGE_ZERO, NULL, 0); /* freed or zero: costs no store page */
            if (zb_bit(sb->mem.allocated, pfn) && !page_is_zero(src)) {
                fresh[nnew++] = (new_page){p, pfn};
                /* still mapped from a file other than the image: it may be a store page that dies
                 * below (a restore maps long runs), which the sandbox would then read rewritten */
                if (zb_bit(sb->mem.file_backed, pfn) && !zb_bit(sb->mem.from_image, pfn)) mapped_fresh++;
            }
        }
    }
    store_write_flush(&out);
    free(copied);
    free(take);
    if (out.error) { free(fresh); zb_seterr(err, "cannot write the snapshot's pages: %s", strerror(out.error)); goto fail; }
    if (state_copy(&s->st, &sb->cpu, &sb->sig, &sb->threads, &sb->proc, &sb->uart, sb->vdso_data, sb->fs, sb->fds,
                   sb->engine->xsave_size) < 0 ||
        zb_mem_meta_capture(&sb->mem, &s->st.mem) < 0) {
        free(fresh);
        zb_seterr(err, "out of memory copying sandbox state");
        goto fail;
    }
    s->state_bytes = zb_fdtable_copy_bytes(s->st.fds) + s->st.uart.rx_cap + s->st.uart.tx_cap;
    memset(sb->mem.host_dirty, 0, words * sizeof(uint64_t));
    atomic_fetch_add(&s->refs, 1);
    zb_snapshot_release(sb->base);
    sb->base = s;
    for (uint64_t i = 0; i < nnew; i++) {
        zb_store *dst;
        uint32_t index;
        /* with such pages, spare pages are not reused: they are punched out, as without keeping */
        if (mapped_fresh || !spare_take(&dst, &index)) { dst = s->own; index = (uint32_t)used++; }
        store_write(&out, dst->fd, sb->mem.host + fresh[i].pfn * ZB_PAGE, index);
        page_set(fresh[i].entry, PAGE_STORED, dst, index);
    }
    store_write_flush(&out);
    if (out.error) {
        /* The sandbox's base now has wrong pages there: mark them changed, so that the next snapshot
         * stores them again and a restore rewrites them; this snapshot is not handed out. */
        for (uint64_t i = 0; i < nnew; i++) zb_bit_set(sb->mem.host_dirty, fresh[i].pfn);
        free(fresh);
        free(protect);
        zb_snapshot_release(s);
        zb_seterr(err, "cannot write the snapshot's pages: %s", strerror(out.error));
        return NULL;
    }
    free(fresh);
    if (!used) { /* every page went into spare pages or needs none: no store of its own */
        store_unref(s->own);
        s->own = NULL;
    } else if (used < ntake) { /* give back the store pages zero pages and spare pages left unused */
        /* the tail holds no data (a hole of the memfd): if the shrink fails it only stays counted */
        if (ftruncate(s->own->fd, (off_t)(ZB_MAX(used, 1) * ZB_PAGE)) == 0) {
            munmap(s->own->map + ZB_MAX(used, 1) * ZB_PAGE, (ntake - ZB_MAX(used, 1)) * ZB_PAGE);
            s->own->npages = used;
        }
    }
    /* Pages found unchanged several times in a row are write-protected again, so that a later write
     * is logged; the others stay writable and stay in KVM's log, to be compared at the next
     * snapshot. If this fails they stay in the log too, which is only slower. */
    zb_vm *vm = zb_vm_of(sb);
    char ignored[ZB_ERRLEN];
    if (protect && vm && vm->attached == sb) (void)zb_vm_protect_pages(vm, protect, ignored);
    free(protect);
    zb_vm_sync_window(vm, sb, 1); /* window parts that held still are logged from now on */
    return s;
fail:
    free(protect);
    snapshot_free(s);
    return NULL;
}

/* ---- parked memory: a freed sandbox's memory kept for the next fork ----
 * A fork gets a new host mapping of guest memory, and the VM it runs on new memslots, for which
 * KVM has no shadow page tables: on this nested host each page the fork touches first costs a
 * shadow fault (20-40 us), ~2,800 for a new fork's first cell, ~950 for a child process's run.
 * So a freed sandbox's memory that an executor's memslots still map is parked on that executor
 * (one per executor), and the next fork of a snapshot with the same memory image takes it
 * instead: the memory is made equal to the snapshot in place, as zb_sandbox_restore does (every
 * page the old sandbox or its base may have changed is rewritten or compared), and the fork runs
 * with the shadow pages of everything the old one touched. Forks of process 1 (sessions) take
 * the main executor's parked memory, forks of child processes a children's executor's. */

static zb_vm *executor_of(zb_engine *e, int i) { return i == 0 ? e->vm : e->child_vms[i - 1]; }

/* A memory with more pages of its own than this is not parked: what parked memory holds (one per
 * executor, up to nine) and what the fork that takes it rewrites stay bounded (64 MiB). A pool
 * worker or a session that built big data gives its memory back when it ends, as before. */
#define PARK_MAX_OWN_PAGES 16384u

/* Pages of snap that are not the image's and hold data (a store page each). */
static uint64_t stored_pages(const zb_snapshot *snap) {
    uint64_t n = 0;
    for (uint64_t c = 0; c < snap->nchunks; c++)
        for (int i = 0; snap->chunks[c] && i < CHUNK_PAGES; i++) n += snap->chunks[c]->page[i].kind == PAGE_STORED;
    return n;
}

/* Give back the memory parked on vm (first out of every executor's memslots: another one may
 * still map it, if its sandbox ran there before). */
static void drop_parked(zb_engine *e, zb_vm *vm) {
    if (!vm || !vm->parked.host) return;
    zb_engine_forget(e, NULL, &vm->parked);
    zb_mem_destroy(&vm->parked);
    zb_snapshot_release(vm->parked_base);
    vm->parked_base = NULL;
    e->parked_dropped++;
}

void zb_engine_release_parked(zb_engine *e) {
    for (int i = 0; i <= ZB_CHILD_VMS; i++) drop_parked(e, executor_of(e, i));
}

void zb_engine_set_parking(zb_engine *e, int on) {
    e->parking_off = !on;
    if (!on) zb_engine_release_parked(e);
}

void zb_engine_parking_stats(zb_engine *e, uint64_t *taken, uint64_t *dropped) {
    *taken = e->parked_taken;
    *dropped = e->parked_dropped;
}

void zb_engine_close(zb_engine *e) {
    if (!e) return;
    zb_engine_release_parked(e);
    zb_engine_destroy(e);
}

/* Park sb's memory on the executor whose memslots map it, if it can serve another fork: 1 if
 * parked (sb->mem and sb->base are then empty), else 0. */
static int park(zb_sandbox *sb) {
    zb_engine *e = sb->engine;
    zb_memory *m = &sb->mem;
    /* a memory whose restore failed is not what its dirty bits say (an exec'd one is: the old
     * program's pages were dropped, not zeroed, zb_mem_drop) */
    if (e->parking_off || !sb->base || !m->host || !m->image || sb->memory_unknown) return 0;
    zb_vm *vm = NULL;
    for (int i = 0; i <= ZB_CHILD_VMS && !vm; i++) {
        zb_vm *v = executor_of(e, i);
        if (v && v->slots_host == m->host) vm = v;
    }
    if (!vm) return 0;
    /* Its own pages: what it wrote since its base (KVM's log, which a detach moved into host_dirty
     * already, and the unlogged window's populated pages; left writable and in the log, as a
     * restore leaves them, for the fork that takes it to collect and compare again) and, if it
     * holds the last reference to its base, the base's data (a closing session's last
     * checkpoint; a child's or a fan-out job's base is held by its parent or its session). */
    char ignored[ZB_ERRLEN];
    if (vm->attached == sb && zb_vm_collect_dirty(vm, vm->manual_protect, ignored) < 0) return 0;
    uint64_t own = 0;
    for (uint64_t w = 0; w < (m->npages + 63) / 64; w++) own += (uint64_t)__builtin_popcountll(m->host_dirty[w]);
    if (own <= PARK_MAX_OWN_PAGES && atomic_load(&sb->base->refs) == 1) own += stored_pages(sb->base);
    if (own > PARK_MAX_OWN_PAGES) return 0;
    drop_parked(e, vm); /* one per executor: its memslots map sb's memory now, not that one */
    if (vm->attached == sb) vm->attached = NULL;
    /* Its shared file mappings end here, as when sb is freed (their pages were written back when it
     * last stopped; their copies in memory are pages like any other, in its base or dirty bits):
     * their opens leave the file system, which is the family's for a child. */
    zb_shmap_count_opens(m, sb->fs, -1);
    zb_shmap_free(m->shmap);
    m->shmap = NULL;
    vm->parked = *m;
    vm->parked.peak_charge = 0;
    vm->parked_own = own;
    memset(m, 0, sizeof *m);
    vm->parked_base = sb->base;
    sb->base = NULL;
    return 1;
}

/* Pages where snapshots a and b (of one memory image) differ, counted until more than limit. */
static uint64_t pages_differing(const zb_snapshot *a, const zb_snapshot *b, uint64_t limit) {
    uint64_t n = 0;
    for (uint64_t c = 0; c < b->nchunks && n <= limit; c++) {
        if (a->chunks[c] == b->chunks[c]) continue;
        for (uint64_t pfn = c * CHUNK_PAGES; pfn < (c + 1) * CHUNK_PAGES; pfn++)
            n += !page_same(zb_snapshot_page(a, pfn), zb_snapshot_page(b, pfn));
    }
    return n;
}

/* The executor with a parked memory that a fork of snap can take (process 1: the main one; a
 * child: a children's one), or NULL. Parked memory that its executor no longer maps (another
 * sandbox attached since) would save nothing: it is given back on the way. One that is far from
 * snap is left for a fork it suits (a child exec'd by a shell is parked with the shell's snapshot
 * as its base: a fork of the notebook's Python taking it would rewrite the ~75,000 pages where the
 * shell and the Python differ, the shell's next child hardly any). */
static zb_vm *parked_for(zb_engine *e, const zb_snapshot *snap, int child) {
    if (e->parking_off) return NULL;
    for (int i = child ? 1 : 0; i <= (child ? ZB_CHILD_VMS : 0); i++) {
        zb_vm *vm = executor_of(e, i);
        if (!vm || !vm->parked.host) continue;
        if (vm->slots_host != vm->parked.host || !zb_mem_window_as_new(&vm->parked)) {
            drop_parked(e, vm); /* no longer warm, or not laid out as a new fork's memory would be */
            continue;
        }
        if (vm->parked.image != snap->image || vm->parked.size != snap->mem_size) continue;
        if (vm->parked_own + pages_differing(vm->parked_base, snap, PARK_MAX_OWN_PAGES) <= PARK_MAX_OWN_PAGES)
            return vm;
    }
    return NULL;
}

/* Give sb (new, without memory) the memory parked on vm, made equal to snap's. */
static int take_parked(zb_sandbox *sb, zb_vm *vm, const zb_snapshot *snap, char *err) {
    sb->mem = vm->parked;
    memset(&vm->parked, 0, sizeof vm->parked);
    zb_snapshot *old = vm->parked_base;
    vm->parked_base = NULL;
    sb->engine->parked_taken++;
    /* Attached for the dirty log's collection and the write protection after the compare (as a
     * restore of an attached sandbox), not for its vCPU: the run's attach loads that. */
    vm->attached = sb;
    int rc = restore_memory(sb, vm, old, snap, err);
    vm->attached = NULL;
    zb_snapshot_release(old);
    if (rc < 0) sb->memory_unknown = 1; /* its dirty bits may be incomplete too: never parked again */
    return rc < 0 ? -1 : 0;
}

/* The sandbox's reference to its base snapshot is this layer's (sandbox.c never calls into
 * snapshots): drop it, or park the memory with it, then let sandbox.c free the rest. */
void zb_sandbox_free(zb_sandbox *sb) {
    if (!sb) return;
    zb_mem_budget_leave(&sb->mem); /* a child's charge goes off its family's budget */
    if (sb->fam && sb->fam->m[0].sb == sb) { /* process 1 takes its family with it */
        zb_family_end(sb);
        free(sb->fam->stores);
        free(sb->fam->m);
        free(sb->fam);
    }
    sb->fam = NULL;
    if (!park(sb)) {
        zb_snapshot_release(sb->base);
        sb->base = NULL;
    }
    zb_sandbox_destroy(sb);
}

zb_sandbox *zb_snapshot_fork_for(zb_snapshot *snap, int child, char *err) {
    zb_sandbox *sb = zb_sandbox_alloc(snap->engine, err);
    if (!sb) return NULL;
    zb_vm *vm = parked_for(snap->engine, snap, child);
    if (vm) {
        if (take_parked(sb, vm, snap, err) < 0) goto fail;
    } else if (zb_mem_init(&sb->mem, snap->mem_size, snap->image, err) < 0 || apply_memory(sb, NULL, snap, NULL, err) < 0) {
        goto fail;
    }
    if (state_apply(sb, &snap->st, err) < 0 || zb_sandbox_own_policies(sb, err) < 0) goto fail;
    if (!child && zb_family_restore_lost(sb, &snap->st.lost) < 0) {
        zb_seterr(err, "out of memory restoring the checkpoint's child processes");
        goto fail;
    }
    atomic_fetch_add(&snap->refs, 1);
    sb->base = snap;
    return sb;
fail:
    zb_sandbox_free(sb);
    return NULL;
}

zb_sandbox *zb_snapshot_fork(zb_snapshot *snap, char *err) { return zb_snapshot_fork_for(snap, 0, err); }

int zb_sandbox_restore(zb_sandbox *sb, zb_snapshot *snap, char *err) {
    if (snap->image != sb->mem.image || snap->mem_size != sb->mem.size) {
        zb_seterr(err, "this snapshot was not taken from this sandbox's lineage (different memory image)");
        return -1;
    }
    if (sb->fam && sb->fam->m[0].sb != sb) {
        zb_seterr(err, "this sandbox is a child process of a family: only its process 1 is restored");
        return -1;
    }
    /* the snapshot holds process 1 alone: the family's others go (those it recorded as lost come
     * back as zombies below) */
    zb_family_end(sb);
    zb_vm *vm = zb_vm_of(sb);
    int rc = restore_memory(sb, vm && vm->attached == sb ? vm : NULL, sb->base, snap, err);
    if (rc == -1) return -1;
    if (rc < 0 || state_apply(sb, &snap->st, err) < 0) {
        sb->finished = 1; /* half restored: never run it */
        sb->memory_unknown = 1;
        return -1;
    }
    if (zb_family_restore_lost(sb, &snap->st.lost) < 0) {
        zb_seterr(err, "out of memory restoring the checkpoint's child processes");
        sb->finished = 1;
        return -1;
    }
    atomic_fetch_add(&snap->refs, 1);
    zb_snapshot_release(sb->base);
    sb->base = snap;
    sb->finished = 0;
    atomic_store(&sb->kick_requested, 0);
    if (vm && vm->attached == sb && zb_vm_load_cpu(vm, sb, err) < 0) return -1;
    return 0;
}

/* ---- working sets ---- */

int zb_snapshot_learn_working_set(zb_snapshot *snap, zb_sandbox *sb, char *err) {
    if (sb->base != snap && (!sb->base || sb->mem.size != snap->mem_size)) {
        zb_seterr(err, "the sandbox was not forked from this snapshot");
        return -1;
    }
    size_t words = (sb->mem.npages + 63) / 64;
    uint64_t *ws = calloc(words, 8), *entries = malloc(sb->mem.npages * 8);
    int fd = zb_self_pagemap_fd();
    size_t want = sb->mem.npages * 8;
    off_t at = (off_t)((uintptr_t)sb->mem.host / ZB_PAGE * 8);
    if (!ws || !entries || fd < 0 || pread(fd, entries, want, at) != (ssize_t)want) {
        zb_seterr(err, "cannot read /proc/self/pagemap: %s", strerror(errno));
        free(ws);
        free(entries);
        return -1;
    }
    for (uint64_t p = 0; p < sb->mem.npages; p++)
        if ((entries[p] >> 63) & 1) zb_bit_set(ws, p); /* present: the guest (or engine) touched it */
    free(entries);
    free(snap->ws);
    snap->ws = ws;
    return 0;
}

uint64_t zb_snapshot_working_set_pages(zb_snapshot *snap) {
    uint64_t n = 0;
    for (uint64_t w = 0; snap->ws && w < (snap->mem_size / ZB_PAGE + 63) / 64; w++) n += (uint64_t)__builtin_popcountll(snap->ws[w]);
    return n;
}

long zb_sandbox_prefault(zb_sandbox *sb, int mode, char *err) {
    const zb_snapshot *snap = sb->base;
    if (!snap || !snap->ws || !mode) return 0;
    int advice = mode == 1 ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
    long done = 0;
    for (uint64_t p = 0; p < sb->mem.npages;) {
        if (!zb_bit(snap->ws, p)) { p++; continue; }
        uint64_t start = p;
        while (p < sb->mem.npages && zb_bit(snap->ws, p)) p++;
        /* only the guest's own pages: the low region is the engine's, free pages stay untouched */
        uint64_t a = ZB_MAX(start, ZB_LOW_REGION / ZB_PAGE);
        for (uint64_t q = a; q < p; q++) {
            uint64_t r = q;
            while (r < p && zb_bit(sb->mem.allocated, r)) r++;
            if (r > q) {
                if (madvise(sb->mem.host + q * ZB_PAGE, (r - q) * ZB_PAGE, advice) < 0) {
                    zb_seterr(err, "prefaulting guest memory: %s", strerror(errno));
                    return -1;
                }
                done += (long)(r - q);
            }
            q = r;
        }
    }
    return done;
}
