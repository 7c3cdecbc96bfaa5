/* shared_map.c - MAP_SHARED mappings of overlay files, kept coherent with the file's data.
 *
 * A mapping is a copy of the file range in guest memory (the guest's page tables cannot point at
 * other pages), authoritative while it exists: the hooks in file_overlay.c, sys_fsmeta.c,
 * fs_export.c and snapshot.c write it back before the file's data is read, and refresh it after
 * the data is changed. Write-back compares page by page and writes only pages that differ, so it
 * costs a read of the mapped range, never more. The processes of a family share a mapping
 * inherited across fork by handing its bytes over through the file at every process switch (the
 * end of this file). See shared_map.h.
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "shared_map.h"

static uint64_t end_of(uint64_t a, uint64_t n) { return a + n < a ? UINT64_MAX : a + n; }

static int guest_overlaps(const zb_shmap_entry *e, uint64_t addr, uint64_t len) {
    return addr < e->addr + e->len && e->addr < end_of(addr, len);
}

static int file_overlaps(const zb_shmap_entry *e, uint32_t ino, uint64_t off, uint64_t len) {
    return (!ino || e->ino == ino) && off < e->off + e->len && e->off < end_of(off, len);
}

long zb_shmap_check(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len, int writable, uint64_t replaces,
                    uint64_t replaces_len) {
    if (off + len < off) return -EOVERFLOW; /* as Linux: the file range wraps */
    const struct zb_shmap *t = sb->mem.shmap;
    if (!t) return 0;
    if (t->n >= ZB_SHMAP_MAX) return -ENOMEM;
    for (size_t i = 0; i < t->n; i++) {
        const zb_shmap_entry *e = &t->e[i];
        if (replaces_len && e->addr >= replaces && e->addr + e->len <= replaces + replaces_len) continue; /* goes */
        if (file_overlaps(e, ino, off, len) && (writable || e->writable)) return -EBUSY;
    }
    return 0;
}

static int mapped_in(const struct zb_shmap *t, uint32_t ino) {
    for (size_t i = 0; t && i < t->n; i++)
        if (t->e[i].ino == ino) return 1;
    return 0;
}

int zb_shmap_mapped(const zb_sandbox *sb, uint32_t ino) {
    if (mapped_in(sb->mem.shmap, ino)) return 1;
    for (int i = 0; sb->fam && i < sb->fam->count; i++) /* the family shares the file (and inherited mappings) */
        if (sb->fam->m[i].sb && sb->fam->m[i].sb != sb && mapped_in(sb->fam->m[i].sb->mem.shmap, ino)) return 1;
    return 0;
}

uint64_t zb_shmap_alias(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len, int writable) {
    struct zb_shmap *t = sb->mem.shmap;
    zb_shmap_entry *same = NULL;
    for (size_t i = 0; t && i < t->n; i++) {
        zb_shmap_entry *e = &t->e[i];
        if (!file_overlaps(e, ino, off, len)) continue;
        if (same || e->off != off || e->len != len) return 0; /* any other overlap: no alias */
        same = e;
    }
    if (!same || (writable && !same->writable) || same->aliases >= ZB_SHMAP_ALIASES_MAX) return 0;
    same->aliases++;
    return same->addr;
}

int zb_shmap_unalias(zb_sandbox *sb, uint64_t addr, uint64_t len) {
    struct zb_shmap *t = sb->mem.shmap;
    uint64_t end = end_of(addr, len);
    for (size_t i = 0; t && i < t->n; i++) {
        zb_shmap_entry *e = &t->e[i];
        if (e->aliases && guest_overlaps(e, addr, len) && (addr != e->addr || end != e->addr + e->len))
            return -EBUSY; /* not exactly the aliased mapping: its pages are also the aliases' */
    }
    int took = 0;
    for (size_t i = 0; t && i < t->n; i++) {
        zb_shmap_entry *e = &t->e[i];
        if (e->aliases && e->addr == addr && e->len == len) { e->aliases--; took = 1; }
    }
    return took;
}

int zb_shmap_aliased_in(const zb_memory *m, uint64_t addr, uint64_t len) {
    const struct zb_shmap *t = m->shmap;
    for (size_t i = 0; t && i < t->n; i++)
        if (t->e[i].aliases && guest_overlaps(&t->e[i], addr, len)) return 1;
    return 0;
}

