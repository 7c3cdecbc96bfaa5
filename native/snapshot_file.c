/* snapshot_file.c - a snapshot on disk (a template): `memory.img`, a sparse file holding all of
 * guest memory, and `state.bin`, everything else (vCPU, signals, UART, memory bookkeeping, files,
 * fds). Loading maps memory.img as the image that forks map copy-on-write, so every process that
 * loads the template shares its pages through the page cache.
 *
 * state.bin is read with a bounds-checked reader (serial.h): a truncated or corrupt file gives an
 * error that tells the caller to rebuild the template, never a crash. This file only frames it: the
 * header, then one section per component in a fixed order, each saved and loaded by the component's
 * own zb_*_save / zb_*_load (cpu_state.c, signals.c, threads.c, sys_process.c, uart16550.c, guest_memory.c,
 * fs_snapshot.c), each loader bounded to its section and required to read all of it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "fs.h"
#include "snapshot.h"
#include "serial.h"

#define STATE_MAGIC 0x50414e53425a0a01ull /* "\x01\nZBSNAP" */
/* The layout of state.bin. Change it with every change to what a component saves or to the order of
 * the sections: it is part of the template key (template.py, zb_snapshot_format), so templates of
 * another format are rebuilt, and a state.bin of another format is refused, never misread.
 *   3: raw struct dumps of the vCPU registers and the signal state, no sections.
 *   4: one section per component, written and read by the component (explicit little-endian fields).
 *   6: the guest memory's low 2 MiB hold the syscall entry page (guest_layout.c, LSTAR), which
 *      images of earlier engines lack: they are refused, not run.
 *   7: the thread table (THRD, threads.c) after the signal state.
 *   8: the program's name (zb_process.comm, exec) in the process state.
 *   9: the syscall entry page holds the in-guest answers before its `out` (guest_abi.h
 *      ZB_SYSCALL_ENTRY_OUT): an image of format 8 has the `out` where the host no longer looks.
 *  10: the entry page's per-fd answers (issue 24): the `out` moved to 0x180 and the data grew.
 *  11: a shared-map entry holds its alias count (a second mmap of the same file range in one
 *      process: shared_map_state.h) after its writable flag.
 *  12: pseudo-terminals (file kinds 11 and 12, file_pty.c): a pty's settings after its input
 *      stream.
 *  13: the entry page's timed answers (guest_abi.h ZB_ENTRY_TIMED: read at the end of a file,
 *      fstat of the file just opened, getdents64 at the end of a listing) past its `out`.
 *  14: the namespace's trie has /dev/pts (node kind MNT_PTS, its ptmx device DEV_PTS_PTMX).
 *  15: the entry's deferred close (guest_abi.h ZB_ENTRY_CLOSE_SLOT, a user-writable low page that
 *      holds ZB_ENTRY_CLOSE_NONE) and its per-fd slots moved (ZB_ENTRY_FD_SLOTS).
 *  16: the entry's read answer (guest_abi.h ZB_ENTRY_READ_BUF: a fifth timed block, user
 *      read-only pages in the low 2 MiB) and its data moved (ZB_ENTRY_DATA).
 *  17: the entry's getdents64 answer of a directory just opened (a sixth timed block,
 *      zb_entry_data.read_dir) and its data moved again (ZB_ENTRY_DATA 0xb00).
 *  18: AF_UNIX socket names (overlay inodes of type INO_SOCKET) and a socket's state and
 *      addresses in its file record (file_socket.c).
 *  19: a process's nice value (sys_priority.c) after its umask; a memfd's flag and seals after an
 *      overlay inode's target (sys_memfd.c); a pipe's capacity (F_SETPIPE_SZ) with its stream; the
 *      bytes a blocked write already moved (zb_cpu.io_done) after the pending syscall.
 *  20: FIFOs (overlay inodes of type INO_FIFO, file_fifo.c) and their open ends (file kind 13).
 *  21: a process's argv range (arg_start, arg_end: /proc/PID/cmdline) after its tid address.
 *  22: the entry answers rt_sigaction queries (guest_abi.h ZB_ENTRY_SIG_CODE, in the close block's
 *      tail) from the dispositions on a user read-only low page (ZB_ENTRY_SIG_DATA).
 *  23: a process's resource limits (setrlimit: the set mask, then soft and hard of each set one)
 *      after its nice value.
 *  24: a section of the child processes a checkpoint left out (zb_lost_children), before the
 *      working set.
 *  25: the vDSO's placement takes a page more, the stubbed syscall sites' page after the library
 *      (guest_abi.h "Stubbed syscall sites").
 *  26: the namespace's trie has /proc/self/cwd, fd and fdinfo (node kinds MNT_PROC_CWD, MNT_PROC_FD,
 *      MNT_PROC_FDINFO).
 *  27: listening sockets: a socket's record has its path name's id, backlog and IPV6_V6ONLY after
 *      its addresses, and an INO_SOCKET inode the id of the socket bound to it. */
