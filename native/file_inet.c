/* file_inet.c - the internet socket kind (inet.h): TCP streams over host sockets the engine
 * created itself for addresses the policy allowed (sys_inet.c checks), and UDP datagrams to the
 * sandbox's resolver, answered in the engine (at once, or when the upstream DNS server's response
 * to the engine's own query arrives on the socket's lookup fd: never a blocking host lookup).
 * SO_RCVTIMEO / SO_SNDTIMEO bound a blocking call's wait (EAGAIN, connect EINPROGRESS).
 *
 * Host sockets are non-blocking; a blocking guest call waits for its host socket with the same
 * wait as poll (file_ready.c: kicks, the run's deadline and the guest's alarm end it), and it waits
 * only while nothing was transferred, so a call served again after a stop never repeats bytes.
 * poll, select and epoll ask the host socket (poll with no wait) and, when it is not ready, watch
 * it while they sleep. A copy of the file (snapshot, fork, rewind, saved template) has no host
 * socket: a copied connection reads as reset by peer (ECONNRESET) and writes EPIPE.
 */
#include "util.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "inet.h"
#include "serial.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define MAX_NOTES 20 /* refusal notes shown per session (every refusal is counted and logged) */

/* Host connections open in this process (the engine process is one session): what
 * ZEROBOOT_NETWORK_MAX_CONNECTIONS bounds. Only the thread running a sandbox changes it. */
static int open_connections;

void zb_inet_note(zb_sandbox *sb, const char *fmt, ...) {
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (len < 0) return;
    if ((size_t)len > sizeof line - 2) len = (int)sizeof line - 2;
    zb_log(sb, "%s", line);
    zb_net *net = sb->engine->net;
    if (net && net->stats.refused + net->stats.dns_refused > MAX_NOTES) return;
    line[len++] = '\n';
    zb_output(sb, 2, line, (size_t)len); /* the cell's stderr: the user sees why, and how to allow it */
}

zb_file *zb_inet_new(int family, int type) {
    zb_file *f = zb_file_new(FILE_INET);
    zb_inet *s = f ? calloc(1, sizeof *s) : NULL;
    if (!s) { free(f); return NULL; }
    s->family = family;
    s->type = type;
    s->fd = -1;
    s->lfd = -1;
    f->priv = s;
    f->flags = O_RDWR;
    return f;
}

