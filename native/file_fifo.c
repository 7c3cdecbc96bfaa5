/* file_fifo.c - named pipes (FIFOs: mkfifo(3), mknod(S_IFIFO), sys_fsmeta.c), as Linux's
 * fs/pipe.c fifo_open serves them. A FIFO is an overlay inode (INO_FIFO) of the sandbox's own
 * files; it holds no data. Every open of it is an end (FILE_FIFO) of the node's current pipe, a
 * stream of file_stream.c like an anonymous pipe's: the read end has it as rx, the write end as tx,
 * an O_RDWR end both. The current pipe is not kept in the inode (its chunk is shared with
 * snapshots): it is the pipe of any end of that inode in the fd tables of the sandbox's processes,
 * in flight on their sockets, or held by a blocked opener (below); with none, the next open makes
 * a new one, so a pipe's unread bytes go with its last end, as on Linux.
 *
 * open(2): O_RDONLY waits until a writer opened, O_WRONLY until a reader did (ENXIO at once with
 * O_NONBLOCK), O_RDONLY | O_NONBLOCK and O_RDWR never wait. As in Linux, a blocked opener already
 * counts as a reader or writer (a writer that finds it opens at once, and writes into the pipe
 * before the reader's open returns), and it goes on once the other side's open count changed, even
 * if that opener closed again meanwhile (it then reads EOF). Blocking is the engine's: the syscall
 * yields (zb_sleep_until) and is served again. Between the tries its end is held in a record of the
 * file system (zb_fifo_wait, shared by the family's processes like the pipe), named by the thread's
 * zb_cpu.fifo_wait; the run loop clears that id when the syscall completes or a signal interrupts
 * it, so a record no thread names any more is stale and is closed by the next FIFO operation
 * (sweep). A snapshot copies no record: a thread it caught blocked in such an open starts the open
 * over once restored.
 *
 * Reads, writes, poll and fcntl are the pipe's (EOF once no writer is left, EPIPE and SIGPIPE once
 * no reader is, F_SETPIPE_SZ); poll follows Linux's pipe_poll for FIFOs: a reader opened with
 * O_NONBLOCK before any writer does not see POLLHUP until a writer came and went (its f_version,
 * here the file's offset, which a FIFO has no other use for: saved and copied with the file). fstat
 * is the node's (S_IFIFO, its mode and inode number), fchmod changes the node.
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>
#include <poll.h>

typedef struct zb_fifo_wait {
    struct zb_fifo_wait *next;
    uint64_t id;       /* the blocked thread's zb_cpu.fifo_wait */
    zb_file *file;     /* the end being opened, attached to the pipe */
    int reading;       /* it waits for a writer (else for a reader) */
    uint64_t seen;     /* the other side's open count when it began to wait */
} zb_fifo_wait;

static zb_pipe *pipe_of(const zb_file *f) { return f->rx ? f->rx : f->tx; }

/* The processes of sb's family (sb alone before its first fork): the i-th, or NULL past them
 * (zombies give NULL too: test i against process_slots). */
static int process_slots(const zb_sandbox *sb) { return sb->fam ? sb->fam->count : 1; }
static zb_sandbox *process_at(zb_sandbox *sb, int i) { return sb->fam ? sb->fam->m[i].sb : sb; }

/* Does a thread of the family still wait in the open that record `id` is for? A process's running
 * (loaded) thread keeps its state in sb->cpu, every other thread in its slot (process.h). */
static int wait_live(zb_sandbox *sb, uint64_t id) {
    for (int i = 0; i < process_slots(sb); i++) {
        zb_sandbox *p = process_at(sb, i);
        if (!p) continue;
        const zb_threads *ts = &p->threads;
        for (int k = 0; k < ts->cap; k++) {
            const zb_thread *t = &ts->t[k];
            if (!t->tid) continue;
            const zb_cpu *c = k == ts->current && t->state == ZB_THREAD_RUNNABLE ? &p->cpu : &t->cpu;
            if (c->fifo_wait == id) return 1;
        }
        if (!ts->cap && p->cpu.fifo_wait == id) return 1;
    }
    return 0;
}