#define STATE_FORMAT 27
#define STATE_MAX_BYTES (2ull << 30)

#define TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define SECTION_CPU TAG('C', 'P', 'U', ' ')
#define SECTION_SIGNALS TAG('S', 'I', 'G', ' ')
#define SECTION_THREADS TAG('T', 'H', 'R', 'D')
#define SECTION_PROCESS TAG('P', 'R', 'O', 'C')
#define SECTION_UART TAG('U', 'A', 'R', 'T')
#define SECTION_MEMORY TAG('M', 'E', 'M', ' ')
#define SECTION_FILES TAG('F', 'S', ' ', ' ')
#define SECTION_FDS TAG('F', 'D', 'S', ' ')
#define SECTION_WORKING_SET TAG('W', 'S', 'E', 'T')
#define SECTION_LOST_CHILDREN TAG('L', 'O', 'S', 'T')

uint32_t zb_snapshot_format(void) { return STATE_FORMAT; }

static int copy_range(int in_fd, int out_fd, off_t start, off_t end) {
    off_t a = start, b = start;
    while (a < end) {
        ssize_t n = copy_file_range(in_fd, &a, out_fd, &b, (size_t)(end - a), 0);
        if (n <= 0) return -1;
    }
    return 0;
}

static int write_memory(const zb_snapshot *s, int fd, char *err) {
    if (ftruncate(fd, (off_t)s->mem_size) < 0) { zb_seterr(err, "ftruncate memory.img: %s", strerror(errno)); return -1; }
    if (s->image) { /* the image's data regions, kernel to kernel; holes stay holes */
        off_t end = (off_t)s->image->size;
        for (off_t off = lseek(s->image->fd, 0, SEEK_DATA); off >= 0 && off < end;) {
            off_t hole = lseek(s->image->fd, off, SEEK_HOLE);
            if (hole < 0) hole = end;
            if (copy_range(s->image->fd, fd, off, hole) < 0) { zb_seterr(err, "copying the memory image: %s", strerror(errno)); return -1; }
            off = lseek(s->image->fd, hole, SEEK_DATA);
        }
    }
    static const uint8_t zero[ZB_PAGE];
    for (uint64_t c = 0; c < s->nchunks; c++) {
        const zb_chunk *ch = s->chunks[c];
        if (!ch) continue;
        for (uint64_t i = 0; i < CHUNK_PAGES; i++) {
            const zb_page *p = &ch->page[i];
            off_t at = (off_t)((c * CHUNK_PAGES + i) * ZB_PAGE);
            const void *src = p->kind == PAGE_STORED ? p->store->map + (uint64_t)p->index * ZB_PAGE : p->kind == PAGE_ZERO && s->image ? zero : NULL;
            if (src && pwrite(fd, src, ZB_PAGE, at) != (ssize_t)ZB_PAGE) { zb_seterr(err, "writing memory.img: %s", strerror(errno)); return -1; }
        }
    }
    return 0;
}

