/* guest_memory.c - a sandbox's guest memory: the host mapping, which pages the guest owns, which
 * pages changed, and validated access for syscall arguments.
 *
 * The host mapping is MAP_NORESERVE, so untouched guest memory costs nothing. For a fork it is a
 * MAP_PRIVATE view of the snapshot's image (copy-on-write); ranges the guest frees are replaced by
 * fresh anonymous memory so they read as zeros, as Linux guarantees for new anonymous mappings.
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "serial.h"
#include "shared_map_state.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_REGIONS 65536

static size_t bitmap_bytes(uint64_t npages) { return ((npages + 63) / 64) * sizeof(uint64_t); }

void zb_bits_set_range(uint64_t *b, uint64_t first, uint64_t n, int value) {
    uint64_t i = first, end = first + n;
    while (i < end && (i & 63)) { value ? zb_bit_set(b, i) : zb_bit_clear(b, i); i++; }
    while (i + 64 <= end) { b[i >> 6] = value ? ~0ull : 0; i += 64; }
    while (i < end) { value ? zb_bit_set(b, i) : zb_bit_clear(b, i); i++; }
}

/* 1 if every bit in [first, first+n) equals value */
static int bits_all(const uint64_t *b, uint64_t first, uint64_t n, int value) {
    uint64_t i = first, end = first + n, want = value ? ~0ull : 0;
    while (i < end && (i & 63)) { if (zb_bit(b, i) != value) return 0; i++; }
    while (i + 64 <= end) { if (b[i >> 6] != want) return 0; i += 64; }
    while (i < end) { if (zb_bit(b, i) != value) return 0; i++; }
    return 1;
}

/* Which pages of a sparse image file hold data (SEEK_DATA/SEEK_HOLE). A template's image is mostly
 * holes (161 MiB of data in 1 GiB); comparing a guest page with a hole through the image's mapping
 * would make the page cache read the hole, i.e. allocate and zero pages for nothing. */
static uint64_t *image_data_pages(int fd, uint64_t size) {
    uint64_t npages = size / ZB_PAGE, *bits = calloc((npages + 63) / 64, sizeof *bits);
    if (!bits) return NULL;
    off_t at = 0;
    while ((uint64_t)at < size) {
        off_t data = lseek(fd, at, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) break;  /* no data after `at` */
            free(bits);
            return NULL;  /* cannot tell: treat every page as data */
        }
        off_t hole = lseek(fd, data, SEEK_HOLE);
        if (hole < 0) { free(bits); return NULL; }
        uint64_t first = (uint64_t)data / ZB_PAGE, last = ZB_MIN(((uint64_t)hole + ZB_PAGE - 1) / ZB_PAGE, npages);
        if (last > first) zb_bits_set_range(bits, first, last - first, 1);
        at = hole;
    }
    return bits;
}

zb_image *zb_image_new(int fd, uint64_t size) {
    zb_image *img = calloc(1, sizeof *img);
    if (!img) return NULL;
    atomic_init(&img->refs, 1);
    img->fd = fd;
    img->size = size;
    /* shares the page cache with every fork's copy-on-write mapping: costs address space only */
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
    img->map = map == MAP_FAILED ? NULL : map;
    img->data = image_data_pages(fd, size);
    return img;
}

int zb_image_page_is_hole(const zb_image *img, uint64_t pfn) {
    return img && img->data && pfn < img->size / ZB_PAGE && !zb_bit(img->data, pfn);
}

void zb_image_ref(zb_image *img) {
    if (img) atomic_fetch_add(&img->refs, 1);
}

void zb_image_unref(zb_image *img) {
    if (img && atomic_fetch_sub(&img->refs, 1) == 1) {
        if (img->map) munmap((void *)img->map, img->size);
        free(img->data);
        close(img->fd);
        free(img);
    }
}

/* The guest's host mapping, 2 MiB aligned: the guest maps its memory with 2 MiB pages, and KVM can
 * map a guest 2 MiB page with one host huge page only where host and guest addresses agree modulo
 * 2 MiB. Reserve 2 MiB more, map over the aligned part, give back the ends. */
