/* snapshot_state_test.c - round trips of each component's snapshot state (tests/test_snapshot_state.py
 * builds this with the engine's sources, ASan and UBSan, and runs it once per component).
 *
 * For a component: fill its state with distinct values, save it, load it back and compare field by
 * field, save the loaded copy again and require the same bytes, clone it and compare; then load every
 * truncation of the saved bytes (each must fail with an error message), flip every byte (a load may
 * succeed or fail, never crash or leak) and plant the corruptions its loader must refuse (counts and
 * lengths beyond their bounds, out-of-range values). Prints "ok COMPONENT" and exits 0, or says what
 * differed and exits 1.
 */
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "serial.h"
#include "shared_map_state.h"

/* the engine's generated and embedded parts, which no component here uses */
const char *const zb_syscall_names[512];
const unsigned char zb_cpl0_stubs[] = {0xf4};
const unsigned long zb_cpl0_stubs_len = sizeof zb_cpl0_stubs;
const unsigned char zb_vdso_image[] = {0};
const unsigned long zb_vdso_image_len = sizeof zb_vdso_image;

static int failures;
#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                  \
            failures++;                                                                     \
        }                                                                                   \
    } while (0)

static uint64_t seed = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) { /* splitmix64: distinct, deterministic field values */
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- one component's save and load, as function pointers over a void state ---- */

#define XSAVE_SIZE 4096
#define NPAGES 16384 /* 64 MiB of guest memory */

typedef struct component {
    const char *name;
    size_t size;                                        /* bytes of its state struct */
    void (*fill)(void *st);
    void (*save)(const void *st, zb_out *o);
    int (*load)(void *st, zb_in *in, char *err);
    int (*clone)(void *dst, const void *src);
    int (*same)(const void *a, const void *b);          /* the fields a save keeps are equal */
    void (*free)(void *st);
    void (*corrupt)(const uint8_t *bytes, size_t len);  /* the loader's own refusals */
} component;

static uint8_t *save_bytes(const component *c, const void *st, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    zb_out o = {f, 0};
    c->save(st, &o);
    CHECK(!o.err);
    fclose(f);
    *len = n;
    return (uint8_t *)buf;
}

/* Load from a private copy of exactly len bytes (so ASan sees any read past them). */
static int load_bytes(const component *c, void *st, const uint8_t *bytes, size_t len, char *err) {
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, bytes, len);
    zb_in in = {copy, len, 0, 0};
    err[0] = 0;
    int rc = c->load(st, &in, err);
    if (rc == 0 && in.pos != len) rc = 1; /* read less than the save wrote */
    free(copy);
    return rc;
}

static void expect_refused(const component *c, const uint8_t *bytes, size_t len, const char *what) {
    void *st = calloc(1, c->size);
    char err[ZB_ERRLEN];
    int rc = load_bytes(c, st, bytes, len, err);
    if (rc != -1 || !err[0]) {
        fprintf(stderr, "FAIL %s: %s was accepted (rc %d)\n", c->name, what, rc);
        failures++;
    }
    if (rc >= 0) c->free(st);
    free(st);
}

static void run(const component *c) {
    void *a = calloc(1, c->size), *b = calloc(1, c->size), *d = calloc(1, c->size);
    char err[ZB_ERRLEN];
    c->fill(a);
    size_t len, len2;
    uint8_t *bytes = save_bytes(c, a, &len);
    CHECK(load_bytes(c, b, bytes, len, err) == 0);
    CHECK(c->same(a, b));
    uint8_t *again = save_bytes(c, b, &len2);
    CHECK(len2 == len && !memcmp(again, bytes, len));
    free(again);
    CHECK(c->clone(d, b) == 0);
    CHECK(c->same(a, d));
    c->free(b);
    CHECK(c->same(a, d)); /* the clone owns its buffers */
    c->free(d);
    for (size_t n = 0; n < len; n++) expect_refused(c, bytes, n, "a truncated state");
    uint8_t *flip = malloc(len);
    for (size_t i = 0; i < len; i++) {
        memcpy(flip, bytes, len);
        flip[i] ^= 0xa5;
        void *st = calloc(1, c->size);
        if (load_bytes(c, st, flip, len, err) >= 0) c->free(st);
        free(st);
    }
    free(flip);
    if (c->corrupt) c->corrupt(bytes, len);
    c->free(a);
    free(bytes);
    free(a);
    free(b);
    free(d);
}