/* state.bin: a header (magic, format, memory size, the vDSO data page's address), then one section
 * per component, each written by the component itself, in this order, then the magic again. */
static void save_state(const zb_snapshot *s, zb_out *o) {
    const zb_guest_state *st = &s->st;
    out_u64(o, STATE_MAGIC);
    out_u32(o, STATE_FORMAT);
    out_u64(o, s->mem_size);
    out_u64(o, st->vdso_data);
    long at = out_section_begin(o, SECTION_CPU);
    zb_cpu_save(&st->cpu, s->engine->xsave_size, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_SIGNALS);
    zb_signals_save(&st->sig, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_THREADS);
    zb_threads_save(&st->threads, s->engine->xsave_size, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_PROCESS);
    zb_process_save(&st->proc, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_UART);
    zb_uart_save(&st->uart, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_MEMORY);
    zb_mem_meta_save(&st->mem, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_FILES);
    zb_fs_save(st->fs, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_FDS);
    zb_fds_save(st->fds, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_LOST_CHILDREN);
    zb_lost_children_save(&st->lost, o);
    out_section_end(o, at);
    at = out_section_begin(o, SECTION_WORKING_SET); /* the snapshot's own: zb_snapshot_learn_working_set */
    out_u32(o, s->ws != NULL);
    if (s->ws) out_words(o, s->ws, (st->mem.npages + 63) / 64);
    out_section_end(o, at);
    out_u64(o, STATE_MAGIC);
}

int zb_snapshot_save(zb_snapshot *s, const char *dir, char *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/memory.img", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { zb_seterr(err, "cannot create %s: %s", path, strerror(errno)); return -1; }
    int rc = write_memory(s, fd, err);
    if (close(fd) < 0 && rc == 0) { zb_seterr(err, "closing %s: %s", path, strerror(errno)); rc = -1; }
    if (rc < 0) return -1;
    snprintf(path, sizeof path, "%s/state.bin", dir);
    zb_out o = {fopen(path, "wbe"), 0};
    if (!o.f) { zb_seterr(err, "cannot create %s: %s", path, strerror(errno)); return -1; }
    save_state(s, &o);
    if (fclose(o.f) != 0 || o.err) { zb_seterr(err, "writing %s failed: %s", path, strerror(errno)); return -1; }
    return 0;
}

/* A session save (zeroboot_kernel/session_save.py): state.bin's bytes to state_fd, and to pages_fd
 * only the pages that differ from the snapshot's image (the template it was forked from), each as a
 * u64 (page index << 1 | 1 if it is a zero page) followed by its 4 KiB unless it is a zero page.
 * Both fds are the caller's (memfds: the locked-down engine process creates no host files). */
int zb_snapshot_save_delta(zb_snapshot *s, int state_fd, int pages_fd, char *err) {
    if (!s->image) { zb_seterr(err, "this snapshot has no memory image to save the differences from"); return -1; }
    int sfd = dup(state_fd), pfd = sfd < 0 ? -1 : dup(pages_fd);
    zb_out so = {sfd < 0 ? NULL : fdopen(sfd, "wb"), 0};
    if (!so.f) { if (sfd >= 0) close(sfd); if (pfd >= 0) close(pfd); zb_seterr(err, "cannot open the save's state stream: %s", strerror(errno)); return -1; }
    zb_out po = {pfd < 0 ? NULL : fdopen(pfd, "wb"), 0};
    if (!po.f) { fclose(so.f); if (pfd >= 0) close(pfd); zb_seterr(err, "cannot open the save's page stream: %s", strerror(errno)); return -1; }
    save_state(s, &so);
    for (uint64_t c = 0; c < s->nchunks; c++) {
        const zb_chunk *ch = s->chunks[c];
        if (!ch) continue;
        for (uint64_t i = 0; i < CHUNK_PAGES; i++) {
            const zb_page *p = &ch->page[i];
            uint64_t index = c * CHUNK_PAGES + i;
            if (p->kind == PAGE_STORED) {
                out_u64(&po, index << 1);
                out_bytes(&po, p->store->map + (uint64_t)p->index * ZB_PAGE, ZB_PAGE);
            } else if (p->kind == PAGE_ZERO) {
                out_u64(&po, index << 1 | 1);
            }
        }
    }
    int bad = so.err || po.err;
    bad |= fclose(so.f) != 0;
    bad |= fclose(po.f) != 0;
    if (bad) { zb_seterr(err, "writing the session save failed: %s", strerror(errno)); return -1; }
    return 0;
}

