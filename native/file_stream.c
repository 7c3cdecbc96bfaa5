/* file_stream.c - byte streams (zb_pipe: a pipe, or one direction of a socketpair): their bytes,
 * shared copy-on-write with snapshots (zb_bytes), the file ends attached to them, and reading and
 * writing them. Pipe ends (file_pipe.c) and socket ends (file_socket.c) are built on them; reading
 * never blocks (see file_pipe.c). A socket's stream also carries the files passed with SCM_RIGHTS
 * (zb_scm, fs.h): attached to the bytes they came with, taken by the read that reaches them,
 * dropped when nobody can read them any more, and all freed with their file system.
 */
#include "util.h"
#include "fs.h"

zb_pipe *zb_pipe_new(void) {
    zb_pipe *p = calloc(1, sizeof *p);
    if (p) atomic_init(&p->refs, 0);
    return p;
}

static void bytes_unref(zb_bytes *b) {
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

static void scm_drop_all(zb_pipe *p) {
    while (p->scm_head) {
        zb_scm *r = p->scm_head;
        zb_scm_unlink(r);
        zb_scm_drop(r);
    }
}

void zb_pipe_free(zb_pipe *p) {
    if (!p) return;
    scm_drop_all(p);
    bytes_unref(p->buf);
    free(p->tty);
    free(p);
}

static void pipe_unref(zb_pipe *p) {
    if (p && atomic_fetch_sub(&p->refs, 1) == 1) zb_pipe_free(p);
}

zb_pipe *zb_pipe_copy(const zb_pipe *s) {
    zb_pipe *p = zb_pipe_new();
    if (!p) return NULL;
    if (s->buf) { /* shared until either side writes */
        p->buf = s->buf;
        atomic_fetch_add(&p->buf->refs, 1);
    }
    p->start = s->start;
    p->len = s->len;
    p->consumed = s->consumed; /* (never its files in flight: a snapshot refuses them, a fork shares the stream) */
    p->reset = s->reset;
    p->cap = s->cap;
    p->r_opens = s->r_opens;
    p->w_opens = s->w_opens;
    if (s->tty) {
        if (!(p->tty = malloc(sizeof *p->tty))) { zb_pipe_free(p); return NULL; }
        *p->tty = *s->tty;
    }
    return p;
}

void zb_file_attach_rx(zb_file *f, zb_pipe *p) {
    atomic_fetch_add(&p->refs, 1);
    p->readers++;
    f->rx = p;
}

void zb_file_attach_tx(zb_file *f, zb_pipe *p) {
    atomic_fetch_add(&p->refs, 1);
    p->writers++;
    f->tx = p;
}

void zb_file_detach_rx(zb_file *f) {
    if (!f->rx) return;
    if (!--f->rx->readers) scm_drop_all(f->rx);
    pipe_unref(f->rx);
    f->rx = NULL;
}

void zb_file_detach_tx(zb_file *f) {
    if (!f->tx) return;
    f->tx->writers--;
    pipe_unref(f->tx);
    f->tx = NULL;
}

long zb_stream_read(zb_pipe *pp, uint8_t *p, size_t n) {
    if (!pp->len) return pp->writers ? -EAGAIN : 0;
    n = ZB_MIN(n, pp->len);
    memcpy(p, zb_pipe_bytes(pp), n);
    pp->start += n; /* (the bytes may be shared with a snapshot: never changed in place) */
    pp->len -= n;
    pp->consumed += n;
    if (!pp->len) pp->start = 0;
    return (long)n;
}

/* ---- files in flight (SCM_RIGHTS) ---- */

zb_scm *zb_scm_new(int n) {
    if (n <= 0 || n > ZB_SCM_MAX_FD) return NULL;
    zb_scm *r = calloc(1, sizeof *r + (size_t)n * sizeof r->files[0]);
    if (r) r->n = n;
    return r;
}

void zb_scm_link(zb_fs *fs, zb_pipe *pp, zb_scm *r, uint64_t pos, uint64_t end) {
    r->pipe = pp;
    r->fs = fs;
    r->pos = pos;
    r->end = end;
    r->prev = pp->scm_tail;
    if (pp->scm_tail) pp->scm_tail->next = r;
    else pp->scm_head = r;
    pp->scm_tail = r;
    r->all_next = fs->scm_all;
    if (fs->scm_all) fs->scm_all->all_prev = r;
    fs->scm_all = r;
    fs->scm_inflight += r->n;
}

void zb_scm_unlink(zb_scm *r) {
    zb_pipe *pp = r->pipe;
    if (r->prev) r->prev->next = r->next;
    else pp->scm_head = r->next;
    if (r->next) r->next->prev = r->prev;
    else pp->scm_tail = r->prev;
    if (r->all_prev) r->all_prev->all_next = r->all_next;
    else r->fs->scm_all = r->all_next;
    if (r->all_next) r->all_next->all_prev = r->all_prev;
    r->fs->scm_inflight -= r->n;
    r->next = r->prev = r->all_next = r->all_prev = NULL;
    r->pipe = NULL;
}

/* Records being dropped on this thread (an engine's families run on one thread at a time): a file
 * a record closes can be the last reader of a stream with records of its own, which join the queue
 * instead of recursing (guest-controlled depth: sockets in flight on sockets in flight ...). */
static __thread zb_scm *doomed;
static __thread int dropping;

void zb_scm_drop(zb_scm *r) {
    if (!r) return;
    r->next = doomed;
    doomed = r;
    if (dropping) return;
    dropping = 1;
    while (doomed) {
        zb_scm *d = doomed;
        doomed = d->next;
        for (int i = 0; i < d->n; i++) zb_file_unref(d->fs, d->files[i]);
        free(d);
    }
    dropping = 0;
}

void zb_scm_free_all(zb_fs *fs) {
    while (fs->scm_all) { /* a cycle (a socket in flight on its own stream) ends only here */
        zb_scm *r = fs->scm_all;
        zb_scm_unlink(r);
        zb_scm_drop(r);
    }
}

/* The first record a read from `skip` on reaches, and the most that read may take. */
static size_t scm_limit(const zb_pipe *pp, size_t n, size_t skip, zb_scm **reached) {
    *reached = NULL;
    const zb_scm *r = pp->scm_head;
    if (!r) return n;
    uint64_t at = pp->consumed + skip;
    if (r->end <= at) return n; /* (never: a read that reaches a record takes it) */
    if (at + n > r->pos) {
        *reached = (zb_scm *)r;
        return (size_t)ZB_MIN((uint64_t)n, r->end - at);
    }
    return n;
}

long zb_stream_read_scm(zb_pipe *pp, uint8_t *p, size_t n, zb_scm **taken) {
    zb_scm *r;
    n = scm_limit(pp, n, 0, &r);
    long got = zb_stream_read(pp, p, n);
    if (got > 0 && r && pp->consumed > r->pos) {
        zb_scm_unlink(r);
        if (taken) *taken = r;
        else zb_scm_drop(r);
    }
    return got;
}

long zb_stream_peek_scm(const zb_pipe *pp, uint8_t *p, size_t n, size_t skip, zb_scm **seen) {
    zb_scm *r;
    if (skip >= pp->len) return 0;
    n = scm_limit(pp, ZB_MIN(n, pp->len - skip), skip, &r);
    memcpy(p, zb_pipe_bytes(pp) + skip, n);
    if (r && pp->consumed + skip + n > r->pos) *seen = r;
    return (long)n;
}

long zb_stream_write(zb_pipe *pp, const uint8_t *p, size_t n) {
    if (!pp->readers) return -EPIPE;
    if (!n) return 0; /* a null write succeeds, even on a full stream (never "would block") */
    return zb_stream_append(pp, p, n);
}

long zb_stream_append(zb_pipe *pp, const uint8_t *p, size_t n) {
    if (!n) return 0;
    size_t limit = zb_stream_cap(pp);
    if (pp->len >= limit) return -EAGAIN; /* (F_SETPIPE_SZ never shrinks below what it holds) */
    if (pp->len + n > limit) n = limit - pp->len;
    if (!n) return -EAGAIN;
    zb_bytes *b = pp->buf;
    if (!b || atomic_load(&b->refs) > 1 || pp->start + pp->len + n > b->cap) {
        /* shared with a snapshot, or no room after the unread bytes: move them to a buffer of our own */
        size_t cap = ZB_MIN(ZB_MAX(pp->len + n, b ? 2 * b->cap : 4096), limit);
        zb_bytes *nb = malloc(sizeof *nb + cap);
        if (!nb) return -ENOMEM;
        atomic_init(&nb->refs, 1);
        nb->cap = cap;
        if (pp->len) memcpy(nb->data, zb_pipe_bytes(pp), pp->len);
        if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
        pp->buf = b = nb;
        pp->start = 0;
    }
    memcpy(b->data + pp->start + pp->len, p, n);
    pp->len += n;
    return (long)n;
}

int zb_stream_unread(zb_sandbox *sb, const zb_file *f) {
    (void)sb;
    return f->rx ? (int)f->rx->len : 0;
}

