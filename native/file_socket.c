/* file_socket.c - an AF_UNIX stream socket of the sandbox: a socketpair end, or a socket made by
 * socket(2) that is unconnected, listening, or connected by connect/accept (sys_socket.c has the
 * calls). A connected one reads the stream its peer writes (rx) and writes the one its peer reads
 * (tx); shutdown() detaches either. A direction shut down reads EOF and writes EPIPE, as in Linux;
 * a socket never connected reads EINVAL and writes ENOTCONN, as Linux's unix sockets do. */
#include "fs.h"
#include "serial.h"

#include <poll.h>
#include <stdatomic.h>

static atomic_uint_fast64_t last_bind_id;

uint64_t zb_usock_new_bind_id(void) { return atomic_fetch_add(&last_bind_id, 1) + 1; }

void zb_usock_bind_id_loaded(uint64_t id) {
    uint_fast64_t seen = atomic_load(&last_bind_id);
    while (seen < id && !atomic_compare_exchange_weak(&last_bind_id, &seen, id)) {
    }
}

long zb_usock_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, zb_scm **taken) {
    if (!zb_usock_connected(f)) return -EINVAL;
    if (f->rx && f->rx->reset && !f->rx->len) { /* its server end closed before accepting it */
        f->rx->reset = 0;
        return -ECONNRESET;
    }
    if (!f->rx) return 0;
    zb_scm *r = NULL;
    long got = zb_stream_read_scm(f->rx, p, n, &r);
    if (r) {
        sb->read_took_files = 1; /* a readv stops here, as Linux's stream read does */
        if (taken) *taken = r;
        else zb_scm_drop(r); /* a read with no control buffer: the files are closed */
    }
    return got;
}

static long socket_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    if (off >= 0) return -ESPIPE;
    return zb_usock_read(sb, f, p, n, NULL);
}

static long socket_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    if (!zb_usock_connected(f)) return -ENOTCONN;
    return f->tx ? zb_stream_write(f->tx, p, n) : -EPIPE;
}

static long socket_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, S_IFSOCK | 0777);
    return 0;
}

/* Linux's unix stream sockets: EOF reads as POLLIN | POLLRDHUP, both ways shut as POLLHUP; a
 * listener is readable while a connection waits; one never connected is writable and hung up. */
static short socket_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)want;
    (void)waits_uart;
    const zb_usock *u = zb_usock_of(f);
    if (u && u->state == ZB_USOCK_LISTENING) return u->npending ? POLLIN | POLLRDNORM : 0;
    if (u && u->state == ZB_USOCK_UNCONNECTED) return POLLOUT | POLLWRNORM | POLLHUP;
    short got = 0;
    if (!f->rx || f->rx->len || !f->rx->writers) got |= POLLIN | POLLRDNORM;
    if (!f->rx || !f->rx->writers) got |= POLLRDHUP;
    if (f->tx && f->tx->readers && f->tx->len < ZB_STREAM_CAP) got |= POLLOUT | POLLWRNORM;
    if ((!f->tx || !f->tx->readers) && (!f->rx || !f->rx->writers)) got |= POLLHUP;
    return got;
}

/* A listener's pending connections end with it: their clients' next read is ECONNRESET, then
 * EOF, and writes EPIPE, as in Linux. */
static void socket_release(zb_fs *fs, zb_file *f) {
    zb_usock *u = zb_usock_of(f);
    if (!u) return;
    for (int i = 0; i < u->npending; i++) {
        if (u->pending[i]->tx) u->pending[i]->tx->reset = 1;
        zb_file_unref(fs, u->pending[i]);
    }
    free(u);
    f->priv = NULL;
}

/* A clone of a table copies the names and the state. A listener's pending connections are not
 * copied: a snapshot refuses a listener with connections waiting (zb_usock_listeners_waiting), and
 * a fork's clone of one is replaced by the parent's own file at once (zb_fdtable_share). */
static int socket_clone(zb_file *dst, const zb_file *src) {
    const zb_usock *u = zb_usock_of(src);
    if (!u) return 0;
    zb_usock *c = malloc(sizeof *c);
    if (!c) return -1;
    *c = *u;
    c->npending = 0;
    dst->priv = c;
    return 0;
}

/* In a snapshot: one record with the state, both addresses, a path name's id (its INO_SOCKET
 * inode holds it too, fs_snapshot.c), a listener's backlog and IPV6_V6ONLY; none for a socketpair
 * end. A listener's accept queue is empty (a snapshot refuses one with connections waiting). */
static void socket_save(const zb_file *f, zb_out *o) {
    const zb_usock *u = zb_usock_of(f);
    out_u32(o, u != NULL);
    if (!u) return;
    out_u32(o, (uint32_t)u->state);
    out_u32(o, u->name_len);
    out_bytes(o, u->name, sizeof u->name);
    out_u32(o, u->peer_len);
    out_bytes(o, u->peer, sizeof u->peer);
    out_u64(o, u->bind_id);
    out_u32(o, (uint32_t)u->backlog);
    out_u32(o, (uint32_t)u->v6only);
}

static int socket_load(zb_file *f, zb_in *in) {
    uint32_t n = in_u32(in);
    if (in->err || n > 1) return -1;
    if (!n) return 0;
    zb_usock *u = calloc(1, sizeof *u);
    if (!u) return -1;
    f->priv = u;
    uint32_t state = in_u32(in);
    u->name_len = in_u32(in);
    in_bytes(in, u->name, sizeof u->name);
    u->peer_len = in_u32(in);
    in_bytes(in, u->peer, sizeof u->peer);
    u->bind_id = in_u64(in);
    uint32_t backlog = in_u32(in), v6only = in_u32(in);
    if (in->err || state > ZB_USOCK_CONNECTED || u->name_len < 2 || u->name_len > sizeof u->name || u->peer_len < 2 ||
        u->peer_len > sizeof u->peer || backlog > ZB_USOCK_BACKLOG_MAX || v6only > 1 || u->bind_id > ZB_USOCK_BIND_ID_MAX)
        return -1;
    u->state = (int)state;
    u->backlog = (int)backlog;
    u->v6only = (int)v6only;
    zb_usock_bind_id_loaded(u->bind_id);
    return 0;
}

static uint64_t socket_copy_bytes(const zb_file *f) { return zb_usock_of(f) ? sizeof(zb_usock) : 0; }

const zb_file_ops zb_file_socket_ops = {
    .name = "socket",
    .props = ZB_FOPS_WRITE_ANY_MODE | ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS | ZB_FOPS_WHOLE_WRITES,
    .read = socket_read,
    .write = socket_write,
    .stat = socket_stat,
    .ready = socket_ready,
    .unread = zb_stream_unread,
    .release = socket_release,
    .clone = socket_clone,
    .save = socket_save,
    .load = socket_load,
    .copy_bytes = socket_copy_bytes,
};
