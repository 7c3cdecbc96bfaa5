/* snapshot_file.c - a snapshot on disk (a template): `memory.img`, a sparse file holding all of
 * guest memory, and `state.bin`, everything else (vCPU, signals, UART, memory bookkeeping, files,
 * fds). Loading maps memory.img as the image that forks map copy-on-write, so every process that
 * loads the template shares its pages through the page cache.
 *
 * state.bin is read with a bounds-checked reader (serial.h): a truncated or corrupt file gives an
 * error that tells the caller to rebuild the template, never a crash.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serial.h"
#include "snapshot.h"

#define STATE_MAGIC 0x50414e53425a0a01ull /* "\x01\nZBSNAP" */
#define STATE_FORMAT 3
#define STATE_MAX_BYTES (2ull << 30)

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

static void save_state(const zb_snapshot *s, zb_out *o) {
    const zb_guest_state *st = &s->st;
    out_u64(o, STATE_MAGIC);
    out_u32(o, STATE_FORMAT);
    out_u64(o, s->mem_size);
    out_u64(o, s->engine->xsave_size);
    out_bytes(o, &st->cpu.regs, sizeof st->cpu.regs);
    out_u64(o, st->cpu.fs_base);
    out_u64(o, st->cpu.gs_base);
    out_bytes(o, st->cpu.xsave, s->engine->xsave_size);
    out_u32(o, (uint32_t)st->cpu.pending_syscall);
    out_u64(o, st->cpu.pending_nr);
    out_bytes(o, &st->sig, sizeof st->sig);
    out_str(o, st->proc.exe);
    out_str(o, st->proc.cwd);
    out_u64(o, st->proc.tid_address);
    out_u32(o, st->proc.umask);
    const zb_uart *u = &st->uart;
    uint8_t regs[7] = {u->ier, u->lcr, u->mcr, u->scr, u->dll, u->dlm, u->fcr};
    out_bytes(o, regs, sizeof regs);
    out_u64(o, u->rx_len - u->rx_pos);
    out_bytes(o, u->rx + u->rx_pos, u->rx_len - u->rx_pos);
    out_u64(o, u->tx_len);
    out_bytes(o, u->tx, u->tx_len);
    out_u64(o, u->frame_ready);
    out_u64(o, st->vdso_data);
    const zb_mem_meta *m = &st->mem;
    out_u64(o, m->npages);
    out_u64(o, m->pages_allocated);
    out_u64(o, m->pages_limit);
    out_u64(o, m->mmap_top);
    out_u64(o, m->brk_start);
    out_u64(o, m->brk_end);
    out_bytes(o, m->allocated, ((m->npages + 63) / 64) * 8);
    out_u64(o, m->nregions);
    for (size_t i = 0; i < m->nregions; i++) {
        out_u64(o, m->regions[i].start);
        out_u64(o, m->regions[i].end);
        out_u32(o, (uint32_t)m->regions[i].prot);
        out_str(o, m->regions[i].name);
    }
    zb_fs_save(st->fs, o);
    zb_fds_save(st->fds, o);
    out_u32(o, s->ws != NULL);
    if (s->ws) out_bytes(o, s->ws, ((m->npages + 63) / 64) * 8);
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

static int load_state(zb_engine *e, zb_in *in, zb_guest_state *st, uint64_t *mem_size, uint64_t **ws, char *err) {
    if (in_u64(in) != STATE_MAGIC || in_u32(in) != STATE_FORMAT) {
        zb_seterr(err, "state.bin is not a snapshot of this engine version");
        return -1;
    }
    *mem_size = in_u64(in);
    if (in_u64(in) != e->xsave_size) {
        zb_seterr(err, "the template was made where the CPU's XSAVE state has another size: it must be rebuilt here");
        return -1;
    }
    if (*mem_size < ZB_MEM_MIN || *mem_size > ZB_MEM_MAX || *mem_size % ZB_HUGE) { in->err = 1; goto corrupt; }
    in_bytes(in, &st->cpu.regs, sizeof st->cpu.regs);
    st->cpu.fs_base = in_u64(in);
    st->cpu.gs_base = in_u64(in);
    if (!(st->cpu.xsave = malloc(e->xsave_size))) { in->err = 1; goto corrupt; }
    in_bytes(in, st->cpu.xsave, e->xsave_size);
    st->cpu.pending_syscall = (int)in_u32(in);
    st->cpu.pending_nr = in_u64(in);
    in_bytes(in, &st->sig, sizeof st->sig);
    st->sig.alarm_ns = st->sig.alarm_interval_ns = 0; /* a monotonic time from another boot means nothing */
    in_str_into(in, st->proc.exe, sizeof st->proc.exe);
    in_str_into(in, st->proc.cwd, sizeof st->proc.cwd);
    st->proc.tid_address = in_u64(in);
    st->proc.umask = in_u32(in) & 0777;
    zb_uart_init(&st->uart);
    uint8_t regs[7];
    in_bytes(in, regs, sizeof regs);
    st->uart.ier = regs[0]; st->uart.lcr = regs[1]; st->uart.mcr = regs[2]; st->uart.scr = regs[3];
    st->uart.dll = regs[4]; st->uart.dlm = regs[5]; st->uart.fcr = regs[6];
    uint64_t rx = in_u64(in);
    if (in->err || rx > ZB_FRAME_MAX_PAYLOAD || (rx && !(st->uart.rx = malloc(rx)))) { in->err = 1; goto corrupt; }
    in_bytes(in, st->uart.rx, rx);
    st->uart.rx_len = st->uart.rx_cap = rx;
    uint64_t tx = in_u64(in);
    if (in->err || tx > ZB_FRAME_HEADER + (uint64_t)ZB_FRAME_MAX_PAYLOAD || (tx && !(st->uart.tx = malloc(tx)))) { in->err = 1; goto corrupt; }
    in_bytes(in, st->uart.tx, tx);
    st->uart.tx_len = st->uart.tx_cap = tx;
    st->uart.frame_ready = in_u64(in);
    if (st->uart.frame_ready > tx) in->err = 1;
    st->vdso_data = in_u64(in);
    zb_mem_meta *m = &st->mem;
    m->npages = in_u64(in);
    m->pages_allocated = in_u64(in);
    m->pages_limit = in_u64(in);
    m->mmap_top = in_u64(in);
    m->brk_start = in_u64(in);
    m->brk_end = in_u64(in);
    if (in->err || m->npages != *mem_size / ZB_PAGE || !(m->allocated = malloc(((m->npages + 63) / 64) * 8))) { in->err = 1; goto corrupt; }
    in_bytes(in, m->allocated, ((m->npages + 63) / 64) * 8);
    uint64_t nregions = in_u64(in);
    if (in->err || nregions > 65536 || (nregions && !(m->regions = calloc(nregions, sizeof *m->regions)))) { in->err = 1; goto corrupt; }
    for (uint64_t i = 0; i < nregions && !in->err; i++) {
        m->regions[i].start = in_u64(in);
        m->regions[i].end = in_u64(in);
        m->regions[i].prot = (int)in_u32(in);
        in_str_into(in, m->regions[i].name, sizeof m->regions[i].name);
        m->nregions++;
    }
    if (in->err || !(st->fs = zb_fs_load(in))) goto corrupt;
    if (!(st->fds = zb_fds_load(in, st->fs, st->proc.exe, err))) return -1;
    if (in_u32(in)) {
        size_t bytes = ((m->npages + 63) / 64) * 8;
        if (!(*ws = malloc(bytes))) { in->err = 1; goto corrupt; }
        in_bytes(in, *ws, bytes);
    }
    if (in_u64(in) != STATE_MAGIC || in->err) goto corrupt;
    return 0;
corrupt:
    zb_seterr(err, "state.bin is corrupt or truncated");
    return -1;
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

zb_snapshot *zb_snapshot_load(zb_engine *e, const char *dir, char *err) {
    char path[PATH_MAX];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/state.bin", dir);
    uint8_t *data = read_file(path, &len, err);
    if (!data) return NULL;
    zb_snapshot *s = calloc(1, sizeof *s);
    if (!s) { free(data); zb_seterr(err, "out of memory"); return NULL; }
    atomic_init(&s->refs, 1);
    s->engine = e;
    zb_in in = {data, len, 0, 0};
    int rc = load_state(e, &in, &s->st, &s->mem_size, &s->ws, err);
    free(data);
    if (rc < 0) goto fail;
    snprintf(path, sizeof path, "%s/memory.img", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size != s->mem_size) {
        zb_seterr(err, "%s is missing or has the wrong size", path);
        if (fd >= 0) close(fd);
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