long zb_shmap_add(zb_sandbox *sb, uint32_t ino, uint64_t addr, uint64_t len, uint64_t off, int writable) {
    struct zb_shmap *t = sb->mem.shmap;
    if (!t && !(t = sb->mem.shmap = calloc(1, sizeof *t))) return -ENOMEM;
    if (t->n >= ZB_SHMAP_MAX) return -ENOMEM;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        zb_shmap_entry *ne = realloc(t->e, cap * sizeof *ne);
        if (!ne) return -ENOMEM;
        t->e = ne;
        t->cap = cap;
    }
    t->e[t->n++] = (zb_shmap_entry){.addr = addr, .len = len, .off = off, .ino = ino, .writable = (uint16_t)!!writable};
    zb_ovl_open_ref(sb->fs, ino, 1); /* a mapping keeps an unlinked file alive, as on Linux */
    return 0;
}

/* Write back e's pages holding file bytes [lo, hi), where they differ from the file's data. */
static long entry_writeback(zb_sandbox *sb, const zb_shmap_entry *e, uint64_t lo, uint64_t hi) {
    const zb_inode *in = zb_ovl_inode(sb->fs, e->ino);
    if (!e->writable || !in || in->type != INO_FILE) return 0;
    if (e->addr + e->len > sb->mem.size) return 0; /* checked at load: never */
    uint64_t start = ZB_MAX(lo, e->off) & ~(uint64_t)(ZB_PAGE - 1);
    uint64_t end = ZB_MIN(ZB_MIN(hi, e->off + e->len), in->size); /* bytes past the end are not kept */
    uint8_t file[ZB_PAGE];
    for (uint64_t p = start; p < end; p += ZB_PAGE) {
        size_t n = (size_t)ZB_MIN((uint64_t)ZB_PAGE, end - p);
        const uint8_t *mapped = sb->mem.host + e->addr + (p - e->off);
        long r = zb_ovl_read(sb->fs, e->ino, file, n, p);
        if (r == (long)n && !memcmp(file, mapped, n)) continue;
        r = zb_ovl_write(sb->fs, e->ino, mapped, n, p);
        if (r < 0) return r;
    }
    return 0;
}

long zb_shmap_writeback(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len) {
    const struct zb_shmap *t = sb->mem.shmap;
    long rc = 0;
    for (size_t i = 0; t && i < t->n; i++) {
        if (!file_overlaps(&t->e[i], ino, off, len)) continue;
        long r = entry_writeback(sb, &t->e[i], off, end_of(off, len));
        if (r < 0 && !rc) rc = r;
    }
    return rc;
}

/* Copy the file bytes [lo, hi) into e's pages that hold them (zeros past the end of the file). */
static void entry_reload(zb_sandbox *sb, const zb_shmap_entry *e, uint64_t lo, uint64_t hi) {
    if (e->addr + e->len > sb->mem.size) return; /* checked at load: never */
    uint64_t start = ZB_MAX(lo, e->off), end = ZB_MIN(hi, e->off + e->len);
    if (start >= end) return;
    uint8_t *mapped = sb->mem.host + e->addr + (start - e->off);
    long r = zb_ovl_read(sb->fs, e->ino, mapped, end - start, start);
    size_t got = r > 0 ? (size_t)r : 0;
    memset(mapped + got, 0, end - start - got);
    zb_mem_dirty(&sb->mem, e->addr + (start - e->off), end - start);
}

void zb_shmap_reload(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len) {
    const struct zb_shmap *t = sb->mem.shmap;
    for (size_t i = 0; t && i < t->n; i++)
        if (file_overlaps(&t->e[i], ino, off, len)) entry_reload(sb, &t->e[i], off, end_of(off, len));
}


const zb_shmap_entry *zb_shmap_find(const zb_memory *m, uint64_t addr, uint64_t len) {
    const struct zb_shmap *t = m->shmap;
    for (size_t i = 0; t && i < t->n; i++)
        if (guest_overlaps(&t->e[i], addr, len)) return &t->e[i];
    return NULL;
}

int zb_shmap_readonly_in(const zb_memory *m, uint64_t addr, uint64_t len) {
    const struct zb_shmap *t = m->shmap;
    for (size_t i = 0; t && i < t->n; i++)
        if (!t->e[i].writable && guest_overlaps(&t->e[i], addr, len)) return 1;
    return 0;
}

long zb_shmap_msync(zb_sandbox *sb, uint64_t addr, uint64_t len) {
    const struct zb_shmap *t = sb->mem.shmap;
    long rc = 0;
    for (size_t i = 0; t && i < t->n; i++) {
        const zb_shmap_entry *e = &t->e[i];
        if (!guest_overlaps(e, addr, len)) continue;
        uint64_t a = ZB_MAX(addr, e->addr), b = ZB_MIN(end_of(addr, len), e->addr + e->len);
        long r = entry_writeback(sb, e, e->off + (a - e->addr), e->off + (b - e->addr));
        if (r < 0 && !rc) rc = r;
    }
    return rc;
}

