/* fdtable.c - the guest's file descriptor table and open file descriptions.
 *
 * Guest fds are indices into this table, never host fds. An open file description (zb_file) is
 * shared by dup'ed fds, like in Linux; it holds its own offset (host files are read with pread),
 * so a host fd can be shared by the clones a snapshot makes. Cloning a table preserves which fds
 * share a description, but the clone's descriptions are its own.
 */
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>

#include <stddef.h>
#include <sys/resource.h>
#include <unistd.h>

/* Host fds held open for guests (zb_hostfd), in the whole process: snapshots share them. */
static atomic_long host_fds_held;

int zb_host_fd_room(void) {
    struct rlimit rl;
    long limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : 1024;
    long max = limit > 2 * ZB_HOST_FD_HEADROOM ? limit - ZB_HOST_FD_HEADROOM : limit / 2;
    return atomic_load(&host_fds_held) < max ? 0 : -EMFILE;
}

zb_hostfd *zb_hostfd_new(int fd) {
    zb_hostfd *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    atomic_init(&h->refs, 1);
    h->fd = fd;
    atomic_fetch_add(&host_fds_held, 1);
    return h;
}

void zb_hostfd_unref(zb_hostfd *h) {
    if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
        ZB_HOSTCALL(close(h->fd));
        atomic_fetch_sub(&host_fds_held, 1);
        free(h);
    }
}

typedef struct {
    atomic_int refs;
    zb_resolved r;
} where_box;

static where_box *box_of(zb_resolved *w) { return (where_box *)((char *)w - offsetof(where_box, r)); }

zb_resolved *zb_where_new(void) {
    where_box *b = malloc(sizeof *b);
    if (!b) return NULL;
    atomic_init(&b->refs, 1);
    return &b->r;
}

void zb_where_unref(zb_resolved *w) {
    if (w && atomic_fetch_sub(&box_of(w)->refs, 1) == 1) free(box_of(w));
}

int zb_where_own(zb_file *f) {
    if (!f->where || atomic_load(&box_of(f->where)->refs) == 1) return 0;
    zb_resolved *w = zb_where_new();
    if (!w) return -1;
    *w = *f->where;
    zb_where_unref(f->where);
    f->where = w;
    return 0;
}

static const zb_file_ops *const kinds[FILE_KIND_END] = {
#define ZB_FILE_KIND(kind, number, ops) [kind] = &ops,
#include "file_kinds.h"
#undef ZB_FILE_KIND
};

const zb_file_ops *zb_file_kind_ops(int kind) { return kind > 0 && kind < FILE_KIND_END ? kinds[kind] : NULL; }

zb_file *zb_file_new(int kind) {
    const zb_file_ops *ops = zb_file_kind_ops(kind);
    zb_file *f = ops ? calloc(1, sizeof *f) : NULL;
    if (f) {
        f->refs = 1;
        f->kind = kind;
        f->ops = ops;
    }
    return f;
}

static void file_free(zb_fs *fs, zb_file *f) {
    /* what any kind may hold (fs.h: host fd, overlay inode, streams, location), then the kind's own */
    if (f->ops->release) f->ops->release(fs, f);
    zb_lock_file_gone(fs, f); /* its flock and OFD locks (before its host fd, which names the file) */
    zb_hostfd_unref(f->host);
    zb_file_detach_rx(f);
    zb_file_detach_tx(f);
    if (f->ino && fs) zb_ovl_open_ref(fs, f->ino, -1);
    zb_where_unref(f->where);
    free(f);
}

void zb_file_unref(zb_fs *fs, zb_file *f) {
    if (f && --f->refs == 0) file_free(fs, f);
}

zb_fdtable *zb_fdtable_new(void) { return calloc(1, sizeof(zb_fdtable)); }

void zb_fdtable_free(zb_fdtable *t, zb_fs *fs) {
    if (!t) return;
    for (int i = 0; i < ZB_MAX_FDS; i++) zb_file_unref(fs, t->fd[i]);
    free(t);
}

