/* shared_map.h - MAP_SHARED mappings of overlay files (shared_map.c).
 *
 * Guest memory is identity-mapped and its page tables are written once, so a shared mapping
 * cannot point at the file's pages: it is a copy in guest memory, and while it exists that copy is
 * the authoritative content of the mapped file range. Every other access to the file goes through
 * a hook here first: reads and mmap fills write the mapped pages back into the file data (only
 * the pages that differ), writes and truncations copy the new file bytes into the mapping. msync
 * and munmap write back. The table is part of the memory bookkeeping (zb_mem_meta), so snapshots,
 * forks, restores and templates keep file content and mappings consistent.
 */
#ifndef ZB_SHARED_MAP_H
#define ZB_SHARED_MAP_H
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "shared_map_state.h"

/* 0 if a shared mapping of [off, off+len) of inode `ino` may be added, else -EBUSY (it would
 * overlap another shared mapping of that range, one of them writable: they could not be kept
 * coherent), -ENOMEM (ZB_SHMAP_MAX reached) or -EOVERFLOW (the file range wraps). Mappings inside the guest range [replaces,
 * replaces+replaces_len) (a MAP_FIXED target; length 0 for none) are about to go: not counted. */
long zb_shmap_check(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len, int writable, uint64_t replaces,
                    uint64_t replaces_len);
/* A second mmap of exactly the file range [off, off+len) of `ino` that one shared mapping of this
 * process already holds, and nothing else overlaps (multiprocessing.shared_memory attached by name
 * in a fork child that inherited the parent's mapping of the block): the same guest pages serve
 * both (one copy cannot go stale beside the other), so its address is returned and the entry
 * counts one alias more. 0 (no alias) if no such entry, another overlaps, a writable request
 * meets a read-only mapping, or ZB_SHMAP_ALIASES_MAX is reached: the caller refuses with EBUSY. */
uint64_t zb_shmap_alias(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len, int writable);
/* munmap of guest range [addr, addr+len): 1 if it is exactly an aliased mapping (one alias taken
 * back, the pages stay for the others), 0 if no aliased mapping overlaps it (unmap as usual),
 * -EBUSY if it covers a part of one (the aliases share those pages: not supported). */
int zb_shmap_unalias(zb_sandbox *sb, uint64_t addr, uint64_t len);
/* 1 if an aliased shared mapping overlaps guest range [addr, addr+len) (MAP_FIXED over it or an
 * mremap of it would take the pages from under its aliases: refused). */
int zb_shmap_aliased_in(const zb_memory *m, uint64_t addr, uint64_t len);
/* 1 if a shared mapping of `ino` exists in sb or another process of its family. F_SEAL_WRITE of a
 * memfd is then EBUSY: Linux refuses it while a shared mapping may write (VM_MAYWRITE), which
 * every shared mapping of a memfd may (its fds are all O_RDWR), read-only ones included. */
int zb_shmap_mapped(const zb_sandbox *sb, uint32_t ino);
/* Record a filled mapping (after zb_shmap_check); takes an open reference on the inode. */
long zb_shmap_add(zb_sandbox *sb, uint32_t ino, uint64_t addr, uint64_t len, uint64_t off, int writable);
/* Write mapped pages of `ino` (0: every inode) overlapping file bytes [off, off+len) back into
 * the file data, where they differ. 0 or the first write's error. */
long zb_shmap_writeback(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len);
/* The file bytes [off, off+len) of `ino` changed (write, truncate): copy them into its mappings
 * (zeros past the end of the file). */
void zb_shmap_reload(zb_sandbox *sb, uint32_t ino, uint64_t off, uint64_t len);
/* Guest range [addr, addr+len) is about to be unmapped or replaced: write its shared mappings
 * back and forget them (split when the range is inside one). -ENOMEM (nothing changed) if a
 * split finds the table full. */
long zb_shmap_unmap(zb_sandbox *sb, uint64_t addr, uint64_t len);
/* msync: write back the shared mappings overlapping [addr, addr+len). */
long zb_shmap_msync(zb_sandbox *sb, uint64_t addr, uint64_t len);
/* MADV_DONTNEED of [addr, addr+len) (after a write-back and zeroing): read the file's bytes in
 * again, as Linux drops the pages and faults them in from the file. */
void zb_shmap_refill(zb_sandbox *sb, uint64_t addr, uint64_t len);
/* Add delta to the open count, in fs, of the inode of every shared mapping of m: a child process's
 * mappings move to the file system it shares with its family, and leave it with the child. */
void zb_shmap_count_opens(const zb_memory *m, zb_fs *fs, int delta);
/* The shared mapping overlapping guest range [addr, addr+len), or NULL. */
const zb_shmap_entry *zb_shmap_find(const zb_memory *m, uint64_t addr, uint64_t len);

/* 1 if a read-only shared mapping overlaps guest range [addr, addr+len) (mprotect keeps it so). */
int zb_shmap_readonly_in(const zb_memory *m, uint64_t addr, uint64_t len);

/* ---- the processes of a family (shared_map.c's last part) ----
 * A shared mapping (a file's, or a MAP_SHARED anonymous one: an unnamed overlay file) inherited
 * across fork is a copy in each process's guest memory of the same file bytes in the family's one
 * file system. Processes run one at a time on the executor, so the copies are handed over through
 * the file: zb_shmap_switch_out after a process ran (its copies are the latest: written back where
 * they differ), zb_shmap_switch_in before another runs (the file's pages that differ copied in). */
long zb_shmap_switch_out(zb_sandbox *sb);
void zb_shmap_switch_in(zb_sandbox *sb);
/* Pages of m held by shared mappings. Hook for a family-wide memory budget: these pages are one
 * region of the family however many processes map it, so such a budget counts them once (in the
 * file system's bytes, or in one process) and subtracts them from each other process's pages. */
uint64_t zb_shmap_pages(const zb_memory *m);

/* ftruncate/truncate/O_TRUNC/fallocate of an overlay file, with its mappings refreshed
 * (file_overlay.c). */
long zb_overlay_truncate(zb_sandbox *sb, uint32_t ino, uint64_t size);
/* 1 if the overlay file is a memfd sealed against writes (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE):
 * a new writable shared mapping of it is EPERM (file_overlay.c). */
int zb_overlay_write_sealed(zb_sandbox *sb, uint32_t ino);

#endif
