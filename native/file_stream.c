/* file_stream.c - byte streams (zb_pipe: a pipe, or one direction of a socketpair): their bytes,
 * shared copy-on-write with snapshots (zb_bytes), the file ends attached to them, and reading and
 * writing them. Pipe ends (file_pipe.c) and socket ends (file_socket.c) are built on them; reading
 * never blocks (see file_pipe.c).
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

void zb_pipe_free(zb_pipe *p) {
    if (!p) return;
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
    p->reset = s->reset;
    p->cap = s->cap;
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
    f->rx->readers--;
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
    if (!pp->len) pp->start = 0;
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