static zb_file *file_copy(const zb_file *s) {
    zb_file *d = zb_file_new(s->kind);
    if (!d) return NULL;
    *d = *s;
    d->refs = 0;
    d->where = NULL;
    d->listing = NULL;
    d->rx = d->tx = NULL; /* mapped by the caller: both ends of a pipe share the clone's stream */
    d->epoll = NULL;
    d->priv = NULL;
    if (s->host) atomic_fetch_add(&s->host->refs, 1);
    if (s->where) { /* never changed in place once shared (zb_where_own) */
        d->where = s->where;
        atomic_fetch_add(&box_of(d->where)->refs, 1);
    }
    if (s->ops->clone && s->ops->clone(d, s) < 0) {
        d->refs = 1;
        file_free(NULL, d);
        return NULL;
    }
    return d;
}

/* The clone of stream s, made once per clone of a table (both ends of a pipe share it). */
typedef struct {
    const zb_pipe *old[2 * ZB_MAX_FDS];
    zb_pipe *new[2 * ZB_MAX_FDS];
    int n;
} pipe_map;

static zb_pipe *map_pipe(pipe_map *m, const zb_pipe *s) {
    for (int k = 0; k < m->n; k++) if (m->old[k] == s) return m->new[k];
    zb_pipe *p = zb_pipe_copy(s);
    if (!p) return NULL;
    m->old[m->n] = s;
    m->new[m->n++] = p;
    return p;
}

zb_fdtable *zb_fdtable_clone(const zb_fdtable *t) {
    zb_fdtable *n = zb_fdtable_new();
    const zb_file *old[ZB_MAX_FDS];
    zb_file *new[ZB_MAX_FDS];
    pipe_map *pipes = calloc(1, sizeof *pipes);
    int nmap = 0;
    if (!n || !pipes) goto fail;
    n->next_file_id = t->next_file_id;
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        const zb_file *f = t->fd[i];
        if (!f) continue;
        zb_file *c = NULL;
        for (int k = 0; k < nmap; k++) if (old[k] == f) { c = new[k]; break; }
        if (!c) {
            if (!(c = file_copy(f))) goto fail;
            zb_pipe *rx = f->rx ? map_pipe(pipes, f->rx) : NULL, *tx = f->tx ? map_pipe(pipes, f->tx) : NULL;
            if ((f->rx && !rx) || (f->tx && !tx)) { c->refs = 1; file_free(NULL, c); goto fail; }
            if (rx) zb_file_attach_rx(c, rx);
            if (tx) zb_file_attach_tx(c, tx);
            old[nmap] = f;
            new[nmap++] = c;
        }
        c->refs++;
        n->fd[i] = c;
        n->cloexec[i] = t->cloexec[i];
    }
    free(pipes);
    return n;
fail:
    if (pipes) /* copies no file took a reference to */
        for (int k = 0; k < pipes->n; k++) if (atomic_load(&pipes->new[k]->refs) == 0) zb_pipe_free(pipes->new[k]);
    free(pipes);
    zb_fdtable_free(n, NULL);
    return NULL;
}

/* The parent and the child use one file system (zb_family_fork_sandbox), so an open file
 * description is shared as Linux shares it: offsets, overlay inodes, directory positions. */
static int shared_across_fork(const zb_file *f) {
    switch (f->kind) {
    case FILE_EPOLL: case FILE_INET: return 0; /* the clone's copy: an interest list of the clone's own
                                                  files; a host socket the engine serves per sandbox */
    default: return 1;
    }
}

void zb_fdtable_share(zb_fdtable *dst, zb_fs *dst_fs, const zb_fdtable *src) {
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        zb_file *f = src->fd[i];
        if (!f || !dst->fd[i] || !shared_across_fork(f)) continue;
        zb_file_unref(dst_fs, dst->fd[i]);
        dst->fd[i] = f;
        f->refs++; /* the engine is single-threaded: refs are plain counts */
    }
}