/* Open the section `tag` of `in` as *sec; on a missing or short section say which one. */
static int section(zb_in *in, uint32_t tag, const char *what, zb_in *sec, char *err) {
    if (in_section(in, tag, sec) == 0) return 0;
    zb_seterr(err, "state.bin is corrupt or truncated (at the %s section)", what);
    return -1;
}

/* A component read its section (rc < 0: it failed and said why in err): it must have read all of
 * it and nothing more. */
static int section_done(zb_in *sec, int rc, const char *what, char *err) {
    if (rc < 0) {
        char why[ZB_ERRLEN];
        snprintf(why, sizeof why, "%s", err);
        zb_seterr(err, "state.bin: %.400s", why);
        return -1;
    }
    if (!in_section_done(sec)) {
        zb_seterr(err, "state.bin is corrupt (the %s section has %zu bytes its reader did not expect)", what,
                  sec->len - ZB_MIN(sec->pos, sec->len));
        return -1;
    }
    return 0;
}

static int load_state(zb_engine *e, zb_in *in, zb_guest_state *st, uint64_t *mem_size, uint64_t **ws, char *err) {
    zb_in sec;
    if (in_u64(in) != STATE_MAGIC) { zb_seterr(err, "state.bin is not a zeroboot snapshot"); return -1; }
    uint32_t format = in_u32(in);
    if (format != STATE_FORMAT) {
        zb_seterr(err, "state.bin was written in snapshot format %u and this engine reads format %u: the template is stale "
                  "and must be rebuilt", format, STATE_FORMAT);
        return -1;
    }
    *mem_size = in_u64(in);
    st->vdso_data = in_u64(in);
    if (in->err || *mem_size < ZB_MEM_MIN || *mem_size > ZB_MEM_MAX || *mem_size % ZB_HUGE) {
        zb_seterr(err, "state.bin is corrupt or truncated (its header)");
        return -1;
    }
    uint64_t npages = *mem_size / ZB_PAGE;
    /* the CPU first: a template from a host with another XSAVE layout says so */
    if (section(in, SECTION_CPU, "vCPU", &sec, err) < 0 ||
        section_done(&sec, zb_cpu_load(&st->cpu, e->xsave_size, &sec, err), "vCPU", err) < 0)
        return -1;
    if (section(in, SECTION_SIGNALS, "signal", &sec, err) < 0 ||
        section_done(&sec, zb_signals_load(&st->sig, &sec, err), "signal", err) < 0)
        return -1;
    if (section(in, SECTION_THREADS, "thread table", &sec, err) < 0 ||
        section_done(&sec, zb_threads_load(&st->threads, e->xsave_size, &sec, err), "thread table", err) < 0)
        return -1;
    if (section(in, SECTION_PROCESS, "process", &sec, err) < 0 ||
        section_done(&sec, zb_process_load(&st->proc, &sec, err), "process", err) < 0)
        return -1;
    if (section(in, SECTION_UART, "UART", &sec, err) < 0 ||
        section_done(&sec, zb_uart_load(&st->uart, &sec, err), "UART", err) < 0)
        return -1;
    if (section(in, SECTION_MEMORY, "guest memory", &sec, err) < 0 ||
        section_done(&sec, zb_mem_meta_load(&st->mem, npages, &sec, err), "guest memory", err) < 0)
        return -1;
    if (section(in, SECTION_FILES, "file namespace", &sec, err) < 0) return -1;
    if (!(st->fs = zb_fs_load(&sec))) { zb_seterr(err, "state.bin is corrupt or truncated (the file namespace)"); return -1; }
    if (section_done(&sec, 0, "file namespace", err) < 0) return -1;
    if (section(in, SECTION_FDS, "fd table", &sec, err) < 0) return -1;
    if (!(st->fds = zb_fds_load(&sec, st->fs, st->proc.exe, err))) return -1;
    if (section_done(&sec, 0, "fd table", err) < 0) return -1;
    if (section(in, SECTION_LOST_CHILDREN, "child process", &sec, err) < 0 ||
        section_done(&sec, zb_lost_children_load(&st->lost, &sec, err), "child process", err) < 0)
        return -1;
    if (section(in, SECTION_WORKING_SET, "working set", &sec, err) < 0) return -1;
    uint32_t has_ws = in_u32(&sec);
    if (!sec.err && has_ws == 1) {
        if (!(*ws = malloc(((npages + 63) / 64) * 8))) { zb_seterr(err, "out of memory"); return -1; }
        in_words(&sec, *ws, (npages + 63) / 64);
    } else if (has_ws > 1) {
        sec.err = 1;
    }
    if (section_done(&sec, 0, "working set", err) < 0) return -1;
    if (in_u64(in) != STATE_MAGIC || in->err || in->pos != in->len) {
        zb_seterr(err, "state.bin is corrupt or truncated (its end)");
        return -1;
    }
    return 0;
}