/* Overwrite the u64 at byte `at` of a copy of the saved bytes and require a refusal. */
static const component *current;
static void refuse_u64_at(const uint8_t *bytes, size_t len, size_t at, uint64_t v, const char *what) {
    uint8_t *copy = malloc(len);
    memcpy(copy, bytes, len);
    v = htole64(v);
    memcpy(copy + at, &v, 8);
    expect_refused(current, copy, len, what);
    free(copy);
}
static void refuse_u32_at(const uint8_t *bytes, size_t len, size_t at, uint32_t v, const char *what) {
    uint8_t *copy = malloc(len);
    memcpy(copy, bytes, len);
    v = htole32(v);
    memcpy(copy + at, &v, 4);
    expect_refused(current, copy, len, what);
    free(copy);
}

/* ---- vCPU ---- */

static void cpu_fill(void *p) {
    zb_cpu *c = p;
    __u64 *r = (__u64 *)&c->regs;
    for (size_t i = 0; i < sizeof c->regs / 8; i++) r[i] = next();
    c->fs_base = next();
    c->gs_base = next();
    c->xsave = malloc(XSAVE_SIZE);
    for (size_t i = 0; i < XSAVE_SIZE; i++) c->xsave[i] = (uint8_t)next();
    c->pending_syscall = 1;
    c->pending_nr = 35; /* nanosleep, interrupted */
    c->pending_wake_ns = 0;
}
static void cpu_save(const void *p, zb_out *o) { zb_cpu_save(p, XSAVE_SIZE, o); }
static int cpu_load(void *p, zb_in *in, char *err) { return zb_cpu_load(p, XSAVE_SIZE, in, err); }
static int cpu_clone(void *d, const void *s) { return zb_cpu_clone(d, s, XSAVE_SIZE); }
static int cpu_same(const void *pa, const void *pb) {
    const zb_cpu *a = pa, *b = pb;
    return !memcmp(&a->regs, &b->regs, sizeof a->regs) && a->fs_base == b->fs_base && a->gs_base == b->gs_base &&
           !memcmp(a->xsave, b->xsave, XSAVE_SIZE) && a->pending_syscall == b->pending_syscall &&
           a->pending_nr == b->pending_nr;
}
static void cpu_free(void *p) { zb_cpu_free(p); }
static void cpu_corrupt(const uint8_t *bytes, size_t len) {
    size_t xsize_at = 18 * 8 + 16;
    refuse_u64_at(bytes, len, xsize_at, XSAVE_SIZE * 2, "an XSAVE image of another size");
    refuse_u64_at(bytes, len, xsize_at, ~0ull, "an XSAVE size of 2^64-1");
    refuse_u32_at(bytes, len, xsize_at + 8 + XSAVE_SIZE, 7, "a pending-syscall flag of 7");
    refuse_u64_at(bytes, len, xsize_at + 8 + XSAVE_SIZE + 4, 1u << 20, "a pending syscall number beyond the table");
    /* the XSAVE size error names the host, not corruption: the template must be rebuilt here */
    uint8_t *copy = malloc(len);
    memcpy(copy, bytes, len);
    uint64_t v = htole64(XSAVE_SIZE * 2);
    memcpy(copy + xsize_at, &v, 8);
    zb_cpu c;
    char err[ZB_ERRLEN];
    zb_in in = {copy, len, 0, 0};
    CHECK(zb_cpu_load(&c, XSAVE_SIZE, &in, err) == -1 && strstr(err, "rebuilt here"));
    free(copy);
}

/* ---- signals ---- */