long zb_io_would_block(zb_sandbox *sb, const zb_file *f, long r, int is_write, int nonblock, int no_sigpipe) {
    if (!(f->ops->props & ZB_FOPS_BLOCKS)) return r;
    if (r == -EAGAIN && !nonblock && !(f->flags & O_NONBLOCK)) {
        long w = zb_sleep_until(sb, INT64_MAX); /* yields to threads and processes that can run */
        return w == 0 ? -EAGAIN : w;
    }
    if (r == -EPIPE && is_write && !no_sigpipe) sb->sig.pending |= ZB_SIG_BIT(SIGPIPE);
    return r;
}

zb_file *zb_fd_get(zb_sandbox *sb, uint64_t fd) {
    if (fd >= ZB_MAX_FDS) return NULL;
    return sb->fds->fd[fd];
}

int zb_fd_limit(const zb_sandbox *sb) {
    const zb_process *p = &sb->proc;
    if (!(p->rlim_set & (1u << RLIMIT_NOFILE))) return ZB_MAX_FDS;
    return (int)ZB_MIN(p->rlim_cur[RLIMIT_NOFILE], (uint64_t)ZB_MAX_FDS);
}

int zb_fd_install(zb_sandbox *sb, zb_file *f, int min, int cloexec) {
    if (!f->id) f->id = ++sb->fds->next_file_id;
    int limit = zb_fd_limit(sb);
    for (int i = min < 0 ? 0 : min; i < limit; i++) {
        if (!sb->fds->fd[i]) {
            sb->fds->fd[i] = f;
            sb->fds->cloexec[i] = cloexec ? 1 : 0;
            return i;
        }
    }
    zb_file_unref(sb->fs, f);
    return -EMFILE;
}

uint64_t zb_fdtable_copy_bytes(const zb_fdtable *t) {
    const zb_file *seen[ZB_MAX_FDS];
    size_t n = 0;
    uint64_t bytes = sizeof *t;
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        const zb_file *f = t->fd[i];
        if (!f) continue;
        size_t k = 0;
        while (k < n && seen[k] != f) k++;
        if (k < n) continue;
        seen[n++] = f;
        bytes += sizeof *f + (f->rx ? sizeof *f->rx : 0) + (f->ops->copy_bytes ? f->ops->copy_bytes(f) : 0);
    }
    return bytes;
}

size_t zb_fdtable_listing_bytes(const zb_fdtable *t) {
    const zb_listing *seen[ZB_MAX_FDS];
    size_t n = 0, bytes = 0;
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        const zb_listing *l = t->fd[i] ? t->fd[i]->listing : NULL;
        if (!l) continue;
        size_t k = 0;
        while (k < n && seen[k] != l) k++;
        if (k < n) continue;
        seen[n++] = l;
        bytes += l->bytes;
    }
    return bytes;
}

int zb_fd_close(zb_sandbox *sb, int fd) {
    if (fd < 0 || fd >= ZB_MAX_FDS || !sb->fds->fd[fd]) return -EBADF;
    zb_lock_closed_fd(sb, sb->fds->fd[fd]); /* the process's record locks on the file go (fcntl(2)) */
    zb_file_unref(sb->fs, sb->fds->fd[fd]);
    sb->fds->fd[fd] = NULL;
    sb->fds->cloexec[fd] = 0;
    return 0;
}

/* ---- helpers the kinds share ---- */

long zb_file_seek_sized(zb_file *f, int64_t off, int whence, int64_t size) {
    int64_t base;
    switch (whence) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)f->offset; break;
    case SEEK_END: base = size; break;
    case SEEK_DATA: if (off >= size) return -ENXIO; base = 0; break;
    case SEEK_HOLE: if (off >= size) return -ENXIO; base = 0; off = size; break;
    default: return -EINVAL;
    }
    int64_t pos;
    if (__builtin_add_overflow(base, off, &pos) || pos < 0) return -EINVAL; /* (no signed overflow) */
    f->offset = (uint64_t)pos;
    return (long)f->offset;
}

void zb_file_stat_anon(struct stat *st, unsigned mode) {
    memset(st, 0, sizeof *st);
    st->st_mode = mode;
    st->st_blksize = 4096;
    st->st_uid = st->st_gid = 1000;
}
