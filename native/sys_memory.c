/* sys_memory.c - brk, mmap, munmap, mprotect, mremap, madvise.
 *
 * The guest's page tables map all of guest memory once (guest_layout.c), so these calls only hand
 * out and take back guest-physical ranges: a top-down allocator, zeroing of freed ranges, and
 * copy-on-write mappings of host files for file-backed mmap. mprotect is recorded, not enforced.
 * MAP_SHARED mappings of overlay files are copies kept coherent with the file (shared_map.c); a
 * MAP_SHARED anonymous mapping is one of an unnamed overlay file, so it stays shared across fork.
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "vm.h"
#include "fs.h"
#include "linux.h"
#include "shared_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MMAP_MIN_ADDR 65536ul /* Linux's default vm.mmap_min_addr */

/* Pages of [addr, addr+len) that are not yet allocated. */
static uint64_t new_pages(const zb_memory *m, uint64_t addr, uint64_t len) {
    uint64_t n = 0;
    for (uint64_t p = addr / ZB_PAGE; p < (addr + len) / ZB_PAGE; p++) n += !zb_bit(m->allocated, p);
    return n;
}

/* n more pages for sb: within its RLIMIT_AS and RLIMIT_DATA (zb_proc_may_map) and the sandbox's
 * memory (zb_mem_fits). */
static int fits(zb_sandbox *sb, uint64_t n) { return zb_proc_may_map(sb, n) && zb_mem_fits(&sb->mem, n); }

static int user_range(const zb_memory *m, uint64_t addr, uint64_t len) {
    return addr >= ZB_LOW_REGION && addr + len >= addr && addr + len <= m->size;
}

/* Is a new mapping data the guest is about to fill (glibc's malloc gives numpy arrays their own
 * anonymous mapping)? Not a file's (a library's image), not a reservation (MAP_NORESERVE or
 * PROT_NONE: malloc's arenas, ld.so's span for a library, a thread stack before its guard page is
 * set), not a stack (MAP_STACK, MAP_GROWSDOWN). mremap asks it of an anonymous region it moves. */
static zb_alloc_kind new_mapping_kind(const zb_file *f, uint64_t prot, uint64_t flags) {
    int data = !f && (prot & PROT_WRITE) && !(flags & (MAP_NORESERVE | MAP_STACK | MAP_GROWSDOWN));
    return data ? ZB_ALLOC_DATA : ZB_ALLOC_OTHER;
}