static void sig_fill(void *p) {
    zb_signals *s = p;
    for (int i = 0; i <= 64; i++)
        s->action[i] = (zb_sigaction){next(), next(), next(), next() & ~ZB_SIG_UNBLOCKABLE};
    s->blocked = next() & ~ZB_SIG_UNBLOCKABLE;
    s->pending = next();
    s->altstack_sp = next();
    s->altstack_size = next();
    s->altstack_flags = 1;
    s->fault_sig = SIGSEGV;
    s->fault_code = 2;
    s->fault_addr = next();
    s->alarm_ns = 123; /* not saved: a host monotonic time */
    s->alarm_interval_ns = 456;
}
static void sig_save(const void *p, zb_out *o) { zb_signals_save(p, o); }
static int sig_load(void *p, zb_in *in, char *err) { return zb_signals_load(p, in, err); }
static int sig_clone(void *d, const void *s) { zb_signals_clone(d, s); return 0; }
static int sig_same(const void *pa, const void *pb) {
    const zb_signals *a = pa, *b = pb;
    for (int i = 0; i <= 64; i++)
        if (memcmp(&a->action[i], &b->action[i], sizeof a->action[i])) return 0;
    return a->blocked == b->blocked && a->pending == b->pending && a->altstack_sp == b->altstack_sp &&
           a->altstack_size == b->altstack_size && a->altstack_flags == b->altstack_flags &&
           a->fault_sig == b->fault_sig && a->fault_code == b->fault_code && a->fault_addr == b->fault_addr;
}
static void sig_free(void *p) { (void)p; }
static void sig_corrupt(const uint8_t *bytes, size_t len) {
    size_t blocked_at = 65 * 32, fault_sig_at = blocked_at + 32 + 4;
    refuse_u64_at(bytes, len, blocked_at, ZB_SIG_BIT(SIGKILL), "SIGKILL blocked");
    refuse_u32_at(bytes, len, fault_sig_at, 65, "a fault signal of 65");
    /* a loaded state has no alarm armed */
    zb_signals s;
    char err[ZB_ERRLEN];
    zb_in in = {bytes, len, 0, 0};
    CHECK(zb_signals_load(&s, &in, err) == 0 && s.alarm_ns == 0 && s.alarm_interval_ns == 0);
}

/* ---- process ---- */

static void proc_fill(void *p) {
    zb_process *s = p;
    snprintf(s->exe, sizeof s->exe, "/usr/bin/python3.11");
    snprintf(s->comm, sizeof s->comm, "fifteen-bytes-x"); /* the longest name there is */
    memset(s->cwd, 'd', sizeof s->cwd - 1); /* the longest path there is */
    s->cwd[0] = '/';
    s->cwd[sizeof s->cwd - 1] = 0;
    s->tid_address = next();
    s->umask = 027;
    s->cpu_ns = 99; /* not saved: a loaded template's guest clocks start at zero */
}
static void proc_save(const void *p, zb_out *o) { zb_process_save(p, o); }
static int proc_load(void *p, zb_in *in, char *err) { return zb_process_load(p, in, err); }
static int proc_clone(void *d, const void *s) { zb_process_clone(d, s); return 0; }
static int proc_same(const void *pa, const void *pb) {
    const zb_process *a = pa, *b = pb;
    return !strcmp(a->exe, b->exe) && !strcmp(a->comm, b->comm) && !strcmp(a->cwd, b->cwd) && a->tid_address == b->tid_address && a->umask == b->umask;
}
static void proc_free(void *p) { (void)p; }
static void proc_corrupt(const uint8_t *bytes, size_t len) {
    refuse_u32_at(bytes, len, 0, PATH_MAX, "a program path of PATH_MAX bytes");
    refuse_u32_at(bytes, len, len - 4, 01000, "a umask of 01000");
}

/* ---- UART ---- */