static int nonblocking(const zb_file *f, int flags) { return (f->flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

/* Wait for events of the host socket (or stop, or EINTR): 0 when it has some, -EAGAIN once the
 * absolute deadline (0: none; SO_RCVTIMEO / SO_SNDTIMEO) passed. A wake time left by an earlier
 * stop of this call is not this wait's: the deadline is the caller's (call_deadline). */
static long wait_for(zb_sandbox *sb, int fd, short events, int64_t deadline) {
    for (;;) {
        sb->cpu.pending_wake_ns = 0;
        int64_t timeout = -1;
        if (deadline) {
            int64_t now = zb_now_ns();
            if (now >= deadline) return -EAGAIN;
            timeout = deadline - now;
        }
        zb_ready_begin();
        zb_ready_watch(fd, events);
        long r = zb_poll_wait(sb, 0, timeout);
        if (r == ZB_POLL_AGAIN) return 0;
        if (r < 0) return r;
        if (r == 0 && deadline) return -EAGAIN; /* zb_poll_wait's timeout: the deadline */
    }
}

/* The absolute deadline of a blocking call with this socket timeout (0: none). A call stopped
 * while it waited (kick, run deadline) left its wake time, which is this deadline: a call served
 * again keeps it rather than starting its timeout over. */
static int64_t call_deadline(zb_sandbox *sb, int64_t timeout_ns) {
    if (!timeout_ns) return 0;
    return sb->cpu.pending_wake_ns ? sb->cpu.pending_wake_ns : zb_now_ns() + timeout_ns;
}

static void drop_host(zb_inet *s) {
    if (s->fd >= 0) {
        close(s->fd);
        open_connections--;
    }
    s->fd = -1;
}

/* The session's rate limit: how many of `want` bytes may move now (*allow), after waiting for the
 * bucket to hold a fiftieth of a second's worth (or all of want). 0, or a stop / -EINTR. */
static long throttle(zb_sandbox *sb, size_t want, size_t *allow) {
    zb_net *net = sb->engine->net;
    *allow = want;
    if (!net || !net->rate || !want) return 0;
    double rate = (double)net->rate, need = ZB_MIN((double)want, ZB_MAX(1.0, rate / 50));
    for (;;) {
        int64_t now = zb_now_ns();
        net->tokens = ZB_MIN(rate, net->tokens + (double)(now - net->tokens_ns) * rate / 1e9);
        net->tokens_ns = now;
        if (net->tokens >= need) {
            *allow = (size_t)ZB_MIN((double)want, net->tokens);
            return 0;
        }
        int64_t wake = now + (int64_t)((need - net->tokens) * 1e9 / rate) + 1;
        sb->cpu.pending_wake_ns = 0;
        long r = zb_sleep_until(sb, wake);
        net->stats.throttled_ns += (uint64_t)(zb_now_ns() - now);
        if (r) return r;
    }
}

static void spend(zb_sandbox *sb, ssize_t got, int sent) {
    zb_net *net = sb->engine->net;
    if (!net || got <= 0) return;
    if (sent) net->stats.bytes_sent += (uint64_t)got;
    else net->stats.bytes_received += (uint64_t)got;
    if (net->rate) net->tokens -= (double)got;
}

/* The first `allow` bytes of iov (n entries) into out. */
static int trim_iov(const struct iovec *iov, int n, size_t allow, struct iovec *out) {
    int k = 0;
    for (; k < n && allow; k++) {
        out[k] = iov[k];
        out[k].iov_len = ZB_MIN(iov[k].iov_len, allow);
        allow -= out[k].iov_len;
    }
    return k;
}

static size_t iov_total(const struct iovec *iov, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += iov[i].iov_len;
    return t;
}

/* A connect under way finished? (No wait.) A failed one leaves its error for SO_ERROR. */
void zb_inet_settle(zb_inet *s) {
    if (s->state != INET_CONNECTING) return;
    struct pollfd p = {.fd = s->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0) return;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err) {
        s->error = err;
        s->state = INET_NEW;
        drop_host(s);
    } else {
        s->state = INET_CONNECTED;
    }
}

static long take_error(zb_inet *s) {
    long e = s->error;
    s->error = 0;
    return -e;
}

long zb_inet_connect(zb_sandbox *sb, zb_file *f, const struct sockaddr *sa, socklen_t salen) {
    zb_inet *s = zb_inet_of(f);
    if (s->state == INET_RESET || s->state == INET_CONNECTED) return -EISCONN;
    if (s->state == INET_NEW) {
        if (zb_host_fd_room() < 0) return -EMFILE;
        zb_net *net = sb->engine->net;
        if (net && net->max_connections && open_connections >= net->max_connections) {
            net->stats.over_connection_limit++;
            zb_inet_note(sb, "zeroboot: connect refused (EMFILE): the session has %d connections open, its limit "
                         "(ZEROBOOT_NETWORK_MAX_CONNECTIONS in the kernelspec's env); close some first", open_connections);
            return -EMFILE;
        }
        s->fd = socket(s->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s->fd < 0) return -errno;
        open_connections++;
        for (int i = 0; i < s->nopts; i++) /* what the guest set before connecting (TCP_NODELAY, ...) */
            if (setsockopt(s->fd, s->opts[i].level, s->opts[i].name, s->opts[i].value, s->opts[i].len) < 0)
                zb_log(sb, "setsockopt(%d, %d) on the host socket: %s", s->opts[i].level, s->opts[i].name, strerror(errno));
        s->error = 0;
        if (connect(s->fd, sa, salen) == 0) {
            s->state = INET_CONNECTED;
            return 0;
        }
        if (errno != EINPROGRESS) {
            long e = -errno;
            drop_host(s);
            return e;
        }
        s->state = INET_CONNECTING;
        if (nonblocking(f, 0)) return -EINPROGRESS;
    } else if (nonblocking(f, 0)) { /* INET_CONNECTING, asked again */
        zb_inet_settle(s);
        return s->state == INET_CONNECTED ? -EISCONN : s->state == INET_NEW ? take_error(s) : -EALREADY;
    }
    int64_t deadline = call_deadline(sb, s->snd_timeout_ns);
    for (;;) { /* a blocking connect (or the same call served again after a stop) */
        zb_inet_settle(s);
        if (s->state == INET_CONNECTED) return 0;
        if (s->state == INET_NEW) return take_error(s);
        long r = wait_for(sb, s->fd, POLLOUT, deadline);
        if (r == -EAGAIN) return -EINPROGRESS; /* SO_SNDTIMEO passed: Linux's answer, still connecting */
        if (r < 0) return r;
    }
}

/* Before a transfer: 0 when connected, else what the call answers. */
static long ready_to_transfer(zb_sandbox *sb, zb_file *f, int flags, int sending, int64_t deadline) {
    zb_inet *s = zb_inet_of(f);
    for (;;) {
        zb_inet_settle(s);
        switch (s->state) {
        case INET_CONNECTED: return 0;
        case INET_RESET: return sending ? -EPIPE : -ECONNRESET;
        case INET_NEW: return s->error ? take_error(s) : sending ? -EPIPE : -ENOTCONN;
        default: break;
        }
        if (nonblocking(f, flags)) return -EAGAIN;
        long r = wait_for(sb, s->fd, POLLOUT, deadline);
        if (r < 0) return r;
    }
}

/* One send or recv on a connected stream: the state and shutdown checks, the rate limit, then the
 * host call, waiting (blocking sockets) while nothing was transferred, so a call served again after
 * a stop never repeats bytes. */
static long transfer(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags, int sending) {
    zb_inet *s = zb_inet_of(f);
    int64_t deadline = nonblocking(f, flags) ? 0 : call_deadline(sb, sending ? s->snd_timeout_ns : s->rcv_timeout_ns);
    long r = ready_to_transfer(sb, f, flags, sending, deadline);
    if (r < 0) return r;
    if (sending && s->shut_wr) return -EPIPE;
    if (!sending && s->shut_rd) return 0;
    size_t allow;
    if ((r = throttle(sb, iov_total(iov, n), &allow)) < 0) return r;
    struct iovec part[1024];
    n = trim_iov(iov, ZB_MIN(n, 1024), allow, part);
    for (;;) {
        struct msghdr m = {.msg_iov = part, .msg_iovlen = (size_t)n};
        ssize_t got = sending ? sendmsg(s->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL | (flags & MSG_MORE))
                              : recvmsg(s->fd, &m, MSG_DONTWAIT | (flags & (MSG_PEEK | MSG_TRUNC)));
        if (got >= 0) {
            if (sending || !(flags & MSG_PEEK)) spend(sb, got, sending);
            return got;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
        if (nonblocking(f, flags)) return -EAGAIN;
        if ((r = wait_for(sb, s->fd, sending ? POLLOUT : POLLIN, deadline)) < 0) return r; /* EAGAIN: the timeout */
    }
}

long zb_inet_send(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags) {
    return transfer(sb, f, iov, n, flags, 1);
}

long zb_inet_recv(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags) {
    return transfer(sb, f, iov, n, flags, 0);
}

static void queue_answer(zb_inet *s, const uint8_t *answer, size_t alen) {
    if (alen && alen <= ZB_INET_DGRAM_MAX && s->nq < ZB_INET_DGRAM_QUEUE) { /* a full queue drops it, as a full receive buffer does */
        memcpy(s->q[s->nq], answer, alen);
        s->qlen[s->nq++] = (uint16_t)alen;
    }
}

static void drop_lookup(zb_inet *s) {
    if (s->lfd >= 0) close(s->lfd);
    s->lfd = -1;
}

/* The guest's question needs the host's DNS: send our own query for the validated name to the
 * upstream server and return; the answer arrives as a datagram (lookup_settle). A server that
 * cannot be asked is SERVFAIL at once. */
static void start_lookup(zb_net *net, zb_inet *s, const zb_dns_question *qn) {
    static __thread uint16_t counter;
    uint8_t query[ZB_INET_DGRAM_MAX], answer[ZB_INET_DGRAM_MAX];
    drop_lookup(s); /* an earlier one not answered yet is abandoned, as a resent query replaces it */
    s->lq = *qn;
    s->lid = (uint16_t)((uint64_t)zb_now_ns() >> 10 ^ (uint64_t)++counter * 40503u);
    size_t qlen = zb_dns_host_query(qn, s->lid, query, sizeof query);
    int fd = -1;
    if (qlen && zb_net_upstream(net) == 0 && zb_host_fd_room() == 0) {
        fd = socket(net->upstream.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0 && (connect(fd, (struct sockaddr *)&net->upstream, net->upstream_len) < 0 ||
                        send(fd, query, qlen, MSG_NOSIGNAL) != (ssize_t)qlen)) {
            close(fd);
            fd = -1;
        }
    }
    net->stats.dns_host_lookups++;
    if (fd < 0) {
        queue_answer(s, answer, zb_dns_host_reply(net, qn, s->lid, NULL, 0, answer, sizeof answer));
        return;
    }
    s->lfd = fd;
    s->lstart = zb_now_ns();
}

/* A lookup under way answered (or refused, or out of time)? Queues the guest's answer; no wait. */
static void lookup_settle(zb_net *net, zb_inet *s) {
    if (s->lfd < 0) return;
    if (!net) { drop_lookup(s); return; }
    uint8_t response[4096], answer[ZB_INET_DGRAM_MAX];
    for (int tries = 0; tries < 8; tries++) { /* datagrams of other ids (late ones) are dropped */
        ssize_t got = recv(s->lfd, response, sizeof response, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (got >= 2 && (response[0] << 8 | response[1]) != s->lid) continue;
        /* an answer, or an error (ECONNREFUSED: nothing listens there): SERVFAIL */
        size_t alen = zb_dns_host_reply(net, &s->lq, s->lid, got >= 0 ? response : NULL, got >= 0 ? (size_t)got : 0,
                                        answer, sizeof answer);
        queue_answer(s, answer, alen);
        drop_lookup(s);
        return;
    }
    if (zb_now_ns() - s->lstart >= ZB_NET_LOOKUP_TIMEOUT_NS) {
        net->stats.dns_host_timeouts++;
        queue_answer(s, answer, zb_dns_host_reply(net, &s->lq, s->lid, NULL, 0, answer, sizeof answer));
        drop_lookup(s);
    }
}

/* A datagram from the guest to the sandbox's resolver: answered at once, the answer queued, or
 * (a name only the host's DNS knows) a lookup started. */
long zb_inet_dgram_send(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n) {
    zb_inet *s = zb_inet_of(f);
    zb_net *net = sb->engine->net;
    if (!net) return -EACCES;
    uint8_t query[ZB_INET_DGRAM_MAX * 8], answer[ZB_INET_DGRAM_MAX];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len > sizeof query - len) return -EMSGSIZE;
        memcpy(query + len, iov[i].iov_base, iov[i].iov_len);
        len += iov[i].iov_len;
    }
    char refused[ZB_NET_NAME_MAX + 1];
    zb_dns_question later;
    size_t alen = zb_dns_answer(net, query, len, answer, sizeof answer, refused, sizeof refused, &later);
    if (refused[0] && strcmp(refused, net->last_refused_name)) {
        snprintf(net->last_refused_name, sizeof net->last_refused_name, "%s", refused);
        zb_inet_note(sb, "zeroboot: the sandbox's resolver answered NXDOMAIN for %s: the name is not in the network "
                     "allow list (add it to ZEROBOOT_NETWORK in the kernelspec's env; `%%sandbox network` shows the list)",
                     refused);
    }
    if (later.qend) start_lookup(net, s, &later);
    else queue_answer(s, answer, alen);
    return (long)len;
}

/* The next answer into the guest's buffers (truncated to them, as a datagram is). */
long zb_inet_dgram_recv(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags) {
    zb_inet *s = zb_inet_of(f);
    lookup_settle(sb->engine->net, s);
    while (!s->nq) {
        if (s->lfd < 0 || nonblocking(f, flags)) return -EAGAIN; /* nothing else can arrive */
        long r = wait_for(sb, s->lfd, POLLIN, s->lstart + ZB_NET_LOOKUP_TIMEOUT_NS);
        if (r < 0 && r != -EAGAIN) return r; /* a stop or EINTR; EAGAIN: time is up, settled below */
        lookup_settle(sb->engine->net, s);
    }
    size_t len = s->qlen[0], at = 0;
    for (int i = 0; i < n && at < len; i++) {
        size_t part = ZB_MIN(iov[i].iov_len, len - at);
        memcpy(iov[i].iov_base, s->q[0] + at, part);
        at += part;
    }
    if (!(flags & MSG_PEEK)) {
        memmove(s->q[0], s->q[1], sizeof s->q[0] * (size_t)(s->nq - 1));
        memmove(s->qlen, s->qlen + 1, sizeof s->qlen[0] * (size_t)(s->nq - 1));
        s->nq--;
    }
    return (long)((flags & MSG_TRUNC) ? len : at);
}

static long inet_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    if (off >= 0) return -ESPIPE;
    struct iovec iov = {p, n};
    return zb_inet_of(f)->type == SOCK_DGRAM ? zb_inet_dgram_recv(sb, f, &iov, 1, 0) : zb_inet_recv(sb, f, &iov, 1, 0);
}