static long sys_mmap(zb_sandbox *sb, const uint64_t a[6]) {
    zb_memory *m = &sb->mem;
    uint64_t addr = a[0], len = a[1], prot = a[2], flags = a[3], off = a[5];
    int fd = (int)a[4];
    if (!len || (off & (ZB_PAGE - 1))) return -EINVAL;
    if (len > m->size) return -ENOMEM;
    len = ZB_PAGE_UP(len);
    int type = flags & MAP_TYPE;
    if (type != MAP_PRIVATE && type != MAP_SHARED && type != MAP_SHARED_VALIDATE) return -EINVAL;
    zb_file *f = NULL;
    int shared = 0; /* a MAP_SHARED mapping of an overlay file: recorded in the shared-map table */
    uint32_t ino = 0;
    if (!(flags & MAP_ANONYMOUS)) {
        if (!(f = zb_fd_get(sb, (uint64_t)fd))) return -EBADF;
        if ((f->flags & O_ACCMODE) == O_WRONLY) return -EACCES;
        if (type != MAP_PRIVATE && (prot & PROT_WRITE) && (f->flags & O_ACCMODE) != O_RDWR) return -EACCES;
        shared = type != MAP_PRIVATE && (f->ops->props & ZB_FOPS_SHARED_MAP) && f->ops->overlay_ino;
        if (shared) ino = f->ops->overlay_ino(f);
        if (shared && (prot & PROT_WRITE) && zb_overlay_write_sealed(sb, ino)) return -EPERM; /* a sealed memfd */
        /* other shared writable file mappings would need write-back to the host: not supported (a
         * host file of a read-write project is copied in, so writes to it would be lost silently) */
        if (!shared && type != MAP_PRIVATE && (prot & PROT_WRITE) && (f->ops->props & ZB_FOPS_MMAP_COPIES)) return -ENODEV;
        uint64_t fixed_len = (flags & MAP_FIXED) ? len : 0;
        long busy = shared ? zb_shmap_check(sb, ino, off, len, (prot & PROT_WRITE) != 0, addr, fixed_len) : 0;
        if (busy == -EBUSY && !(flags & (MAP_FIXED | MAP_FIXED_NOREPLACE))) {
            /* exactly the range a mapping of this process holds (shared_memory attached by name in
             * a fork child that inherited the block): the same pages serve both, coherent */
            uint64_t same = zb_shmap_alias(sb, ino, off, len, (prot & PROT_WRITE) != 0);
            if (same) return (long)same;
        }
        if (busy == -EBUSY)
            zb_log(sb, "mmap: a second shared mapping overlapping a writable shared mapping of the same "
                       "file range cannot be kept coherent: refused (EBUSY)");
        if (busy < 0) return busy;
        if (f->ops->getdents) return -ENODEV; /* a directory: before anything else (other files that
                                                cannot be mapped say so once the range is chosen) */
    } else if (type != MAP_PRIVATE) {
        shared = 1; /* an unnamed overlay file of its size, made once the range is chosen */
        /* its bytes live in the file system once shared with another process: they must fit there */
        if (len > sb->fs->bytes_limit - ZB_MIN(sb->fs->bytes_used, sb->fs->bytes_limit)) return -ENOMEM;
    }
    zb_alloc_kind kind = new_mapping_kind(f, prot, flags); /* where it goes, and whether it is prefaulted */
    uint64_t at;
    if (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) {
        if (addr & (ZB_PAGE - 1)) return -EINVAL;
        if (addr < MMAP_MIN_ADDR) return -EPERM; /* as Linux answers below vm.mmap_min_addr */
        if (!user_range(m, addr, len)) return -ENOMEM;
        if ((flags & MAP_FIXED_NOREPLACE) && !zb_mem_range_free(m, addr, len)) return -EEXIST;
        if (zb_shmap_aliased_in(m, addr, len)) {
            zb_log(sb, "mmap: MAP_FIXED over a shared mapping that is mapped more than once (aliased) "
                       "is not supported (EBUSY)");
            return -EBUSY;
        }
        if (!fits(sb, new_pages(m, addr, len))) return -ENOMEM;
        at = addr;
        zb_syscall_stubs_drop(sb, at, len);
        long rc = zb_shmap_unmap(sb, at, len); /* a shared mapping it replaces is written back first */
        if (rc < 0) return rc;
        rc = zb_mem_zero(m, at, len);
        if (rc < 0) return rc;
    } else if (addr && !(addr & (ZB_PAGE - 1)) && user_range(m, addr, len) && zb_mem_range_free(m, addr, len) &&
               fits(sb, len / ZB_PAGE)) {
        at = addr; /* a free hint is honoured, as Linux does */
    } else if (!zb_proc_may_map(sb, ZB_PAGE_UP(len) / ZB_PAGE) || !(at = zb_mem_alloc(m, len, kind))) {
        return -ENOMEM;
    }
    zb_mem_mark(m, at, len, 1);
    const char *name = "[anon]";
    if (!f && shared) {
        /* a shared anonymous mapping is a shared mapping of an unnamed overlay file (as Linux's
         * shmem): it stays shared with the processes forked from here (shared_map.c) */
        long rc = -ENOMEM;
        if ((ino = zb_ovl_new_inode(sb->fs, INO_FILE, 0600))) {
            rc = zb_ovl_truncate(sb->fs, ino, len) < 0 ? -ENOMEM : zb_shmap_add(sb, ino, at, len, 0, 1);
            if (rc < 0) zb_ovl_discard(sb->fs, ino);
        }
        if (rc < 0) {
            zb_mem_zero(m, at, len);
            zb_mem_mark(m, at, len, 0);
            return rc;
        }
        name = "/dev/zero (deleted)";
    }
    /* data about to be filled: fault it in on the host now, at a fraction of the guest's cost */
    if (kind == ZB_ALLOC_DATA) {
        zb_mem_prefault_anonymous(m, at, len);
        zb_vm_sync_window(zb_vm_of(sb), sb, 0); /* window parts it lies in: unlogged for the fill */
    }
    if (f) {
        /* the kind fills the range (file_host.c maps view files copy-on-write) */
        long rc = f->ops->mmap_fill ? f->ops->mmap_fill(sb, f, at, len, off) : -ENODEV;
        if (rc >= 0 && shared) rc = zb_shmap_add(sb, ino, at, len, off, (prot & PROT_WRITE) != 0);
        if (rc < 0) {
            zb_mem_zero(m, at, len);
            zb_mem_mark(m, at, len, 0);
            return rc;
        }
        if (f->where) name = f->where->path;
    }
    zb_region_add(m, at, at + len, (int)prot, name);
    return (long)at;
}