static void uart_fill(void *p) {
    zb_uart *u = p;
    zb_uart_init(u);
    u->ier = 1; u->lcr = 0x83; u->mcr = 0x10; u->scr = 0x5a; u->dll = 3; u->dlm = 4; u->fcr = 0xc7;
    const char input[] = "host input not read yet";
    CHECK(zb_uart_push_input(u, "already read", 12) == 0);
    CHECK(zb_uart_push_input(u, input, sizeof input) == 0);
    uint8_t tmp[12];
    CHECK(zb_uart_read(u, tmp, sizeof tmp) == sizeof tmp); /* rx_pos > 0: only the unread part is saved */
    u->tx = malloc(40);
    u->tx_cap = u->tx_len = 40;
    for (int i = 0; i < 40; i++) u->tx[i] = (uint8_t)next();
    u->frame_ready = 0;
    u->overrun = 1;
}
static void uart_save(const void *p, zb_out *o) { zb_uart_save(p, o); }
static int uart_load(void *p, zb_in *in, char *err) { return zb_uart_load(p, in, err); }
static int uart_clone(void *d, const void *s) { return zb_uart_clone(d, s); }
static int uart_same(const void *pa, const void *pb) {
    const zb_uart *a = pa, *b = pb;
    size_t ua = a->rx_len - a->rx_pos, ub = b->rx_len - b->rx_pos;
    return a->ier == b->ier && a->lcr == b->lcr && a->mcr == b->mcr && a->scr == b->scr && a->dll == b->dll &&
           a->dlm == b->dlm && a->fcr == b->fcr && ua == ub && !memcmp(a->rx + a->rx_pos, b->rx + b->rx_pos, ua) &&
           a->tx_len == b->tx_len && !memcmp(a->tx, b->tx, a->tx_len) && a->frame_ready == b->frame_ready &&
           a->overrun == b->overrun;
}
static void uart_free(void *p) { zb_uart_destroy(p); }
static void uart_corrupt(const uint8_t *bytes, size_t len) {
    size_t rx_at = 7, rx = 24, tx_at = rx_at + 8 + rx, ready_at = tx_at + 8 + 40;
    refuse_u64_at(bytes, len, rx_at, 1ull << 40, "a receive buffer of 1 TiB");
    refuse_u64_at(bytes, len, rx_at, (uint64_t)ZB_FRAME_MAX_PAYLOAD + 1, "a receive buffer beyond a frame");
    refuse_u64_at(bytes, len, tx_at, ~0ull, "a frame buffer of 2^64-1 bytes");
    refuse_u64_at(bytes, len, ready_at, 41, "a complete frame longer than the frame buffer");
}

/* ---- guest memory bookkeeping ---- */