static long inet_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    if (off >= 0) return -ESPIPE;
    struct iovec iov = {(void *)p, n};
    zb_inet *s = zb_inet_of(f);
    if (s->type == SOCK_DGRAM) return s->state == INET_CONNECTED ? zb_inet_dgram_send(sb, f, &iov, 1) : -EDESTADDRREQ;
    return zb_inet_send(sb, f, &iov, 1, 0);
}

static long inet_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, S_IFSOCK | 0777);
    return 0;
}

static short inet_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)waits_uart;
    zb_inet *s = zb_inet_of(f);
    if (s->type == SOCK_DGRAM) {
        lookup_settle(sb->engine->net, s);
        if (!s->nq && s->lfd >= 0) zb_ready_watch(s->lfd, POLLIN); /* the host's DNS answers later */
        return (short)(POLLOUT | POLLWRNORM | (s->nq ? POLLIN | POLLRDNORM : 0));
    }
    zb_inet_settle(s);
    switch (s->state) {
    case INET_RESET: return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLHUP | POLLERR | POLLRDHUP;
    case INET_NEW: return (short)(POLLOUT | POLLWRNORM | POLLHUP | (s->error ? POLLERR : 0));
    case INET_CONNECTING:
        zb_ready_watch(s->fd, POLLOUT);
        return 0;
    default: break;
    }
    struct pollfd p = {.fd = s->fd, .events = (short)(want & (POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLPRI | POLLRDHUP))};
    if (poll(&p, 1, 0) < 0) p.revents = 0;
    if (!p.revents) zb_ready_watch(s->fd, p.events);
    return p.revents;
}