static void wait_drop(zb_fs *fs, zb_fifo_wait *w) {
    zb_fifo_wait **pp = &fs->fifo_waits;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    zb_file_unref(fs, w->file);
    free(w);
}

/* Close the ends of opens that no thread waits in any more (interrupted by a signal, or their
 * thread or process ended): until then they count as readers or writers of their pipe. */
static void sweep(zb_sandbox *sb) {
    zb_fifo_wait *w = sb->fs->fifo_waits;
    while (w) {
        zb_fifo_wait *next = w->next;
        if (!wait_live(sb, w->id)) wait_drop(sb->fs, w);
        w = next;
    }
}

void zb_fifo_free_all(zb_fs *fs) {
    while (fs->fifo_waits) wait_drop(fs, fs->fifo_waits);
}

static int is_end_of(const zb_file *f, uint32_t ino) { return f && f->kind == FILE_FIFO && f->ino == ino && pipe_of(f); }

/* The current pipe of FIFO inode ino (see the top), or NULL: an open end holds the inode, so its
 * number names the same node for as long as the pipe lives. */
static zb_pipe *node_pipe(zb_sandbox *sb, uint32_t ino) {
    for (const zb_fifo_wait *w = sb->fs->fifo_waits; w; w = w->next)
        if (is_end_of(w->file, ino)) return pipe_of(w->file);
    for (int i = 0; i < process_slots(sb); i++) {
        const zb_sandbox *p = process_at(sb, i);
        if (!p || !p->fds) continue;
        for (int fd = 0; fd < ZB_MAX_FDS; fd++)
            if (is_end_of(p->fds->fd[fd], ino)) return pipe_of(p->fds->fd[fd]);
    }
    for (const zb_scm *r = sb->fs->scm_all; r; r = r->all_next)
        for (int k = 0; k < r->n; k++)
            if (is_end_of(r->files[k], ino)) return pipe_of(r->files[k]);
    return NULL;
}

/* Wait (again) for the other side of w's open. A wait that yields or stops keeps the record for
 * the syscall's next try; an interrupted one (the guest's alarm) closes the end. */
static long wait_more(zb_sandbox *sb, zb_fifo_wait *w) {
    long rc = zb_sleep_until(sb, INT64_MAX);
    if (rc == ZB_SYSCALL_BLOCK || rc == ZB_SYSCALL_STOP) return rc;
    sb->cpu.fifo_wait = 0;
    wait_drop(sb->fs, w);
    return rc < 0 ? rc : -EINTR;
}

/* The syscall served again: the record this thread waits with, if the file system still has it
 * (a snapshot restored in between has none: the open starts over). */
static zb_fifo_wait *own_wait(zb_sandbox *sb) {
    if (!sb->cpu.fifo_wait) return NULL;
    for (zb_fifo_wait *w = sb->fs->fifo_waits; w; w = w->next)
        if (w->id == sb->cpu.fifo_wait) return w;
    sb->cpu.fifo_wait = 0;
    return NULL;
}