static void mem_fill(void *p) {
    zb_mem_meta *m = p;
    m->npages = NPAGES;
    m->allocated = malloc(NPAGES / 8);
    for (size_t i = 0; i < NPAGES / 64; i++) m->allocated[i] = next();
    m->pages_allocated = 1000;
    m->pages_limit = NPAGES;
    m->mmap_top = next();
    m->brk_start = next();
    m->brk_end = next();
    m->nregions = 3;
    m->regions = calloc(3, sizeof *m->regions);
    for (size_t i = 0; i < 3; i++) {
        m->regions[i] = (zb_region){next(), next(), (int)(next() & 7), ""};
        snprintf(m->regions[i].name, sizeof m->regions[i].name, "libregion%zu.so", i);
    }
    memset(m->regions[2].name, 'n', sizeof m->regions[2].name - 1); /* the longest name */
    m->shmap = calloc(1, sizeof *m->shmap);
    m->shmap->e = calloc(2, sizeof *m->shmap->e);
    m->shmap->n = m->shmap->cap = 2;
    m->shmap->e[0] = (zb_shmap_entry){.addr = 16 * ZB_PAGE, .len = 4 * ZB_PAGE, .off = 0, .ino = 7, .writable = 1,
                                      .aliases = 2};
    m->shmap->e[1] = (zb_shmap_entry){.addr = 64 * ZB_PAGE, .len = ZB_PAGE, .off = 3 * ZB_PAGE, .ino = 9, .writable = 0};
}
static void mem_save(const void *p, zb_out *o) { zb_mem_meta_save(p, o); }
static int mem_load(void *p, zb_in *in, char *err) { return zb_mem_meta_load(p, NPAGES, in, err); }
static int mem_clone(void *d, const void *s) {
    /* in memory, a snapshot's bookkeeping is captured from a sandbox's and applied back to one */
    const zb_mem_meta *src = s;
    zb_memory m;
    memset(&m, 0, sizeof m);
    m.npages = NPAGES;
    m.allocated = calloc(NPAGES / 64, 8);
    if (zb_mem_meta_apply(&m, src) < 0) return -1;
    int rc = zb_mem_meta_capture(&m, d);
    free(m.allocated);
    free(m.regions);
    zb_shmap_free(m.shmap);
    return rc;
}
static int mem_same(const void *pa, const void *pb) {
    const zb_mem_meta *a = pa, *b = pb;
    if (a->npages != b->npages || a->pages_allocated != b->pages_allocated || a->pages_limit != b->pages_limit ||
        a->mmap_top != b->mmap_top || a->brk_start != b->brk_start || a->brk_end != b->brk_end ||
        memcmp(a->allocated, b->allocated, NPAGES / 8) || a->nregions != b->nregions)
        return 0;
    for (size_t i = 0; i < a->nregions; i++)
        if (a->regions[i].start != b->regions[i].start || a->regions[i].end != b->regions[i].end ||
            a->regions[i].prot != b->regions[i].prot || strcmp(a->regions[i].name, b->regions[i].name))
            return 0;
    return zb_shmap_same(a->shmap, b->shmap);
}
static void mem_free(void *p) { zb_mem_meta_free(p); }
static void mem_corrupt(const uint8_t *bytes, size_t len) {
    size_t nregions_at = 6 * 8 + NPAGES / 8;
    refuse_u64_at(bytes, len, 0, NPAGES * 2, "another memory size");
    refuse_u64_at(bytes, len, 8, NPAGES + 1, "more pages allocated than there are");
    refuse_u64_at(bytes, len, nregions_at, 1ull << 32, "2^32 regions");
    refuse_u32_at(bytes, len, nregions_at + 8 + 16 + 4, 4096, "a region name of 4096 bytes");
    size_t shmap_at = len - 8 - 2 * 36; /* the shared-map table ends the part: a count, 2 entries */
    refuse_u64_at(bytes, len, shmap_at, ZB_SHMAP_MAX + 1, "more shared mappings than the limit");
    refuse_u64_at(bytes, len, shmap_at + 8, 16 * ZB_PAGE + 1, "an unaligned shared mapping");
    refuse_u64_at(bytes, len, shmap_at + 8 + 8, NPAGES * ZB_PAGE, "a shared mapping beyond guest memory");
    refuse_u32_at(bytes, len, shmap_at + 8 + 24, 0, "a shared mapping of inode 0");
    refuse_u32_at(bytes, len, shmap_at + 8 + 28, 2, "a shared mapping's writable flag of 2");
    refuse_u32_at(bytes, len, shmap_at + 8 + 32, ZB_SHMAP_ALIASES_MAX + 1, "more aliases than the limit");
}

/* ---- threads ---- */