static int inet_unread(zb_sandbox *sb, const zb_file *f) {
    (void)sb;
    const zb_inet *s = zb_inet_of(f);
    if (s->type == SOCK_DGRAM) return s->nq ? s->qlen[0] : 0;
    int n = 0;
    if (s->state != INET_CONNECTED || ioctl(s->fd, FIONREAD, &n) < 0) return 0;
    return n;
}

static void inet_release(zb_fs *fs, zb_file *f) {
    (void)fs;
    zb_inet *s = zb_inet_of(f);
    if (!s) return;
    drop_host(s);
    drop_lookup(s);
    free(s);
    f->priv = NULL;
}

/* A copy never shares the host socket: a connection (or a connect under way) reads as reset. */
static void copy_state(zb_inet *dst, const zb_inet *src) {
    *dst = *src;
    dst->fd = -1;
    dst->lfd = -1; /* a lookup under way is the live socket's: the copy's guest asks again */
    if (src->state == INET_CONNECTING || (src->state == INET_CONNECTED && src->type == SOCK_STREAM)) dst->state = INET_RESET;
}

static int inet_clone(zb_file *dst, const zb_file *src) {
    zb_inet *s = malloc(sizeof *s);
    if (!s) return -1;
    copy_state(s, zb_inet_of(src));
    dst->priv = s;
    return 0;
}