static void *map_aligned(uint64_t size, const zb_image *image) {
    uint8_t *r = mmap(NULL, size + ZB_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    uint8_t *at = (uint8_t *)(((uintptr_t)r + ZB_HUGE - 1) & ~(uintptr_t)(ZB_HUGE - 1));
    void *host = image ? mmap(at, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE | MAP_FIXED, image->fd, 0)
                       : mmap(at, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (host == MAP_FAILED) {
        int e = errno;
        munmap(r, size + ZB_HUGE);
        errno = e;
        return MAP_FAILED;
    }
    if (at > r) munmap(r, (size_t)(at - r));
    if (at + size < r + size + ZB_HUGE) munmap(at + size, (size_t)(r + size + ZB_HUGE - (at + size)));
    return host;
}

static atomic_int unlogged_window_on = 1;

int zb_mem_unlogged_window(int on) { return atomic_exchange(&unlogged_window_on, on ? 1 : 0); }

/* Where the unlogged window lies in a guest of `size` bytes: above the first 256 MiB (the ELF and
 * the brk heap grow there) and below the top eighth, at least 640 MiB (the stack, and the template's
 * libraries and interpreter heap, ~450 MiB with numpy, pandas and matplotlib, allocated top-down).
 * Only where that leaves at least 256 MiB. What lies where is a matter of speed only: tracking
 * changes in the window is correct for any page. */
static int window_wanted(uint64_t size, uint64_t *lo, uint64_t *top) {
    *lo = 256ul << 20;
    *top = ZB_MAX(size / 8, 640ul << 20) & ~(ZB_HUGE - 1);
    return atomic_load(&unlogged_window_on) && size >= *lo + *top + (256ul << 20);
}

int zb_mem_window_as_new(const zb_memory *m) {
    uint64_t lo, top;
    return window_wanted(m->size, &lo, &top) == (m->window_parts != 0);
}

static int place_unlogged_window(zb_memory *m) {
    uint64_t lo, top;
    if (!window_wanted(m->size, &lo, &top)) return 0;
    /* parts of 256 MiB, or a sixteenth of the window: at most 16 memslots */
    uint64_t bytes = m->size - top - lo, part = ZB_MAX(256ul << 20, (bytes / 16 + ZB_HUGE - 1) & ~(ZB_HUGE - 1));
    uint32_t parts = (uint32_t)((bytes + part - 1) / part);
    m->window_logged = calloc(parts, 1);
    m->window_still = calloc(parts, 1);
    if (!m->window_logged || !m->window_still) return -1;
    m->unlogged_lo = lo;
    m->unlogged_hi = m->size - top;
    m->window_part_pages = part / ZB_PAGE;
    m->window_parts = parts;
    return 0;
}

int zb_mem_window_part(const zb_memory *m, uint64_t pfn) {
    uint64_t a = pfn * ZB_PAGE;
    if (a < m->unlogged_lo || a >= m->unlogged_hi) return -1;
    return (int)((pfn - m->unlogged_lo / ZB_PAGE) / m->window_part_pages);
}

/* A big mapping is made at [addr, addr+len): the parts it touches are to be unlogged (fast first
 * touch), and their stillness starts over. */
static void window_unlog(zb_memory *m, uint64_t addr, uint64_t len) {
    uint64_t lo = ZB_MAX(addr, m->unlogged_lo), hi = ZB_MIN(addr + len, m->unlogged_hi);
    if (!m->window_parts || lo >= hi) return;
    for (int k = zb_mem_window_part(m, lo / ZB_PAGE); k <= zb_mem_window_part(m, (hi - 1) / ZB_PAGE); k++) {
        m->window_logged[k] = 0;
        m->window_still[k] = 0;
    }
}

/* Snapshots in a row that must find a part unchanged before it is logged; how much of a logged
 * part a snapshot must find rewritten to unlog it again (a fraction: 1/REWRITTEN_SHARE). */
#define STILL_SNAPSHOTS 2
#define REWRITTEN_SHARE 4

void zb_mem_window_observe(zb_memory *m) {
    for (uint32_t k = 0; k < m->window_parts; k++) {
        uint64_t first = m->unlogged_lo / ZB_PAGE + (uint64_t)k * m->window_part_pages;
        uint64_t end = ZB_MIN(first + m->window_part_pages, m->unlogged_hi / ZB_PAGE), changed = 0, held = 0;
        for (uint64_t w = first / 64; w < end / 64; w++) {
            changed += (uint64_t)__builtin_popcountll(m->host_dirty[w] & m->allocated[w]);
            held += (uint64_t)__builtin_popcountll(m->allocated[w]);
        }
        if (m->window_logged[k]) {
            if (changed * REWRITTEN_SHARE >= end - first) { m->window_logged[k] = 0; m->window_still[k] = 0; }
        } else if (held && !changed) {
            if (++m->window_still[k] >= STILL_SNAPSHOTS) m->window_logged[k] = 1;
        } else {
            m->window_still[k] = 0;
        }
    }
}

int zb_mem_init(zb_memory *m, uint64_t size, zb_image *image, char *err) {
    memset(m, 0, sizeof *m);
    if (size < ZB_MEM_MIN || size > ZB_MEM_MAX || size % ZB_HUGE) {
        zb_seterr(err, "guest memory must be a multiple of 2 MiB between %lu MiB and %lu GiB, not %llu bytes",
                  ZB_MEM_MIN >> 20, ZB_MEM_MAX >> 30, (unsigned long long)size);
        return -1;
    }
    m->size = size;
    m->npages = size / ZB_PAGE;
    if (image && image->size != size) {
        zb_seterr(err, "memory image is %llu bytes, the guest needs %llu", (unsigned long long)image->size,
                  (unsigned long long)size);
        return -1;
    }
    void *host = map_aligned(size, image);
    if (host == MAP_FAILED) {
        zb_seterr(err, "cannot reserve %llu MiB of host address space for guest memory: %s",
                  (unsigned long long)(size >> 20), strerror(errno));
        return -1;
    }
    m->host = host;
    m->allocated = calloc(1, bitmap_bytes(m->npages));
    m->host_dirty = calloc(1, bitmap_bytes(m->npages));
    m->file_backed = calloc(1, bitmap_bytes(m->npages));
    m->from_image = calloc(1, bitmap_bytes(m->npages));
    m->stale = calloc(1, bitmap_bytes(m->npages));
    m->dropped = calloc(1, bitmap_bytes(m->npages));
    if (!m->allocated || !m->host_dirty || !m->file_backed || !m->from_image || !m->stale || !m->dropped) {
        zb_seterr(err, "out of memory for guest page bitmaps");
        zb_mem_destroy(m);
        return -1;
    }
    if (image) {
        zb_image_ref(image);
        m->image = image;
        zb_bits_set_range(m->file_backed, 0, m->npages, 1);
        zb_bits_set_range(m->from_image, 0, m->npages, 1);
    }
    zb_bits_set_range(m->allocated, 0, ZB_LOW_REGION / ZB_PAGE, 1); /* never handed to the guest */
    m->pages_limit = m->npages;
    m->mmap_top = size - ZB_STACK_SIZE;
    if (place_unlogged_window(m) < 0) {
        zb_seterr(err, "out of memory for the guest's window bookkeeping");
        zb_mem_destroy(m);
        return -1;
    }
    return 0;
}

void zb_mem_budget_sync(zb_memory *m) {
    uint64_t now = zb_mem_charge(m);
    if (now > m->peak_charge) m->peak_charge = now;
    zb_mem_budget *b = m->budget;
    if (!b) return;
    b->used = b->used - m->charged + now;
    m->charged = now;
    if (zb_mem_budget_total(b) > b->peak) b->peak = zb_mem_budget_total(b);
}

static int budget_fits(zb_memory *m, uint64_t n) {
    zb_mem_budget_sync(m);
    uint64_t limit = m->budget->owner->pages_limit, total = zb_mem_budget_total(m->budget);
    return n <= limit && total <= limit && total + n <= limit;
}

int zb_mem_fits(zb_memory *m, uint64_t n) {
    if (n > m->pages_limit || m->pages_allocated + n > m->pages_limit) return 0;
    if (!m->budget || budget_fits(m, n)) return 1;
    if ((m->stale_pages || m->dropped_pages) && zb_mem_release_kept(m) == 0 && budget_fits(m, n)) return 1;
    m->budget->refusals++;
    return 0;
}

int zb_mem_budget_join(zb_memory *m, zb_mem_budget *b) {
    if (m->budget) zb_mem_budget_leave(m);
    uint64_t want = zb_mem_charge(m), limit = b->owner->pages_limit, total = zb_mem_budget_total(b);
    if (want > limit || total > limit || total + want > limit) { b->refusals++; return -ENOMEM; }
    m->budget = b;
    m->charged = 0;
    zb_mem_budget_sync(m);
    return 0;
}

void zb_mem_budget_own(zb_memory *m, zb_mem_budget *b) {
    memset(b, 0, sizeof *b);
    b->owner = m;
    m->budget = b;
    m->charged = 0;
    zb_mem_budget_sync(m);
}

void zb_mem_budget_leave(zb_memory *m) {
    zb_mem_budget *b = m->budget;
    if (!b) return;
    b->used = b->used >= m->charged ? b->used - m->charged : 0;
    m->budget = NULL;
    m->charged = 0;
}

void zb_mem_destroy(zb_memory *m) {
    if (m->host) munmap(m->host, m->size);
    free(m->allocated);
    free(m->host_dirty);
    free(m->file_backed);
    free(m->from_image);
    free(m->stale);
    free(m->dropped);
    free(m->window_logged);
    free(m->window_still);
    zb_reprotect_free(m);
    free(m->regions);
    zb_shmap_free(m->shmap);
    zb_image_unref(m->image);
    memset(m, 0, sizeof *m);
}

int zb_mem_meta_capture(const zb_memory *m, zb_mem_meta *out) {
    memset(out, 0, sizeof *out);
    size_t bb = bitmap_bytes(m->npages);
    if (!(out->allocated = malloc(bb))) return -1;
    memcpy(out->allocated, m->allocated, bb);
    if (m->nregions) {
        if (!(out->regions = malloc(m->nregions * sizeof(zb_region)))) { zb_mem_meta_free(out); return -1; }
        memcpy(out->regions, m->regions, m->nregions * sizeof(zb_region));
    }
    out->nregions = m->nregions;
    if (zb_shmap_copy(m->shmap, &out->shmap) < 0) { zb_mem_meta_free(out); return -1; }
    out->npages = m->npages;
    out->pages_allocated = m->pages_allocated;
    out->pages_limit = m->pages_limit;
    out->mmap_top = m->mmap_top;
    out->brk_start = m->brk_start;
    out->brk_end = m->brk_end;
    return 0;
}

int zb_mem_meta_apply(zb_memory *m, const zb_mem_meta *in) {
    if (in->npages != m->npages) return -1;
    zb_region *regions = NULL;
    if (in->nregions && !(regions = malloc(in->nregions * sizeof(zb_region)))) return -1;
    if (in->nregions) memcpy(regions, in->regions, in->nregions * sizeof(zb_region));
    struct zb_shmap *shmap;
    if (zb_shmap_copy(in->shmap, &shmap) < 0) { free(regions); return -1; }
    zb_shmap_free(m->shmap);
    m->shmap = shmap;
    memcpy(m->allocated, in->allocated, bitmap_bytes(m->npages));
    free(m->regions);
    m->regions = regions;
    m->nregions = m->regions_cap = in->nregions;
    m->pages_allocated = in->pages_allocated;
    m->pages_limit = in->pages_limit;
    m->mmap_top = in->mmap_top;
    m->brk_start = in->brk_start;
    m->brk_end = in->brk_end;
    zb_mem_budget_sync(m);
    return 0;
}

void zb_mem_meta_free(zb_mem_meta *meta) {
    free(meta->allocated);
    free(meta->regions);
    zb_shmap_free(meta->shmap);
    memset(meta, 0, sizeof *meta);
}

/* A snapshot's memory bookkeeping on disk: the counters, the allocation bitmap word by word and
 * the regions with their names. */
void zb_mem_meta_save(const zb_mem_meta *m, struct zb_out *o) {
    out_u64(o, m->npages);
    out_u64(o, m->pages_allocated);
    out_u64(o, m->pages_limit);
    out_u64(o, m->mmap_top);
    out_u64(o, m->brk_start);
    out_u64(o, m->brk_end);
    out_words(o, m->allocated, bitmap_bytes(m->npages) / 8);
    out_u64(o, m->nregions);
    for (size_t i = 0; i < m->nregions; i++) {
        out_u64(o, m->regions[i].start);
        out_u64(o, m->regions[i].end);
        out_u32(o, (uint32_t)m->regions[i].prot);
        out_str(o, m->regions[i].name);
    }
    zb_shmap_save(m->shmap, o);
}

/* More regions than any guest makes (each mmap call adds at most one). */
#define MAX_REGIONS 65536

int zb_mem_meta_load(zb_mem_meta *m, uint64_t npages, struct zb_in *in, char *err) {
    memset(m, 0, sizeof *m);
    m->npages = in_u64(in);
    m->pages_allocated = in_u64(in);
    m->pages_limit = in_u64(in);
    m->mmap_top = in_u64(in);
    m->brk_start = in_u64(in);
    m->brk_end = in_u64(in);
    if (in->err || m->npages != npages || m->pages_allocated > npages || m->pages_limit > npages) goto corrupt;
    if (!(m->allocated = malloc(bitmap_bytes(npages)))) goto oom;
    in_words(in, m->allocated, bitmap_bytes(npages) / 8);
    uint64_t n = in_count(in, MAX_REGIONS);
    if (in->err) goto corrupt;
    if (n && !(m->regions = calloc(n, sizeof *m->regions))) goto oom;
    for (uint64_t i = 0; i < n && !in->err; i++) {
        zb_region *r = &m->regions[i];
        r->start = in_u64(in);
        r->end = in_u64(in);
        r->prot = (int)in_u32(in);
        in_str_into(in, r->name, sizeof r->name);
        m->nregions++;
    }
    if (in->err || zb_shmap_load(&m->shmap, npages * ZB_PAGE, in) < 0) goto corrupt;
    return 0;
corrupt:
    zb_mem_meta_free(m);
    zb_seterr(err, "guest memory bookkeeping: truncated or corrupt");
    return -1;
oom:
    zb_mem_meta_free(m);
    zb_seterr(err, "out of memory");
    return -1;
}

void zb_mem_dirty(zb_memory *m, uint64_t addr, uint64_t len) {
    if (!len) return;
    uint64_t first = addr / ZB_PAGE, last = (addr + len - 1) / ZB_PAGE;
    zb_bits_set_range(m->host_dirty, first, last - first + 1, 1);
}

int zb_mem_range_allocated(const zb_memory *m, uint64_t addr, uint64_t len) {
    if (!len) return 1;
    if (addr + len < addr || addr + len > m->size) return 0;
    uint64_t first = addr / ZB_PAGE, last = (addr + len - 1) / ZB_PAGE;
    return bits_all(m->allocated, first, last - first + 1, 1);
}

int zb_mem_range_free(const zb_memory *m, uint64_t addr, uint64_t len) {
    if (addr + len < addr || addr + len > m->size) return 0;
    return bits_all(m->allocated, addr / ZB_PAGE, ZB_PAGE_UP(len) / ZB_PAGE, 0);
}

/* Zero the pages of [first, first+n) kept for reuse, in runs, and forget that they were. */
static void zero_stale(zb_memory *m, uint64_t first, uint64_t n) {
    for (uint64_t p = first; p < first + n && m->stale_pages;) {
        if (!(p & 63) && p + 64 <= first + n && !m->stale[p >> 6]) { p += 64; continue; }
        if (!zb_bit(m->stale, p)) { p++; continue; }
        uint64_t q = p;
        while (q < first + n && zb_bit(m->stale, q)) q++;
        memset(m->host + p * ZB_PAGE, 0, (q - p) * ZB_PAGE);
        zb_bits_set_range(m->stale, p, q - p, 0);
        m->stale_pages -= q - p;
        p = q;
    }
}

/* Forget that pages of the range were kept for reuse: their content was just replaced. */
static void forget_stale(zb_memory *m, uint64_t first, uint64_t n) {
    if (!m->stale_pages) return;
    for (uint64_t p = first; p < first + n; p++)
        if (zb_bit(m->stale, p)) { zb_bit_clear(m->stale, p); m->stale_pages--; }
}

/* Forget that pages of the range were dropped: their content was just replaced. */
static void forget_dropped(zb_memory *m, uint64_t first, uint64_t n) {
    if (!m->dropped_pages) return;
    for (uint64_t p = first; p < first + n; p++)
        if (zb_bit(m->dropped, p)) { zb_bit_clear(m->dropped, p); m->dropped_pages--; }
}

/* Dropped anonymous runs up to this long are cleared in place: their host pages stay, and with them
 * KVM's shadow pages of them (each page given back costs the new program a 20-40 us fault when it
 * touches it: ~60 of the ~250 faults of an exec'd /bin/true). */
#define ZERO_IN_PLACE_MAX_PAGES 512u

/* Zero pages [p, q): in place if short and anonymous, else with zb_mem_zero (host pages given back;
 * cleared in place if that fails). */
static void zero_run(zb_memory *m, uint64_t p, uint64_t q) {
    int in_place = q - p <= ZERO_IN_PLACE_MAX_PAGES && bits_all(m->file_backed, p, q - p, 0);
    if (!in_place && zb_mem_zero(m, p * ZB_PAGE, (q - p) * ZB_PAGE) == 0) return; /* it forgets them */
    memset(m->host + p * ZB_PAGE, 0, (q - p) * ZB_PAGE);
    zb_bits_set_range(m->host_dirty, p, q - p, 1);
    forget_stale(m, p, q - p);
    forget_dropped(m, p, q - p);
}

/* A dropped page that the host has not populated reads as zeros if its mapping is anonymous or a
 * hole of the image: it is handed out as it is, so it stays out of the dirty set (an exec'd
 * program's 8 MiB stack lies where the old one's was, mostly never touched: zeroing all of it
 * made the restore that reuses the memory rewrite 2,048 pages, 4 ms). Any page the guest wrote is
 * populated. */
static int reads_zero(const zb_memory *m, uint64_t pfn, const uint64_t *populated) {
    if (zb_bit(populated, pfn)) return 0;
    return !zb_bit(m->file_backed, pfn) || (zb_bit(m->from_image, pfn) && zb_image_page_is_hole(m->image, pfn));
}

/* Zero the dropped pages of [first, first+n) that may not read as zeros, and forget the others. */
static void zero_dropped(zb_memory *m, uint64_t first, uint64_t n) {
    uint64_t *populated = NULL;
    for (uint64_t p = first; p < first + n && m->dropped_pages;) {
        if (!(p & 63) && p + 64 <= first + n && !m->dropped[p >> 6]) { p += 64; continue; }
        if (!zb_bit(m->dropped, p)) { p++; continue; }
        uint64_t q = p;
        while (q < first + n && zb_bit(m->dropped, q)) q++;
        if (!populated && !(populated = calloc(1, bitmap_bytes(m->npages)))) { zero_run(m, p, q); p = q; continue; }
        zb_mem_populated(m, p, q - p, populated); /* all of it if it cannot tell */
        for (uint64_t r = p; r < q;) {
            uint64_t e = r;
            int zero = reads_zero(m, r, populated);
            while (e < q && reads_zero(m, e, populated) == zero) e++;
            if (zero) forget_dropped(m, r, e - r);
            else zero_run(m, r, e);
            r = e;
        }
        p = q;
    }
    free(populated);
}

void zb_mem_mark(zb_memory *m, uint64_t addr, uint64_t len, int allocated) {
    uint64_t first = addr / ZB_PAGE, n = ZB_PAGE_UP(len) / ZB_PAGE;
    if (allocated) { /* freed memory reads as zeros when handed out again */
        zero_stale(m, first, n);
        zero_dropped(m, first, n);
    }
    for (uint64_t p = first; p < first + n; p++) {
        if (zb_bit(m->allocated, p) == allocated) continue;
        if (allocated) { zb_bit_set(m->allocated, p); m->pages_allocated++; }
        else { zb_bit_clear(m->allocated, p); m->pages_allocated--; }
    }
    zb_mem_budget_sync(m);
}

/* The highest free run of n pages in pages [lo, hi) whose first page is a multiple of align
 * (pages); 0 if none. */
static uint64_t alloc_in(const zb_memory *m, uint64_t n, uint64_t lo, uint64_t hi, uint64_t align) {
    uint64_t run = 0; /* free pages from p up */
    for (uint64_t p = hi; p-- > lo;) {
        if (!(p & 63) && p + 64 <= hi && m->allocated[p >> 6] == ~0ull) { run = 0; continue; }
        if (zb_bit(m->allocated, p)) { run = 0; continue; }
        if (++run >= n && !(p % align)) return p * ZB_PAGE;
    }
    return 0;
}

/* Top-down below mmap_top. A big data mapping goes into the unlogged window first (2 MiB aligned);
 * the others go around it, and into it only when nothing else is left. */
uint64_t zb_mem_alloc(zb_memory *m, uint64_t len, zb_alloc_kind kind) {
    uint64_t n = ZB_PAGE_UP(len) / ZB_PAGE, at = 0;
    if (!n || !zb_mem_fits(m, n)) return 0;
    uint64_t low = ZB_LOW_REGION / ZB_PAGE, top = m->mmap_top / ZB_PAGE;
    uint64_t wlo = ZB_MIN(m->unlogged_lo / ZB_PAGE, top), whi = ZB_MIN(m->unlogged_hi / ZB_PAGE, top);
    if (wlo >= whi) return alloc_in(m, n, low, top, 1);
    if (kind == ZB_ALLOC_DATA && len >= ZB_UNLOGGED_MIN_BYTES && (at = alloc_in(m, n, wlo, whi, ZB_HUGE / ZB_PAGE))) return at;
    if ((at = alloc_in(m, n, whi, top, 1)) || (at = alloc_in(m, n, low, wlo, 1))) return at;
    return alloc_in(m, n, low, top, 1);
}

/* PAGEMAP_SCAN (Linux 6.7, <linux/fs.h>; spelled out here for older headers): the populated
 * ranges of a mapping in one call, instead of 8 bytes per page read from pagemap. */
#define ZB_PAGEMAP_SCAN _IOWR('f', 16, struct zb_pm_scan_arg)
#define ZB_PAGE_IS_PRESENT (1ull << 3)
#define ZB_PAGE_IS_SWAPPED (1ull << 4)
struct zb_page_region { uint64_t start, end, categories; };
struct zb_pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};

/* PAGEMAP_SCAN over the guest's pages [first, end_page) with the filter's categories
 * (category_inverted/mask/anyof_mask, return_mask): each matching run of pages, as page numbers,
 * goes to each(ctx, first_page, pages). -1 if this kernel has no PAGEMAP_SCAN or answered
 * something out of the range asked (each may have seen some runs then). */
typedef void (*pm_run_fn)(void *ctx, uint64_t first, uint64_t pages);
static int pagemap_scan(const zb_memory *m, int fd, uint64_t first, uint64_t end_page, const struct zb_pm_scan_arg *filter,
                        pm_run_fn each, void *ctx) {
    enum { NREGIONS = 256 };
    struct zb_page_region vec[NREGIONS];
    uint64_t base = (uint64_t)(uintptr_t)m->host, end = base + end_page * ZB_PAGE;
    struct zb_pm_scan_arg arg = *filter;
    arg.size = sizeof arg;
    arg.start = base + first * ZB_PAGE;
    arg.end = end;
    arg.vec = (uint64_t)(uintptr_t)vec;
    arg.vec_len = NREGIONS;
    while (arg.start < end) {
        int got = ioctl(fd, ZB_PAGEMAP_SCAN, &arg);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        for (int i = 0; i < got && i < NREGIONS; i++) {
            if (vec[i].start < arg.start || vec[i].end > end || vec[i].start >= vec[i].end) return -1;
            each(ctx, (vec[i].start - base) / ZB_PAGE, (vec[i].end - vec[i].start) / ZB_PAGE);
        }
        if (arg.walk_end <= arg.start || arg.walk_end > end) return -1;
        arg.start = arg.walk_end;
    }
    return 0;
}

static void set_populated(void *dirty, uint64_t first, uint64_t pages) { zb_bits_set_range(dirty, first, pages, 1); }

/* Set in dirty the populated pages of the window's pages [first, first+n) with PAGEMAP_SCAN; -1 if
 * this kernel has none (nothing set then). */
static int scan_populated(const zb_memory *m, int fd, uint64_t first, uint64_t n, uint64_t *dirty) {
    struct zb_pm_scan_arg filter = {.category_anyof_mask = ZB_PAGE_IS_PRESENT | ZB_PAGE_IS_SWAPPED,
                                    .return_mask = ZB_PAGE_IS_PRESENT | ZB_PAGE_IS_SWAPPED};
    return pagemap_scan(m, fd, first, first + n, &filter, set_populated, dirty);
}

void zb_mem_populated(const zb_memory *m, uint64_t first, uint64_t n, uint64_t *dirty) {
    if (!n || first + n > m->npages) return;
    int fd = zb_self_pagemap_fd();
    if (fd >= 0 && scan_populated(m, fd, first, n, dirty) == 0) return;
    /* without PAGEMAP_SCAN: 8 bytes per page, bit 63 present, bit 62 swapped */
    enum { BATCH = 4096 };
    uint64_t *e = fd >= 0 ? malloc(BATCH * sizeof *e) : NULL;
    uint64_t done = 0;
    while (e && done < n) {
        uint64_t k = ZB_MIN((uint64_t)BATCH, n - done);
        off_t at = (off_t)(((uintptr_t)m->host / ZB_PAGE + first + done) * 8);
        ssize_t got = pread(fd, e, k * 8, at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0 || got % 8) break;
        for (uint64_t i = 0; i < (uint64_t)got / 8; i++)
            if (e[i] >> 62) zb_bit_set(dirty, first + done + i);
        done += (uint64_t)got / 8;
    }
    if (done < n) zb_bits_set_range(dirty, first + done, n - done, 1); /* cannot tell: all of it */
    free(e);
}

int zb_mem_zero(zb_memory *m, uint64_t addr, uint64_t len) {
    len = ZB_PAGE_UP(len);
    uint64_t first = addr / ZB_PAGE, n = len / ZB_PAGE;
    if (!n) return 0;
    if (!bits_all(m->file_backed, first, n, 0)) {
        /* MADV_DONTNEED would bring back the file's bytes: map fresh anonymous memory instead */
        void *p = mmap(m->host + addr, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED) return -errno;
        zb_bits_set_range(m->file_backed, first, n, 0);
        zb_bits_set_range(m->from_image, first, n, 0);
    } else if (madvise(m->host + addr, len, MADV_DONTNEED) < 0) {
        return -errno;
    }
    forget_stale(m, first, n);
    forget_dropped(m, first, n);
    zb_bits_set_range(m->host_dirty, first, n, 1);
    zb_mem_budget_sync(m);
    return 0;
}

/* Freed ranges at least this big are kept for reuse, up to STALE_MAX_BYTES (and half of guest
 * memory) in all: enough for the temporaries of array expressions and for the frames a cell
 * replaces. Measured on `df = df * 1.01 + i` with a 200 MB DataFrame in a 1 GiB guest: a quarter
 * keeps one of its two temporaries, 1,176 ms per cell; half keeps both, 149 ms (ipykernel ~250 ms),
 * for +190 MB of host memory between cells. */
#define REUSE_MIN_BYTES (1ul << 20)
#define STALE_MAX_BYTES (1ul << 30)

int zb_mem_free_for_reuse(zb_memory *m, uint64_t addr, uint64_t len) {
    len = ZB_PAGE_UP(len);
    uint64_t first = addr / ZB_PAGE, n = len / ZB_PAGE;
    if (len < REUSE_MIN_BYTES || (m->stale_pages + n) * ZB_PAGE > ZB_MIN(STALE_MAX_BYTES, m->size / 2) ||
        !bits_all(m->file_backed, first, n, 0) || !bits_all(m->allocated, first, n, 1))
        return zb_mem_zero(m, addr, len);
    zb_bits_set_range(m->stale, first, n, 1);
    m->stale_pages += n;
    zb_bits_set_range(m->host_dirty, first, n, 1); /* a snapshot must see these pages freed */
    return 0; /* the caller's zb_mem_mark syncs the charge: allocated pages become stale ones */
}

/* Give back the pages of `marked` (m's stale or dropped bitmap, whose count is *left), in runs:
 * zb_mem_zero clears their bits and the count. */
static int release_marked(zb_memory *m, const uint64_t *marked, const uint64_t *left) {
    for (uint64_t p = 0; p < m->npages && *left;) {
        if (!(p & 63) && !marked[p >> 6]) { p += 64; continue; }
        if (!zb_bit(marked, p)) { p++; continue; }
        uint64_t q = p;
        while (q < m->npages && zb_bit(marked, q)) q++;
        int rc = zb_mem_zero(m, p * ZB_PAGE, (q - p) * ZB_PAGE);
        if (rc < 0) return rc;
        p = q;
    }
    return 0;
}

int zb_mem_release_stale(zb_memory *m) { return release_marked(m, m->stale, &m->stale_pages); }

void zb_mem_drop(zb_memory *m, uint64_t addr, uint64_t len) {
    uint64_t first = addr / ZB_PAGE, n = ZB_PAGE_UP(len) / ZB_PAGE;
    for (uint64_t p = first; p < first + n; p++) {
        if (!zb_bit(m->allocated, p) || zb_bit(m->dropped, p)) continue;
        zb_bit_set(m->dropped, p);
        m->dropped_pages++;
    }
    zb_mem_mark(m, addr, len, 0); /* syncs the charge: allocated pages become dropped ones */
}

int zb_mem_release_dropped(zb_memory *m) { return release_marked(m, m->dropped, &m->dropped_pages); }

int zb_mem_release_kept(zb_memory *m) {
    int rc = zb_mem_release_stale(m);
    return rc < 0 ? rc : zb_mem_release_dropped(m);
}

void zb_mem_forget_dropped(zb_memory *m) {
    if (!m->dropped_pages) return;
    memset(m->dropped, 0, bitmap_bytes(m->npages));
    m->dropped_pages = 0;
    zb_mem_budget_sync(m);
}

/* Mappings at least this big are prefaulted on the host, and backed by huge pages where their
 * 2 MiB-aligned middle allows. */
#define PREFAULT_MIN_BYTES (1ul << 20)

void zb_mem_prefault_anonymous(zb_memory *m, uint64_t addr, uint64_t len) {
    len = ZB_PAGE_UP(len);
    if (len < PREFAULT_MIN_BYTES) return;
    uint64_t first = addr / ZB_PAGE, n = len / ZB_PAGE;
    if (len >= ZB_UNLOGGED_MIN_BYTES) window_unlog(m, addr, len); /* zb_vm_sync_window applies it */
    /* a fork's free memory is a private view of the image file, which gets no huge pages and
     * whose first write is a copy: map fresh anonymous memory there first (it is zeros either way) */
    if (!bits_all(m->file_backed, first, n, 0) && zb_mem_zero(m, addr, len) < 0) return;
    uint64_t lo = (addr + ZB_HUGE - 1) & ~(ZB_HUGE - 1), hi = (addr + len) & ~(ZB_HUGE - 1);
    if (hi > lo) (void)madvise(m->host + lo, hi - lo, MADV_HUGEPAGE);
    (void)madvise(m->host + addr, len, MADV_POPULATE_WRITE);
}

int zb_mem_map_file(zb_memory *m, uint64_t addr, uint64_t len, int fd, uint64_t offset) {
    len = ZB_PAGE_UP(len);
    void *p = mmap(m->host + addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd, (off_t)offset);
    if (p == MAP_FAILED) return -errno;
    zb_bits_set_range(m->file_backed, addr / ZB_PAGE, len / ZB_PAGE, 1);
    zb_bits_set_range(m->from_image, addr / ZB_PAGE, len / ZB_PAGE, 0);
    zb_mem_dirty(m, addr, len);
    return 0;
}

int zb_mem_revert_to_image(zb_memory *m, uint64_t addr, uint64_t len) {
    uint64_t first = addr / ZB_PAGE, n = ZB_PAGE_UP(len) / ZB_PAGE;
    if (!m->image) return zb_mem_zero(m, addr, len); /* a boot sandbox's base is all zeros */
    if (bits_all(m->from_image, first, n, 1)) {
        if (madvise(m->host + addr, n * ZB_PAGE, MADV_DONTNEED) < 0) return -errno; /* drops private copies */
    } else {
        void *p = mmap(m->host + addr, n * ZB_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
                       m->image->fd, (off_t)addr);
        if (p == MAP_FAILED) return -errno;
        zb_bits_set_range(m->file_backed, first, n, 1);
        zb_bits_set_range(m->from_image, first, n, 1);
    }
    return 0;
}

/* pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst): present, and "file page or shared
 * anonymous"; a private copy-on-write copy of a file page is present and not that. */
#define PM_PRESENT (1ull << 63)
#define PM_FILE_OR_SHARED (1ull << 61)

static int same_as_image(const zb_memory *m, uint64_t pfn) {
    const uint8_t *now = m->host + pfn * ZB_PAGE;
    if (zb_image_page_is_hole(m->image, pfn)) {
        const uint64_t *w = (const uint64_t *)now;
        for (size_t i = 0; i < ZB_PAGE / 8; i++)
            if (w[i]) return 0;
        return 1;
    }
    return !memcmp(now, m->image->map + pfn * ZB_PAGE, ZB_PAGE);
}

/* MADV_DONTNEED on pages [first, first+n): they are mapped from the image at their own offset and
 * hold its bytes, so the guest reads the same bytes afterwards (from the shared page cache). */
static int64_t release_run(zb_memory *m, uint64_t first, uint64_t n) {
    if (!n) return 0;
    return madvise(m->host + first * ZB_PAGE, n * ZB_PAGE, MADV_DONTNEED) < 0 ? 0 : (int64_t)n;
}

/* The releaser's pass over one candidate page: extends the run of pages to release, or releases
 * the run so far and starts a new one. */
typedef struct { zb_memory *m; uint64_t run, len; int64_t released; } release_pass;

static void release_consider(release_pass *r, uint64_t pfn) {
    zb_memory *m = r->m;
    if (!zb_bit(m->from_image, pfn) || !zb_bit(m->file_backed, pfn) || !same_as_image(m, pfn)) return;
    if (r->len && r->run + r->len == pfn) { r->len++; return; }
    r->released += release_run(m, r->run, r->len);
    r->run = pfn;
    r->len = 1;
}

#define ZB_PAGE_IS_FILE (1ull << 2)

static void consider_run(void *r, uint64_t first, uint64_t pages) {
    for (uint64_t pfn = first; pfn < first + pages; pfn++) release_consider(r, pfn);
}

/* The private copies among pages [0, limit) with PAGEMAP_SCAN (present and not a file page, in
 * one call per 256 runs); -1 if this kernel has none. */
static int release_scan(release_pass *r, int fd, uint64_t limit) {
    struct zb_pm_scan_arg filter = {.category_inverted = ZB_PAGE_IS_FILE,
                                    .category_mask = ZB_PAGE_IS_FILE | ZB_PAGE_IS_PRESENT,
                                    .return_mask = ZB_PAGE_IS_FILE | ZB_PAGE_IS_PRESENT};
    return pagemap_scan(r->m, fd, 0, limit, &filter, consider_run, r);
}

/* The same with 8 bytes of /proc/self/pagemap per page. */
static void release_read(release_pass *r, int fd, uint64_t limit) {
    enum { BATCH = 4096 };
    uint64_t *e = malloc(BATCH * sizeof *e);
    for (uint64_t first = 0; e && first < limit; first += BATCH) {
        uint64_t k = ZB_MIN((uint64_t)BATCH, limit - first), got = 0;
        if (bits_all(r->m->from_image, first, k, 0)) continue; /* nothing here is the image's */
        while (got < k * 8) {
            off_t at = (off_t)(((uintptr_t)r->m->host / ZB_PAGE + first) * 8 + got);
            ssize_t n = pread(fd, (uint8_t *)e + got, k * 8 - got, at);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (uint64_t)n;
        }
        for (uint64_t i = 0; i < got / 8; i++)
            if ((e[i] & PM_PRESENT) && !(e[i] & PM_FILE_OR_SHARED)) release_consider(r, first + i);
        if (got < k * 8) break; /* cannot read further: release what was found */
    }
    free(e);
}

int64_t zb_mem_release_image_copies(zb_memory *m) {
    if (!m->image || !m->image->map) return 0;
    uint64_t limit = ZB_MIN(m->npages, m->image->size / ZB_PAGE);
    int fd = zb_self_pagemap_fd();
    if (fd < 0) return -errno;
    release_pass r = {m, 0, 0, 0};
    if (release_scan(&r, fd, limit) < 0) release_read(&r, fd, limit);
    r.released += release_run(m, r.run, r.len);
    return r.released;
}

void *zb_guest_ptr(zb_sandbox *sb, uint64_t addr, uint64_t len, int write) {
    zb_memory *m = &sb->mem;
    if (!len) return m->host + ZB_LOW_REGION; /* never dereferenced for an empty buffer */
    if (addr < ZB_LOW_REGION || addr + len < addr || addr + len > m->size) return NULL;
    if (!zb_mem_range_allocated(m, addr, len)) return NULL;
    if (write) zb_mem_dirty(m, addr, len);
    return m->host + addr;
}

int zb_copy_from_guest(zb_sandbox *sb, void *dst, uint64_t addr, uint64_t len) {
    void *p = zb_guest_ptr(sb, addr, len, 0);
    if (!p) return -EFAULT;
    memcpy(dst, p, len);
    return 0;
}

int zb_copy_to_guest(zb_sandbox *sb, uint64_t addr, const void *src, uint64_t len) {
    void *p = zb_guest_ptr(sb, addr, len, 1);
    if (!p) return -EFAULT;
    memcpy(p, src, len);
    return 0;
}

int zb_guest_string(zb_sandbox *sb, uint64_t addr, char *buf, size_t cap) {
    zb_memory *m = &sb->mem;
    size_t n = 0;
    while (n < cap) {
        uint64_t a = addr + n;
        if (a < ZB_LOW_REGION || a >= m->size || !zb_bit(m->allocated, a / ZB_PAGE)) return -EFAULT;
        size_t chunk = ZB_MIN(cap - n, ZB_PAGE - (a % ZB_PAGE));
        const char *src = (const char *)m->host + a;
        const char *nul = memchr(src, 0, chunk);
        if (nul) {
            memcpy(buf + n, src, nul - src + 1);
            return 0;
        }
        memcpy(buf + n, src, chunk);
        n += chunk;
    }
    return -ENAMETOOLONG;
}

/* ---- regions: names of what the guest mapped, for fault reports ---- */

static int regions_reserve(zb_memory *m, size_t n) {
    if (n <= m->regions_cap) return 0;
    size_t cap = m->regions_cap ? m->regions_cap * 2 : 64;
    while (cap < n) cap *= 2;
    zb_region *nr = realloc(m->regions, cap * sizeof *nr);
    if (!nr) return -1;
    m->regions = nr;
    m->regions_cap = cap;
    return 0;
}

void zb_region_remove(zb_memory *m, uint64_t start, uint64_t end) {
    for (size_t i = 0; i < m->nregions; i++) {
        if (m->regions[i].start < start && m->regions[i].end > end) {
            /* the range punches a hole into one region: split it in two first */
            if (regions_reserve(m, m->nregions + 1) < 0) { m->regions[i].end = start; break; }
            memmove(&m->regions[i + 1], &m->regions[i], (m->nregions - i) * sizeof(zb_region));
            m->nregions++;
            m->regions[i].end = start;
            m->regions[i + 1].start = end;
            return;
        }
    }
    size_t w = 0;
    for (size_t i = 0; i < m->nregions; i++) {
        zb_region r = m->regions[i];
        if (r.start < start && r.end > start) r.end = start;   /* overlaps on its right */
        else if (r.start < end && r.end > end) r.start = end;  /* overlaps on its left */
        else if (r.start >= start && r.end <= end) continue;   /* inside: dropped */
        m->regions[w++] = r;
    }
    m->nregions = w;
}

void zb_region_add(zb_memory *m, uint64_t start, uint64_t end, int prot, const char *name) {
    zb_region_remove(m, start, end);
    if (m->nregions >= MAX_REGIONS || regions_reserve(m, m->nregions + 1) < 0) return;
    size_t i = m->nregions;
    while (i > 0 && m->regions[i - 1].start > start) i--;
    memmove(&m->regions[i + 1], &m->regions[i], (m->nregions - i) * sizeof(zb_region));
    zb_region *r = &m->regions[i];
    r->start = start;
    r->end = end;
    r->prot = prot;
    snprintf(r->name, sizeof r->name, "%s", name ? name : "");
    m->nregions++;
}

void zb_region_set_prot(zb_memory *m, uint64_t start, uint64_t end, int prot) {
    zb_region pieces[16];
    size_t n = 0;
    for (size_t i = 0; i < m->nregions && n < 16; i++) {
        zb_region r = m->regions[i];
        if (r.end <= start || r.start >= end) continue;
        r.start = ZB_MAX(r.start, start);
        r.end = ZB_MIN(r.end, end);
        r.prot = prot;
        pieces[n++] = r;
    }
    for (size_t i = 0; i < n; i++) zb_region_add(m, pieces[i].start, pieces[i].end, prot, pieces[i].name);
}

const zb_region *zb_region_find(const zb_memory *m, uint64_t addr) {
    size_t lo = 0, hi = m->nregions;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->regions[mid].end <= addr) lo = mid + 1;
        else hi = mid;
    }
    if (lo < m->nregions && m->regions[lo].start <= addr && addr < m->regions[lo].end) return &m->regions[lo];
    return NULL;
}