static uint8_t *read_file(const char *path, size_t *len, char *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) { zb_seterr(err, "cannot read %s: %s", path, strerror(errno)); if (fd >= 0) close(fd); return NULL; }
    if ((uint64_t)st.st_size > STATE_MAX_BYTES) { zb_seterr(err, "%s is implausibly large", path); close(fd); return NULL; }
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    size_t done = 0;
    while (buf && done < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + done, (size_t)st.st_size - done);
        if (n <= 0) break;
        done += (size_t)n;
    }
    close(fd);
    if (!buf || done != (size_t)st.st_size) { free(buf); zb_seterr(err, "cannot read %s", path); return NULL; }
    *len = done;
    return buf;
}

/* The snapshot of state.bin's bytes and a memory image (fd, taken over; its size must match). */
static zb_snapshot *load_parts(zb_engine *e, const uint8_t *data, size_t len, int fd, const char *what, char *err) {
    zb_snapshot *s = calloc(1, sizeof *s);
    if (!s) { close(fd); zb_seterr(err, "out of memory"); return NULL; }
    atomic_init(&s->refs, 1);
    s->engine = e;
    zb_in in = {data, len, 0, 0};
    if (load_state(e, &in, &s->st, &s->mem_size, &s->ws, err) < 0) { close(fd); goto fail; }
    struct stat st;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != s->mem_size) {
        zb_seterr(err, "%s has the wrong size", what);
        close(fd);
        goto fail;
    }
    if (!(s->image = zb_image_new(fd, s->mem_size))) { close(fd); zb_seterr(err, "out of memory"); goto fail; }
    s->nchunks = s->mem_size / ZB_PAGE / CHUNK_PAGES;
    if (!(s->chunks = calloc(s->nchunks, sizeof *s->chunks))) { zb_seterr(err, "out of memory"); goto fail; }
    return s;
fail:
    zb_guest_state_free(&s->st);
    free(s->ws);
    zb_image_unref(s->image);
    free(s->chunks);
    free(s);
    return NULL;
}