static long unmap(zb_sandbox *sb, uint64_t addr, uint64_t len) {
    zb_memory *m = &sb->mem;
    zb_syscall_stubs_drop(sb, addr, len);
    long rc = zb_shmap_unmap(sb, addr, len); /* shared file mappings are written back */
    if (rc < 0) return rc;
    rc = zb_mem_free_for_reuse(m, addr, len);
    if (rc < 0) return rc;
    zb_mem_mark(m, addr, len, 0);
    zb_region_remove(m, addr, addr + len);
    return 0;
}

static long sys_munmap(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t addr = a[0], len = ZB_PAGE_UP(a[1]);
    if ((addr & (ZB_PAGE - 1)) || !len) return -EINVAL;
    if (!user_range(&sb->mem, addr, len)) return -EINVAL;
    int alias = zb_shmap_unalias(sb, addr, len); /* one of several mmaps of the same range: pages stay */
    if (alias == -EBUSY)
        zb_log(sb, "munmap: a part of a shared mapping that is mapped more than once (aliased) is not "
                   "supported (EBUSY)");
    if (alias) return alias < 0 ? alias : 0;
    return unmap(sb, addr, len);
}

static long sys_mprotect(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t addr = a[0], len = ZB_PAGE_UP(a[1]);
    if (addr & (ZB_PAGE - 1)) return -EINVAL;
    if (!len) return 0;
    if (!user_range(&sb->mem, addr, len) || !zb_mem_range_allocated(&sb->mem, addr, len)) return -ENOMEM;
    /* a read-only shared file mapping may overlap others: it must stay read-only (Linux would
     * refuse PROT_WRITE too if the file was not opened for writing) */
    if ((a[2] & PROT_WRITE) && zb_shmap_readonly_in(&sb->mem, addr, len)) return -EACCES;
    zb_region_set_prot(&sb->mem, addr, addr + len, (int)a[2]);
    return 0; /* recorded only: all guest memory stays readable, writable and executable */
}

static long sys_mremap(zb_sandbox *sb, const uint64_t a[6]) {
    zb_memory *m = &sb->mem;
    uint64_t old = a[0], osz = ZB_PAGE_UP(a[1]), nsz = ZB_PAGE_UP(a[2]), flags = a[3], want = a[4];
    if ((old & (ZB_PAGE - 1)) || !nsz || (flags & ~(uint64_t)(MREMAP_MAYMOVE | MREMAP_FIXED))) return -EINVAL;
    if ((flags & MREMAP_FIXED) && !(flags & MREMAP_MAYMOVE)) return -EINVAL;
    if (!osz || !user_range(m, old, osz) || !zb_mem_range_allocated(m, old, osz)) return -EFAULT;
    if (nsz > m->size) return -ENOMEM;
    /* a shared file mapping shrinks in place (the tail is written back); growing or moving one is
     * not supported */
    if (zb_shmap_aliased_in(m, old, osz) || ((flags & MREMAP_FIXED) && zb_shmap_aliased_in(m, want, nsz))) {
        zb_log(sb, "mremap: a shared mapping that is mapped more than once (aliased) cannot change (EINVAL)");
        return -EINVAL;
    }
    if (zb_shmap_find(m, old, osz) && (nsz > osz || (flags & MREMAP_FIXED))) {
        zb_log(sb, "mremap: growing or moving a shared file mapping is not supported (EINVAL)");
        return -EINVAL;
    }
    const zb_region *reg = zb_region_find(m, old);
    char name[96];
    snprintf(name, sizeof name, "%s", reg ? reg->name : "[anon]");
    int prot = reg ? reg->prot : PROT_READ | PROT_WRITE;
    if (!(flags & MREMAP_FIXED)) {
        if (nsz <= osz) {
            if (nsz < osz) unmap(sb, old + nsz, osz - nsz);
            return (long)old;
        }
        if (user_range(m, old + osz, nsz - osz) && zb_mem_range_free(m, old + osz, nsz - osz) &&
            fits(sb, (nsz - osz) / ZB_PAGE)) {
            zb_mem_mark(m, old + osz, nsz - osz, 1);
            zb_region_add(m, old, old + nsz, prot, name);
            return (long)old;
        }
        if (!(flags & MREMAP_MAYMOVE)) return -ENOMEM;
    }
    uint64_t at;
    if (flags & MREMAP_FIXED) {
        if ((want & (ZB_PAGE - 1)) || !user_range(m, want, nsz)) return -EINVAL;
        if (want < old + osz && old < want + nsz) return -EINVAL; /* overlapping */
        if (!fits(sb, new_pages(m, want, nsz))) return -ENOMEM;
        zb_syscall_stubs_drop(sb, want, nsz);
        if (zb_shmap_unmap(sb, want, nsz) < 0 || zb_mem_zero(m, want, nsz) < 0) return -ENOMEM;
        at = want;
    } else if (!zb_proc_may_map(sb, (nsz - osz) / ZB_PAGE) || /* the move's growth, as Linux counts it */
               !(at = zb_mem_alloc(m, nsz, strcmp(name, "[anon]") ? ZB_ALLOC_OTHER : new_mapping_kind(NULL, prot, 0)))) {
        return -ENOMEM;
    }
    zb_mem_mark(m, at, nsz, 1);
    memcpy(m->host + at, m->host + old, ZB_MIN(osz, nsz));
    zb_mem_dirty(m, at, nsz);
    unmap(sb, old, osz);
    zb_region_add(m, at, at + nsz, prot, name);
    return (long)at;
}

