/* vdso_page.c - the host side of the guest's vDSO: placing the vDSO library (guest/vdso.c, embedded
 * at build time) in guest memory and keeping its clock data page current. The data page (struct
 * zb_vdso_data, guest/guest_abi.h) sits right below the image; the host rewrites it whenever the
 * sandbox starts running, so forks of an old snapshot see the current time.
 *
 * The monotonic clocks must never go back. The guest computes base + (tsc - tsc0) * mult, so a
 * base taken later than tsc0 (the host thread preempted between reading the TSC and the clocks,
 * common on a loaded host) makes guest time run ahead until the next rewrite, which then looked
 * like a jump back (1.16 ms measured). So (1) the TSC is read between two CLOCK_MONOTONIC readings
 * and the base is their midpoint, retried while the window is wide, and (2) every rewrite keeps
 * each monotonic base at or above what the previous page gave at the guest's last TSC reading
 * (recorded when the run stopped, zb_vdso_note_stop), whatever the sampling error.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "guest_abi.h"

#include <sys/ioctl.h>
#include <time.h>

_Static_assert(ZB_VDSO_DATA_SIZE == ZB_PAGE, "the vDSO data is one guest page ([vvar])");

extern const unsigned char zb_vdso_image[];
extern const unsigned long zb_vdso_image_len;

_Static_assert(ZB_SITE_STUBS_SIZE == ZB_PAGE, "the stubbed sites' page is one guest page");

static uint64_t image_bytes(void) { return ZB_PAGE_UP(zb_vdso_image_len); }

uint64_t zb_vdso_size(void) { return ZB_VDSO_DATA_SIZE + image_bytes() + ZB_SITE_STUBS_SIZE; }

/* The stubbed sites' page of a vDSO placed at `at` (its data page). */
static uint64_t stubs_at(uint64_t at) { return at + ZB_VDSO_DATA_SIZE + image_bytes(); }

/* The library's bytes, an empty stub page (guest_abi.h "Stubbed syscall sites": a new program's
 * sites are its own; syscall_sites.c writes the page's entry pointer with its first stub) and the
 * three regions at `at` (allocated). */
static uint64_t place(zb_sandbox *sb, uint64_t at) {
    uint64_t len = zb_vdso_size(), stubs = stubs_at(at);
    memcpy(sb->mem.host + at + ZB_VDSO_DATA_SIZE, zb_vdso_image, zb_vdso_image_len);
    memset(sb->mem.host + stubs, 0, ZB_SITE_STUBS_SIZE);
    zb_mem_dirty(&sb->mem, at, len);
    zb_region_add(&sb->mem, at, at + ZB_VDSO_DATA_SIZE, 1, "[vvar]");
    zb_region_add(&sb->mem, at + ZB_VDSO_DATA_SIZE, stubs, 5, "[vdso]");
    zb_region_add(&sb->mem, stubs, at + len, 5, ZB_SITE_STUBS_NAME);
    sb->vdso_data = at;
    return at + ZB_VDSO_DATA_SIZE;
}

uint64_t zb_vdso_site_stubs(zb_sandbox *sb) {
    if (!sb->vdso_data) return 0;
    uint64_t stubs = stubs_at(sb->vdso_data);
    const zb_region *r = zb_region_find(&sb->mem, stubs);
    if (!r || r->start != stubs || strcmp(r->name, ZB_SITE_STUBS_NAME) != 0) return 0; /* unmapped or replaced */
    return zb_guest_ptr(sb, stubs, ZB_SITE_STUBS_SIZE, 0) ? stubs : 0;
}

uint64_t zb_vdso_load(zb_sandbox *sb, char *err) {
    uint64_t len = zb_vdso_size();
    uint64_t at = zb_mem_alloc(&sb->mem, len, ZB_ALLOC_OTHER);
    if (!at) { zb_seterr(err, "no guest memory left for the vDSO"); return 0; }
    zb_mem_mark(&sb->mem, at, len, 1);
    return place(sb, at);
}

uint64_t zb_vdso_keep(zb_sandbox *sb) {
    if (!sb->vdso_data || !zb_mem_range_allocated(&sb->mem, sb->vdso_data, zb_vdso_size())) return 0;
    return place(sb, sb->vdso_data);
}

#define SAMPLE_WINDOW_NS 20000 /* a TSC reading bracketed this tightly is taken as it is */
#define SAMPLE_TRIES 8

static int64_t clock_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* What a page's base gives at guest TSC `tsc` (what a guest reading then got). */
static int64_t extrapolate(int64_t base, uint64_t tsc0, uint64_t mult, uint64_t tsc) {
    uint64_t ticks = tsc > tsc0 ? ZB_MIN(tsc - tsc0, 1ull << 52) : 0; /* (years of TSC: no overflow) */
    return base + (int64_t)(((unsigned __int128)ticks * mult) >> 32);
}

void zb_vdso_note_stop(zb_sandbox *sb, zb_vm *vm) {
    zb_process *p = &sb->proc;
    if (!sb->vdso_data || !vm->tsc_khz || !p->clock_mult) return;
    uint64_t tsc = zb_vm_guest_tsc(vm);
    if (!tsc) return;
    for (int i = 0; i < 3; i++) p->clock_floor[i] = extrapolate(p->clock_base[i], p->clock_tsc0, p->clock_mult, tsc);
}

void zb_vdso_refresh(zb_sandbox *sb, zb_vm *vm) {
    if (!sb->vdso_data) return;
    struct zb_vdso_data d;
    memset(&d, 0, sizeof d);
    int64_t best = INT64_MAX;
    for (int i = 0; i < SAMPLE_TRIES && best > SAMPLE_WINDOW_NS; i++) {
        int64_t before = clock_ns(CLOCK_MONOTONIC);
        uint64_t tsc = vm->tsc_khz ? zb_vm_guest_tsc(vm) : 0;
        int64_t after = clock_ns(CLOCK_MONOTONIC);
        /* the other clocks as offsets from CLOCK_MONOTONIC read right after each */
        int64_t real = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
        int64_t boot = clock_ns(CLOCK_BOOTTIME) - clock_ns(CLOCK_MONOTONIC);
        int64_t raw = clock_ns(CLOCK_MONOTONIC_RAW) - clock_ns(CLOCK_MONOTONIC);
        if (after - before >= best) continue;
        best = after - before;
        int64_t mid = before + (after - before) / 2;
        d.tsc0 = tsc;
        d.mult = tsc ? (uint64_t)(((unsigned __int128)1000000 << 32) / vm->tsc_khz) : 0;
        d.mono_ns = mid;
        d.real_ns = mid + real;
        d.boot_ns = mid + boot;
        d.raw_ns = mid + raw;
    }
    /* never behind what the guest may already have read (REALTIME may step, as on any host) */
    zb_process *p = &sb->proc;
    d.mono_ns = ZB_MAX(d.mono_ns, p->clock_floor[0]);
    d.boot_ns = ZB_MAX(d.boot_ns, p->clock_floor[1]);
    d.raw_ns = ZB_MAX(d.raw_ns, p->clock_floor[2]);
    p->clock_base[0] = d.mono_ns;
    p->clock_base[1] = d.boot_ns;
    p->clock_base[2] = d.raw_ns;
    p->clock_tsc0 = d.tsc0;
    p->clock_mult = d.mult;
    struct zb_vdso_data *page = (struct zb_vdso_data *)(sb->mem.host + sb->vdso_data);
    d.generation = page->generation + 1;
    memcpy(page, &d, sizeof d);
    zb_mem_dirty(&sb->mem, sb->vdso_data, sizeof d);
}