zb_snapshot *zb_snapshot_load(zb_engine *e, const char *dir, char *err) {
    char path[PATH_MAX];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/state.bin", dir);
    uint8_t *data = read_file(path, &len, err);
    if (!data) return NULL;
    snprintf(path, sizeof path, "%s/memory.img", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { free(data); zb_seterr(err, "%s is missing: %s", path, strerror(errno)); return NULL; }
    zb_snapshot *s = load_parts(e, data, len, fd, path, err);
    free(data);
    return s;
}

zb_snapshot *zb_snapshot_load_bytes(zb_engine *e, const uint8_t *state, size_t state_len, int mem_fd, char *err) {
    if (state_len > STATE_MAX_BYTES) { zb_seterr(err, "the saved state is implausibly large"); return NULL; }
    int fd = fcntl(mem_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) { zb_seterr(err, "cannot use the memory image: %s", strerror(errno)); return NULL; }
    return load_parts(e, state, state_len, fd, "the saved memory image", err);
}

/* The state of a delta over the memory image of `base` (its chunks still empty), validated like
 * state.bin's: bounded, by its loader, of base's memory size. */
static zb_snapshot *delta_state(zb_snapshot *base, const uint8_t *state, size_t state_len, char *err) {
    if (!base || !base->image) { zb_seterr(err, "the base snapshot has no memory image"); return NULL; }
    if (state_len > STATE_MAX_BYTES) { zb_seterr(err, "the saved state is implausibly large"); return NULL; }
    zb_snapshot *s = calloc(1, sizeof *s);
    if (!s) { zb_seterr(err, "out of memory"); return NULL; }
    atomic_init(&s->refs, 1);
    s->engine = base->engine;
    zb_in in = {state, state_len, 0, 0};
    if (load_state(base->engine, &in, &s->st, &s->mem_size, &s->ws, err) < 0) {
        zb_guest_state_free(&s->st);
        free(s->ws);
        free(s);
        return NULL;
    }
    s->image = base->image;
    zb_image_ref(s->image);
    if (s->mem_size != base->mem_size) {
        zb_seterr(err, "the saved state is of another memory size than the base snapshot");
        zb_snapshot_release(s);
        return NULL;
    }
    s->nchunks = s->mem_size / ZB_PAGE / CHUNK_PAGES;
    if (!(s->chunks = calloc(s->nchunks, sizeof *s->chunks))) {
        zb_seterr(err, "out of memory");
        zb_snapshot_release(s);
        return NULL;
    }
    return s;
}

/* A snapshot of a spill record (zeroboot.h): the state validated like state.bin's (delta_state),
 * the page records by zb_snapshot_fill_index. */
zb_snapshot *zb_snapshot_load_aligned(zb_snapshot *base, const uint8_t *state, size_t state_len, const uint8_t *words,
                                      uint64_t nwords, uint64_t stored, int fd, int direct_fd, uint64_t offset,
                                      zb_mac *mac, char *err) {
    zb_snapshot *s = delta_state(base, state, state_len, err);
    if (s && zb_snapshot_fill_index(s, words, nwords, stored, fd, direct_fd, offset, mac, err) < 0) {
        zb_snapshot_release(s);
        return NULL;
    }
    return s;
}

/* ---- a checkpoint spilled to disk from the engine's stores (zeroboot_kernel/checkpoint_spill.py) ----
 *
 * zb_spill_prepare runs on the engine's thread: it takes a reference to the snapshot (so its chunks
 * and store pages stay alive and unchanged: a snapshot's chunks are never changed once it is taken,
 * and a store page is rewritten only once no snapshot uses it, zb_snapshot_keep_spare), serializes
 * its state (which shares overlay metadata with the live sandbox, so it is read on this thread) and
 * counts its page records. zb_spill_write may then run on another thread, while the engine goes on:
 * it reads only the job, the snapshot's chunk tables and its store pages, and writes the record in
 * the aligned layout (zeroboot.h): the page contents start on a ZB_SPILL_ALIGN boundary so that
 * they go with O_DIRECT straight from the stores. Through the page cache a spill of 400 MB took
 * ~1.5 s here (the dirty pages of a growing file are throttled to the disk's write-back speed, and
 * each costs a fresh page of host memory); direct, ~0.2 s. zb_spill_job_free, on the engine's thread
 * again once the write has returned, drops the reference: the snapshot's memory is given back then. */
#include <sys/uio.h>

struct zb_spill_job {
    zb_snapshot *snap;
    char *state;
    size_t state_len;
    uint64_t records, stored;
};

zb_spill_job *zb_spill_prepare(zb_snapshot *s, uint64_t *state_len, uint64_t *records, uint64_t *stored, char *err) {
    if (!s->image) { zb_seterr(err, "this snapshot has no memory image to save the differences from"); return NULL; }
    zb_spill_job *j = calloc(1, sizeof *j);
    if (!j) { zb_seterr(err, "out of memory"); return NULL; }
    zb_out o = {open_memstream(&j->state, &j->state_len), 0};
    if (!o.f) { free(j); zb_seterr(err, "cannot serialize the checkpoint's state: %s", strerror(errno)); return NULL; }
    save_state(s, &o);
    if (fclose(o.f) != 0 || o.err) { free(j->state); free(j); zb_seterr(err, "out of memory serializing the state"); return NULL; }
    for (uint64_t c = 0; c < s->nchunks; c++) {
        const zb_chunk *ch = s->chunks[c];
        for (uint64_t i = 0; ch && i < CHUNK_PAGES; i++) {
            j->records += ch->page[i].kind == PAGE_STORED || ch->page[i].kind == PAGE_ZERO;
            j->stored += ch->page[i].kind == PAGE_STORED;
        }
    }
    atomic_fetch_add(&s->refs, 1);
    j->snap = s;
    *state_len = j->state_len;
    *records = j->records;
    *stored = j->stored;
    return j;
}

#define SPILL_IOV 512 /* iovecs per pwritev (<= IOV_MAX) */

typedef struct {
    int fd;
    int fallback_fd; /* when fd is the O_DIRECT one: where a write it refuses goes instead (-1: none) */
    uint64_t pos;
    struct iovec iov[SPILL_IOV];
    uint64_t words[SPILL_IOV];
    int n, nwords, error;
    zb_mac *mac;
} spill_out;

static void spill_flush(spill_out *w) {
    struct iovec *iov = w->iov;
    int n = w->n;
    while (!w->error && n > 0) {
        ssize_t k = pwritev(w->fd, iov, n, (off_t)w->pos);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && w->fallback_fd >= 0) { /* a file system that takes no O_DIRECT write like this one */
            w->fd = w->fallback_fd;
            w->fallback_fd = -1;
            continue;
        }
        if (k <= 0) { w->error = k < 0 ? errno : ENOSPC; break; }
        w->pos += (uint64_t)k;
        while (n > 0 && (size_t)k >= iov->iov_len) { k -= (ssize_t)iov->iov_len; iov++; n--; }
        if (n > 0) { iov->iov_base = (uint8_t *)iov->iov_base + k; iov->iov_len -= (size_t)k; }
    }
    w->n = w->nwords = 0;
}