void zb_shmap_refill(zb_sandbox *sb, uint64_t addr, uint64_t len) {
    const struct zb_shmap *t = sb->mem.shmap;
    for (size_t i = 0; t && i < t->n; i++) {
        const zb_shmap_entry *e = &t->e[i];
        if (!guest_overlaps(e, addr, len)) continue;
        uint64_t a = ZB_MAX(addr, e->addr), b = ZB_MIN(end_of(addr, len), e->addr + e->len);
        entry_reload(sb, e, e->off + (a - e->addr), e->off + (b - e->addr));
    }
}

long zb_shmap_unmap(zb_sandbox *sb, uint64_t addr, uint64_t len) {
    struct zb_shmap *t = sb->mem.shmap;
    if (!t) return 0;
    uint64_t end = end_of(addr, len);
    for (size_t i = 0; i < t->n; i++) /* a split needs a free entry: checked before any change */
        if (t->e[i].addr < addr && end < t->e[i].addr + t->e[i].len && t->n >= ZB_SHMAP_MAX) return -ENOMEM;
    (void)zb_shmap_msync(sb, addr, len); /* a failed write-back (file system full) loses the pages, as
                                            Linux loses dirty pages it cannot write */
    for (size_t i = 0; i < t->n;) {
        zb_shmap_entry *e = &t->e[i];
        uint64_t e_end = e->addr + e->len;
        if (!guest_overlaps(e, addr, len)) { i++; continue; }
        if (e->addr < addr && end < e_end) { /* the middle goes: the tail becomes its own mapping */
            zb_shmap_entry tail = *e;
            tail.addr = end;
            tail.len = e_end - end;
            tail.off = e->off + (end - e->addr);
            e->len = addr - e->addr;
            if (zb_shmap_add(sb, tail.ino, tail.addr, tail.len, tail.off, (int)tail.writable) < 0)
                return -ENOMEM; /* realloc failed: the tail is forgotten (already written back) */
            return 0;
        }
        if (e->addr < addr) { e->len = addr - e->addr; i++; continue; }         /* the tail goes */
        if (end < e_end) { e->off += end - e->addr; e->len = e_end - end; e->addr = end; i++; continue; } /* the head */
        uint32_t ino = e->ino; /* all of it */
        t->e[i] = t->e[--t->n];
        zb_ovl_open_ref(sb->fs, ino, -1);
    }
    return 0;
}

void zb_shmap_count_opens(const zb_memory *m, zb_fs *fs, int delta) {
    if (!m->shmap) return;
    for (size_t i = 0; i < m->shmap->n; i++) zb_ovl_open_ref(fs, m->shmap->e[i].ino, delta);
}

/* ---- sharing with the other processes of a family (family_run.c) ----
 * Every process of a family has its own guest memory, so a shared mapping inherited across fork is
 * one copy per process of the same (shared) file's bytes. The processes run one at a time, so the
 * copies stay coherent by handing over at each switch: the process that ran writes its mapped
 * pages back into the file, the process about to run copies the file's pages that differ into its
 * own copy. */

/* Copy e's pages that differ from the file into the mapping (zeros past the end of the file). */
static void entry_sync_in(zb_sandbox *sb, const zb_shmap_entry *e) {
    if (e->addr + e->len > sb->mem.size) return; /* checked at load: never */
    uint8_t file[ZB_PAGE];
    for (uint64_t p = 0; p < e->len; p += ZB_PAGE) {
        uint8_t *mapped = sb->mem.host + e->addr + p;
        long r = zb_ovl_read(sb->fs, e->ino, file, ZB_PAGE, e->off + p);
        size_t got = r > 0 ? (size_t)r : 0;
        memset(file + got, 0, ZB_PAGE - got);
        if (!memcmp(file, mapped, ZB_PAGE)) continue;
        memcpy(mapped, file, ZB_PAGE);
        zb_mem_dirty(&sb->mem, e->addr + p, ZB_PAGE);
    }
}

long zb_shmap_switch_out(zb_sandbox *sb) { return zb_shmap_writeback(sb, 0, 0, UINT64_MAX); }

void zb_shmap_switch_in(zb_sandbox *sb) {
    const struct zb_shmap *t = sb->mem.shmap;
    for (size_t i = 0; t && i < t->n; i++) entry_sync_in(sb, &t->e[i]);
}

uint64_t zb_shmap_pages(const zb_memory *m) {
    uint64_t n = 0;
    for (size_t i = 0; m->shmap && i < m->shmap->n; i++) n += m->shmap->e[i].len / ZB_PAGE;
    return n;
}