long zb_fifo_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out) {
    uint32_t ino = r->loc.ino;
    unsigned acc = (unsigned)(flags & O_ACCMODE);
    if (flags & O_PATH) { /* no end: Linux's O_PATH never reaches fifo_open */
        zb_file *f = zb_file_new(FILE_FIFO);
        if (!f) return -ENOMEM;
        f->ino = ino;
        zb_ovl_open_ref(sb->fs, ino, 1);
        *out = f;
        return 0;
    }
    if (acc == O_ACCMODE) return -EINVAL; /* fifo_open's default case */
    sweep(sb);
    zb_fifo_wait *w = own_wait(sb);
    if (w) { /* served again: go on once the other side opened since */
        const zb_pipe *p = pipe_of(w->file);
        if ((w->reading ? p->w_opens : p->r_opens) == w->seen) return wait_more(sb, w);
        zb_fifo_wait **pp = &sb->fs->fifo_waits;
        while (*pp != w) pp = &(*pp)->next;
        *pp = w->next;
        *out = w->file;
        free(w);
        sb->cpu.fifo_wait = 0;
        return 0;
    }
    zb_pipe *p = node_pipe(sb, ino);
    if (acc == O_WRONLY && (flags & O_NONBLOCK) && (!p || !p->readers)) return -ENXIO;
    zb_pipe *fresh = p ? NULL : (p = zb_pipe_new());
    zb_file *f = p ? zb_file_new(FILE_FIFO) : NULL;
    if (!f) {
        if (fresh) zb_pipe_free(fresh);
        return -ENOMEM;
    }
    f->ino = ino;
    zb_ovl_open_ref(sb->fs, ino, 1);
    if (acc != O_WRONLY) {
        zb_file_attach_rx(f, p);
        p->r_opens++;
    }
    if (acc != O_RDONLY) {
        zb_file_attach_tx(f, p);
        p->w_opens++;
    }
    /* Linux's f_version: a reader that opens with O_NONBLOCK while no writer is there sees POLLHUP
     * only once the writers' open count moved past this (0 for the others, as in fifo_open) */
    if (acc == O_RDONLY && !p->writers && (flags & O_NONBLOCK)) f->offset = p->w_opens;
    int waits = acc == O_RDONLY ? !p->writers && !(flags & O_NONBLOCK) : acc == O_WRONLY && !p->readers;
    if (!waits) {
        *out = f;
        return 0;
    }
    if (!(w = calloc(1, sizeof *w))) {
        zb_file_unref(sb->fs, f);
        return -ENOMEM;
    }
    w->id = ++sb->fs->fifo_wait_ids;
    w->file = f;
    w->reading = acc == O_RDONLY;
    w->seen = w->reading ? p->w_opens : p->r_opens;
    w->next = sb->fs->fifo_waits;
    sb->fs->fifo_waits = w;
    sb->cpu.fifo_wait = w->id;
    return wait_more(sb, w);
}

static long fifo_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    if (off >= 0) return -ESPIPE;
    if (!f->rx) return -EBADF; /* the write end (or an O_PATH file) */
    if (f->rx->writers && sb->fs->fifo_waits) sweep(sb); /* a writer that gave its open up is none */
    return zb_stream_read(f->rx, p, n);
}

static long fifo_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    if (off >= 0) return -ESPIPE;
    if (!f->tx) return -EBADF;
    if (!n) return 0; /* Linux: a null write succeeds before the readers are looked at */
    if (sb->fs->fifo_waits) sweep(sb); /* a reader that gave its open up is none: EPIPE */
    return zb_stream_write(f->tx, p, n);
}

static long fifo_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    memset(st, 0, sizeof *st);
    zb_ovl_stat(sb->fs, f->ino, st);
    return 0;
}

static uint32_t fifo_overlay_ino(const zb_file *f) { return f->ino; }

/* Linux's pipe_poll for a FIFO's file modes: readable with bytes, POLLHUP without writers (see
 * the top for the O_NONBLOCK reader); writable with room, POLLERR without readers. */
static short fifo_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)want;
    (void)waits_uart;
    if (sb->fs->fifo_waits) sweep(sb);
    short ev = 0;
    if (f->rx) {
        if (f->rx->len) ev |= POLLIN | POLLRDNORM;
        if (!f->rx->writers && f->offset != f->rx->w_opens) ev |= POLLHUP;
    }
    if (f->tx) {
        if (f->tx->len < zb_stream_cap(f->tx)) ev |= POLLOUT | POLLWRNORM;
        if (!f->tx->readers) ev |= POLLERR;
    }
    return ev;
}

static long fifo_fcntl(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t arg) {
    return zb_file_pipe_ops.fcntl(sb, f, cmd, arg); /* F_GETPIPE_SZ, F_SETPIPE_SZ: the pipe's */
}

const zb_file_ops zb_file_fifo_ops = {
    .name = "fifo",
    .props = ZB_FOPS_WRITE_ANY_MODE | ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS | ZB_FOPS_WHOLE_WRITES,
    .read = fifo_read,
    .write = fifo_write,
    .stat = fifo_stat,
    .overlay_ino = fifo_overlay_ino,
    .ready = fifo_ready,
    .unread = zb_stream_unread,
    .fcntl = fifo_fcntl,
};