static void spill_add(spill_out *w, const void *p, size_t len) {
    if (!len) return;
    if (zb_mac_update(w->mac, p, len) < 0 && !w->error) w->error = EPROTO;
    if (w->n == SPILL_IOV) spill_flush(w);
    w->iov[w->n++] = (struct iovec){(void *)p, len};
}

static void spill_add_word(spill_out *w, uint64_t word) {
    if (w->nwords == SPILL_IOV || w->n == SPILL_IOV) spill_flush(w); /* so that spill_add does not flush
                                                                         (and reuse) the slot taken here */
    uint64_t *slot = &w->words[w->nwords++];
    *slot = htole64(word);
    spill_add(w, slot, 8);
}

/* The state, the count and the words, the zeros up to the alignment: through fd. */
static void spill_index(spill_out *w, const zb_spill_job *j, uint64_t offset, size_t head_len) {
    static const uint8_t zeros[ZB_SPILL_ALIGN];
    const zb_snapshot *s = j->snap;
    uint64_t written = 0;
    spill_add(w, j->state, j->state_len);
    spill_add_word(w, j->records);
    for (uint64_t c = 0; c < s->nchunks && !w->error; c++) {
        const zb_chunk *ch = s->chunks[c];
        for (uint64_t i = 0; ch && i < CHUNK_PAGES; i++) {
            const zb_page *p = &ch->page[i];
            if (p->kind != PAGE_STORED && p->kind != PAGE_ZERO) continue;
            spill_add_word(w, (c * CHUNK_PAGES + i) << 1 | (p->kind == PAGE_ZERO));
            written++;
        }
    }
    uint64_t end = offset + head_len + j->state_len + 8 * (1 + j->records);
    spill_add(w, zeros, (ZB_SPILL_ALIGN - end % ZB_SPILL_ALIGN) % ZB_SPILL_ALIGN);
    spill_flush(w);
    if (!w->error && written != j->records) w->error = EIO; /* cannot happen: the snapshot is immutable */
}