static uint64_t inet_copy_bytes(const zb_file *f) {
    (void)f;
    return sizeof(zb_inet);
}

/* One record: family, type, state (a connection saved is reset), pending error. */
static void inet_save(const zb_file *f, zb_out *o) {
    zb_inet c;
    copy_state(&c, zb_inet_of(f));
    out_u32(o, 1);
    out_u32(o, (uint32_t)c.family);
    out_u32(o, (uint32_t)c.type);
    out_u32(o, (uint32_t)c.state);
    out_u32(o, (uint32_t)c.error);
}

static int inet_load(zb_file *f, zb_in *in) {
    uint32_t records = in_u32(in);
    zb_inet *s = calloc(1, sizeof *s);
    if (!s) return -1;
    f->priv = s;
    s->fd = -1;
    s->lfd = -1;
    uint32_t family = in_u32(in), type = in_u32(in), state = in_u32(in), error = in_u32(in);
    if (in->err || records != 1 || (family != AF_INET && family != AF_INET6) || (type != SOCK_STREAM && type != SOCK_DGRAM) ||
        (state != INET_NEW && state != INET_RESET && state != INET_CONNECTED) || error > 4095 ||
        (type == SOCK_STREAM && state == INET_CONNECTED)) /* a saved connection is reset: never connected */
        return -1;
    s->family = (int)family;
    s->type = (int)type;
    s->state = (int)state;
    s->error = (int)error;
    return 0;
}

const zb_file_ops zb_file_inet_ops = {
    .name = "inet",
    .read = inet_read,
    .write = inet_write,
    .stat = inet_stat,
    .ready = inet_ready,
    .unread = inet_unread,
    .release = inet_release,
    .clone = inet_clone,
    .save = inet_save,
    .load = inet_load,
    .copy_bytes = inet_copy_bytes,
};