static void thr_fill(void *p) {
    zb_threads *ts = p;
    memset(ts, 0, sizeof *ts);
    ts->cap = ts->count = 3;
    ts->t = calloc(3, sizeof *ts->t);
    ts->current = 1;
    ts->next_tid = 10;
    const int states[3] = {ZB_THREAD_FUTEX, ZB_THREAD_RUNNABLE, ZB_THREAD_RETRY};
    for (int i = 0; i < 3; i++) {
        zb_thread *t = &ts->t[i];
        t->tid = 1 + 3 * i;
        t->state = states[i];
        t->blocked = next() & ~ZB_SIG_UNBLOCKABLE;
        t->pending = next();
        t->altstack_sp = next();
        t->altstack_size = next();
        t->altstack_flags = i;
        t->clear_child_tid = next();
        t->robust_list = next();
        t->robust_len = 24;
        t->futex_addr = next() & ~3ull;
        t->futex_bitset = (uint32_t)next();
        t->wake_ns = i == 0 ? INT64_MAX : 1234; /* saved as "has a timeout" only */
        cpu_fill(&t->cpu);
        t->cpu.pending_syscall = i == 2;
    }
}
static void thr_save(const void *p, zb_out *o) { zb_threads_save(p, XSAVE_SIZE, o); }
static int thr_load(void *p, zb_in *in, char *err) { return zb_threads_load(p, XSAVE_SIZE, in, err); }
static int thr_clone(void *d, const void *s) { return zb_threads_clone(d, s, XSAVE_SIZE); }
static int thr_same(const void *pa, const void *pb) {
    const zb_threads *a = pa, *b = pb;
    if (a->count != b->count || a->next_tid != b->next_tid || a->t[a->current].tid != b->t[b->current].tid) return 0;
    for (int i = 0; i < a->cap; i++) {
        const zb_thread *x = &a->t[i];
        if (!x->tid) continue;
        int j = zb_threads_find(b, x->tid);
        if (j < 0) return 0;
        const zb_thread *y = &b->t[j];
        if (x->state != y->state || x->blocked != y->blocked || x->pending != y->pending || x->altstack_sp != y->altstack_sp ||
            x->altstack_size != y->altstack_size || x->altstack_flags != y->altstack_flags ||
            x->clear_child_tid != y->clear_child_tid || x->robust_list != y->robust_list || x->robust_len != y->robust_len ||
            x->futex_addr != y->futex_addr || x->futex_bitset != y->futex_bitset ||
            (x->wake_ns == INT64_MAX) != (y->wake_ns == INT64_MAX) || !cpu_same(&x->cpu, &y->cpu))
            return 0;
    }
    return 1;
}
static void thr_free(void *p) { zb_threads_free(p); }
static void thr_corrupt(const uint8_t *bytes, size_t len) {
    const size_t thread0 = 12, cpu_bytes = 18 * 8 + 16 + 8 + XSAVE_SIZE + 4 + 8, per = 84 + cpu_bytes;
    refuse_u32_at(bytes, len, 0, 0, "no thread at all");
    refuse_u32_at(bytes, len, 0, ZB_THREADS_MAX + 1, "more threads than the limit");
    refuse_u32_at(bytes, len, 4, 3, "a running thread beyond the count");
    refuse_u32_at(bytes, len, 8, 0x7fffffff, "a next tid past the bound");
    refuse_u32_at(bytes, len, thread0, 0, "a thread of tid 0");
    refuse_u32_at(bytes, len, thread0, 10, "a tid not below the next tid");
    refuse_u32_at(bytes, len, thread0 + per, 1, "two threads of one tid");
    refuse_u32_at(bytes, len, thread0 + 4, 9, "an unknown thread state");
    refuse_u32_at(bytes, len, thread0 + per + 4, ZB_THREAD_RETRY, "a running thread in a yielded syscall");
    refuse_u64_at(bytes, len, thread0 + 8, ZB_SIG_BIT(SIGKILL), "SIGKILL blocked in a thread");
    refuse_u64_at(bytes, len, thread0 + 68, 0x1001, "an unaligned futex address");
    refuse_u32_at(bytes, len, thread0 + 80, 2, "a timeout flag of 2");
    refuse_u64_at(bytes, len, thread0 + 84 + 18 * 8 + 16, XSAVE_SIZE * 2, "a thread's XSAVE image of another size");
}

static const component components[] = {
    {"cpu", sizeof(zb_cpu), cpu_fill, cpu_save, cpu_load, cpu_clone, cpu_same, cpu_free, cpu_corrupt},
    {"signals", sizeof(zb_signals), sig_fill, sig_save, sig_load, sig_clone, sig_same, sig_free, sig_corrupt},
    {"threads", sizeof(zb_threads), thr_fill, thr_save, thr_load, thr_clone, thr_same, thr_free, thr_corrupt},
    {"process", sizeof(zb_process), proc_fill, proc_save, proc_load, proc_clone, proc_same, proc_free, proc_corrupt},
    {"uart", sizeof(zb_uart), uart_fill, uart_save, uart_load, uart_clone, uart_same, uart_free, uart_corrupt},
    {"memory", sizeof(zb_mem_meta), mem_fill, mem_save, mem_load, mem_clone, mem_same, mem_free, mem_corrupt},
};

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s COMPONENT\n", argv[0]); return 2; }
    for (size_t i = 0; i < sizeof components / sizeof *components; i++) {
        if (strcmp(argv[1], components[i].name)) continue;
        current = &components[i];
        run(current);
        if (failures) { fprintf(stderr, "%d failure(s) in %s\n", failures, argv[1]); return 1; }
        printf("ok %s\n", argv[1]);
        return 0;
    }
    fprintf(stderr, "no component %s\n", argv[1]);
    return 2;
}