/* The stored pages' contents, in the words' order, from the stores: through the direct fd. */
static void spill_pages(spill_out *w, const zb_spill_job *j) {
    const zb_snapshot *s = j->snap;
    uint64_t written = 0;
    for (uint64_t c = 0; c < s->nchunks && !w->error; c++) {
        const zb_chunk *ch = s->chunks[c];
        for (uint64_t i = 0; ch && i < CHUNK_PAGES; i++) {
            const zb_page *p = &ch->page[i];
            if (p->kind != PAGE_STORED) continue;
            spill_add(w, p->store->map + (uint64_t)p->index * ZB_PAGE, ZB_PAGE);
            written++;
        }
    }
    spill_flush(w);
    if (!w->error && written != j->stored) w->error = EIO;
}

int zb_spill_write(zb_spill_job *j, int fd, int direct_fd, uint64_t offset, const uint8_t *head, size_t head_len,
                   const uint8_t *key, size_t key_len, const uint8_t *nonce, size_t nonce_len, uint8_t *mac_out,
                   size_t mac_len, char *err) {
    if (offset % ZB_SPILL_ALIGN) { zb_seterr(err, "a spill record must start on a %d-byte boundary", ZB_SPILL_ALIGN); return -1; }
    spill_out *w = calloc(1, sizeof *w);
    if (!w) { zb_seterr(err, "out of memory"); return -1; }
    if (!(w->mac = zb_mac_begin(key, key_len, nonce, nonce_len, err))) { free(w); return -1; }
    w->fd = fd;
    w->fallback_fd = -1;
    w->pos = offset + head_len;
    spill_index(w, j, offset, head_len);
    uint64_t pages_end = w->pos + j->stored * ZB_PAGE;
    if (direct_fd >= 0) {
        w->fd = direct_fd;
        w->fallback_fd = fd;
    }
    spill_pages(w, j);
    w->fd = fd;
    w->fallback_fd = -1;
    if (!w->error && w->pos != pages_end) w->error = EIO;
    if (!w->error && zb_mac_update(w->mac, head, head_len) < 0) w->error = EPROTO; /* the body, then the header */
    zb_mac *mac = w->mac;
    w->mac = NULL;
    if (zb_mac_end(mac, mac_out, mac_len, err) < 0) { free(w); return -1; }
    if (!w->error) {
        w->iov[w->n++] = (struct iovec){mac_out, mac_len};
        spill_flush(w);
    }
    if (!w->error) {
        w->pos = offset;
        w->iov[w->n++] = (struct iovec){(void *)head, head_len};
        spill_flush(w);
    }
    int error = w->error;
    free(w);
    if (error) { zb_seterr(err, "cannot write a checkpoint to the spill file: %s", strerror(error)); return -1; }
    return 0;
}

void zb_spill_job_free(zb_spill_job *j) {
    if (!j) return;
    zb_snapshot_release(j->snap);
    free(j->state);
    free(j);
}