uint64_t zb_sandbox_window_logged_bytes(zb_sandbox *sb) {
    const zb_memory *m = &sb->mem;
    uint64_t pages = 0;
    for (uint32_t k = 0; k < m->window_parts; k++) {
        uint64_t first = m->unlogged_lo / ZB_PAGE + (uint64_t)k * m->window_part_pages;
        if (m->window_logged[k]) pages += ZB_MIN(first + m->window_part_pages, m->unlogged_hi / ZB_PAGE) - first;
    }
    return pages * ZB_PAGE;
}

int64_t zb_sandbox_release_freed(zb_sandbox *sb, char *err) {
    uint64_t n = sb->mem.stale_pages + sb->mem.dropped_pages;
    int rc = zb_mem_release_kept(&sb->mem);
    if (rc < 0) {
        zb_seterr(err, "cannot give back the guest's freed memory: %s", strerror(-rc));
        return -1;
    }
    return (int64_t)(n - sb->mem.stale_pages - sb->mem.dropped_pages);
}

int64_t zb_sandbox_release_template_copies(zb_sandbox *sb, char *err) {
    int64_t n = zb_mem_release_image_copies(&sb->mem);
    if (n < 0) zb_seterr(err, "cannot release the guest's unchanged pages: %s", strerror((int)-n));
    return n < 0 ? -1 : n;
}