static long sys_madvise(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t addr = a[0], len = ZB_PAGE_UP(a[1]);
    if (addr & (ZB_PAGE - 1)) return -EINVAL;
    if (!len) return 0;
    if (!user_range(&sb->mem, addr, len) || !zb_mem_range_allocated(&sb->mem, addr, len)) return -ENOMEM;
    switch (a[2]) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_REMOVE: {
        zb_syscall_stubs_drop(sb, addr, len);
        (void)zb_shmap_msync(sb, addr, len);
        long rc = zb_mem_zero(&sb->mem, addr, len); /* give the memory back: reads see zeros ... */
        if (rc == 0) zb_shmap_refill(sb, addr, len); /* ... or a shared mapping's file bytes */
        return rc;
    }
    default:
        return 0; /* hints (WILLNEED, HUGEPAGE, SEQUENTIAL, ...) */
    }
}

static long sys_brk(zb_sandbox *sb, const uint64_t a[6]) {
    zb_memory *m = &sb->mem;
    uint64_t want = a[0];
    if (want < m->brk_start || want >= m->size) return (long)m->brk_end;
    uint64_t cur = ZB_PAGE_UP(m->brk_end), next = ZB_PAGE_UP(want);
    if (next > cur) {
        if (!zb_mem_range_free(m, cur, next - cur) || !fits(sb, (next - cur) / ZB_PAGE))
            return (long)m->brk_end;
        zb_mem_mark(m, cur, next - cur, 1);
        zb_region_add(m, m->brk_start, next, PROT_READ | PROT_WRITE, "[heap]");
    } else if (next < cur) {
        unmap(sb, next, cur - next);
    }
    m->brk_end = want;
    return (long)want;
}

static long sys_msync(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[0] & (ZB_PAGE - 1)) return -EINVAL;
    if (!zb_mem_range_allocated(&sb->mem, a[0], a[1])) return -ENOMEM;
    return zb_shmap_msync(sb, a[0], a[1]); /* MS_ASYNC too: the write-back is cheap and immediate */
}

static long sys_mem_noop(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; (void)a; return 0; }

void zb_sys_memory_register(zb_syscall_fn *t) {
    t[SYS_mmap] = sys_mmap;
    t[SYS_munmap] = sys_munmap;
    t[SYS_mprotect] = sys_mprotect;
    t[SYS_pkey_mprotect] = sys_mprotect;
    t[SYS_mremap] = sys_mremap;
    t[SYS_madvise] = sys_madvise;
    t[SYS_brk] = sys_brk;
    t[SYS_msync] = sys_msync;
    t[SYS_mlock] = sys_mem_noop;
    t[SYS_munlock] = sys_mem_noop;
    t[SYS_mlockall] = sys_mem_noop;
    t[SYS_munlockall] = sys_mem_noop;
    t[SYS_mlock2] = sys_mem_noop;
}
