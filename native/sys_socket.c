/* sys_socket.c - AF_UNIX stream sockets inside the sandbox, TCP on its own loopback, and no network.
 *
 * socketpair(AF_UNIX, SOCK_STREAM) is what asyncio's event loop (its self-pipe) and other
 * in-process plumbing need; socket(AF_UNIX, SOCK_STREAM) with bind/listen/accept/connect is what
 * multiprocessing's Listener, Manager() and SharedMemoryManager use between the processes of the
 * sandbox. A connection is two zb_pipe streams, as a socketpair is: send/recv, sendmsg/recvmsg,
 * shutdown, MSG_PEEK and the usual options. A name is a path in the sandbox's own files (an
 * INO_SOCKET inode holding the socket's bind id; never a file on the host: bind in a host folder
 * is EACCES) or an abstract name (a leading NUL, per sandbox). connect finds the listener by
 * looking through the fd tables of the sandbox's processes, so no table of names can go stale;
 * it never reaches a host socket. Without a network policy (sys_inet.c serves internet sockets
 * with one), AF_INET and AF_INET6 SOCK_STREAM sockets are the same in-memory streams, named by
 * loopback addresses and ports (sock_loopback.c): the sandbox's own 127.0.0.1 and ::1, never the
 * host's. Other socket types and domains fail with EACCES (logged once, so the notebook's log says
 * why). sendmsg passes fds with SCM_RIGHTS as Linux does (what
 * multiprocessing's forkserver needs): the open file descriptions ride on the bytes of their
 * message (zb_scm, file_stream.c), a read stops at the end of those bytes, recvmsg installs them
 * in the receiver and any other read closes them; ZB_SCM_INFLIGHT_MAX bounds the references in
 * flight per family, which has no garbage collector: a cycle (a socket in flight on itself) lives
 * until the family's file system ends. SCM_CREDENTIALS is not supported (EOPNOTSUPP). The socket
 * file kind itself (reading, writing, readiness, its state) is file_socket.c.
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "process.h"
#include "fs.h"
#include "linux.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>

#define MAX_IOV 1024

static zb_file *socket_file(zb_sandbox *sb, uint64_t fd, long *err) {
    zb_file *f = zb_fd_get(sb, fd);
    *err = !f ? -EBADF : f->kind != FILE_SOCKET ? -ENOTSOCK : 0;
    return *err ? NULL : f;
}

#define SUN_LEN_MAX ((uint32_t)sizeof(struct sockaddr_un)) /* 110: family + 108 bytes of sun_path */

/* A socket's state, unnamed and with an unnamed peer (AF_UNIX: the family alone, little-endian;
 * AF_INET/AF_INET6: the wildcard address, port 0). */
static zb_usock *usock_new(int family, int state) {
    zb_usock *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    u->state = state;
    if (family != AF_UNIX) {
        zb_lo_unbound(u, family);
        return u;
    }
    u->name_len = u->peer_len = sizeof(sa_family_t);
    u->name[0] = u->peer[0] = AF_UNIX;
    return u;
}

/* The family of a socket file (a socketpair end, which has no state yet, is AF_UNIX). */
static int socket_family(const zb_file *f) { return zb_usock_of(f) ? zb_lo_family(zb_usock_of(f)) : AF_UNIX; }

static long sys_socket(zb_sandbox *sb, const uint64_t a[6]) {
    int domain = (int)a[0], type = (int)a[1] & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
    int loopback = domain == AF_INET || domain == AF_INET6; /* here only without a network policy */
    if ((domain == AF_UNIX || loopback) && (a[1] & ~(uint64_t)(0xf | SOCK_NONBLOCK | SOCK_CLOEXEC))) return -EINVAL;
    if ((domain == AF_UNIX || loopback) && type == SOCK_STREAM) {
        if (a[2] != 0 && a[2] != (loopback ? IPPROTO_TCP : PF_UNIX)) return -EPROTONOSUPPORT;
        zb_file *f = zb_file_new(FILE_SOCKET);
        zb_usock *u = usock_new(domain, ZB_USOCK_UNCONNECTED);
        if (!f || !u) { free(f); free(u); return -ENOMEM; }
        f->priv = u;
        f->flags = O_RDWR | ((a[1] & SOCK_NONBLOCK) ? O_NONBLOCK : 0);
        return zb_fd_install(sb, f, 0, (a[1] & SOCK_CLOEXEC) != 0);
    }
    if (!sb->logged_no_network++)
        zb_log(sb, "socket(domain %d, type %d) refused with EACCES: the sandbox has no network; AF_UNIX "
               "SOCK_STREAM sockets, socketpair() and TCP on the sandbox's own loopback work", domain, type);
    return -EACCES;
}

static long sys_socketpair(zb_sandbox *sb, const uint64_t a[6]) {
    int domain = (int)a[0], type = (int)a[1] & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), flags = (int)a[1] & (SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (domain != AF_UNIX) return -EOPNOTSUPP;
    if (type != SOCK_STREAM) {
        zb_log(sb, "socketpair(AF_UNIX, type %d) is not supported: only SOCK_STREAM", type);
        return -EOPNOTSUPP;
    }
    if (a[2] != 0 && a[2] != PF_UNIX) return -EPROTONOSUPPORT;
    if (!zb_guest_ptr(sb, a[3], 2 * sizeof(int), 1)) return -EFAULT;
    zb_pipe *ab = zb_pipe_new(), *ba = zb_pipe_new();
    zb_file *first = zb_file_new(FILE_SOCKET), *second = zb_file_new(FILE_SOCKET);
    if (!ab || !ba || !first || !second) { free(ab); free(ba); free(first); free(second); return -ENOMEM; }
    zb_file_attach_tx(first, ab);
    zb_file_attach_rx(second, ab);
    zb_file_attach_tx(second, ba);
    zb_file_attach_rx(first, ba);
    first->flags = second->flags = O_RDWR | ((flags & SOCK_NONBLOCK) ? O_NONBLOCK : 0);
    return zb_fd_install_pair(sb, first, second, flags & SOCK_CLOEXEC, a[3]);
}

static long check_send_flags(uint64_t flags) {
    return flags & ~(uint64_t)(MSG_DONTWAIT | MSG_NOSIGNAL | MSG_EOR | MSG_MORE) ? -EOPNOTSUPP : 0;
}

static long check_recv_flags(uint64_t flags) {
    return flags & ~(uint64_t)(MSG_DONTWAIT | MSG_PEEK | MSG_WAITALL | MSG_CMSG_CLOEXEC | MSG_TRUNC) ? -EOPNOTSUPP : 0;
}

/* MSG_PEEK: copy queued bytes from `skip` on, leaving them queued; up to the end of the files in
 * flight it reaches (*seen), as a read would stop. */
static long peek(zb_file *f, uint8_t *p, size_t n, size_t skip, zb_scm **seen) {
    const zb_pipe *pp = f->rx;
    if (!zb_usock_connected(f)) return -EINVAL;
    if (!pp || skip >= pp->len) return !pp || !pp->writers || skip ? 0 : -EAGAIN;
    return zb_stream_peek_scm(pp, p, n, skip, seen);
}

/* Move bytes between the guest's iovecs and the socket, stopping at the first short transfer, and
 * (receiving) at the end of files in flight it reaches: *scm is then their record (taken off the
 * stream, or only seen when peeking; NULL scm: a taken one is dropped). */
static long transfer(zb_sandbox *sb, zb_file *f, const struct iovec *iov, uint64_t cnt, int is_send, int peeking,
                     zb_scm **scm) {
    long total = 0;
    zb_scm *seen = NULL;
    sb->read_took_files = 0;
    for (uint64_t i = 0; i < cnt; i++) {
        size_t len = iov[i].iov_len;
        if (!len) continue;
        uint8_t *p = zb_guest_ptr(sb, (uint64_t)(uintptr_t)iov[i].iov_base, len, !is_send);
        if (!p) return total ? total : -EFAULT;
        long r = is_send ? f->ops->write(sb, f, p, len, -1)
                 : peeking ? peek(f, p, len, (size_t)total, &seen) : zb_usock_read(sb, f, p, len, scm);
        if (r < 0) return total ? total : r;
        total += r;
        if ((size_t)r < len || seen || sb->read_took_files) break;
    }
    if (scm && peeking) *scm = seen;
    return total;
}

static long sys_sendto(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if ((err = check_send_flags(a[3]))) return err;
    if (a[4] && a[5] && socket_family(f) == AF_UNIX) return zb_usock_connected(f) ? -EISCONN : -EOPNOTSUPP;
    struct iovec iov = {(void *)(uintptr_t)a[1], (size_t)a[2]};
    return zb_io_would_block(sb, f, transfer(sb, f, &iov, 1, 1, 0, NULL), 1, (a[3] & MSG_DONTWAIT) != 0, (a[3] & MSG_NOSIGNAL) != 0);
}

static long sys_recvfrom(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if ((err = check_recv_flags(a[3]))) return err;
    struct iovec iov = {(void *)(uintptr_t)a[1], (size_t)a[2]};
    long r = zb_io_would_block(sb, f, transfer(sb, f, &iov, 1, 0, (a[3] & MSG_PEEK) != 0, NULL), 0, (a[3] & MSG_DONTWAIT) != 0, 0);
    if (r >= 0 && a[4] && a[5]) { /* a connected stream socket reports no source address */
        socklen_t zero = 0;
        if (zb_copy_to_guest(sb, a[5], &zero, sizeof zero) < 0) return -EFAULT;
    }
    return r;
}

/* The control data sendmsg takes: Linux's optmem_max (131072 by default since 6.9; 20480 before),
 * past which its copy fails with ENOBUFS. Only the headers and the fds are copied from it. */
#define SCM_CONTROL_MAX 131072u

/* sendmsg's ancillary data, read as Linux's __scm_send does: each header within msg_controllen
 * (EINVAL), other levels ignored, SCM_RIGHTS the only type (EINVAL for others; SCM_CREDENTIALS is
 * not supported: EOPNOTSUPP, logged), at most ZB_SCM_MAX_FD fds in all (EINVAL), each open here
 * (EBADF). files gets the open file descriptions (no reference taken). */
static long scm_parse(zb_sandbox *sb, const struct msghdr *m, zb_file **files, int *nfiles) {
    uint64_t ctl = (uint64_t)(uintptr_t)m->msg_control, len = m->msg_controllen;
    *nfiles = 0;
    if (!len) return 0;
    if (len > SCM_CONTROL_MAX) return -ENOBUFS;
    if (!zb_guest_ptr(sb, ctl, len, 0)) return -EFAULT; /* Linux copies it all first */
    for (uint64_t off = 0; len - off >= sizeof(struct cmsghdr);) {
        struct cmsghdr h;
        if (zb_copy_from_guest(sb, &h, ctl + off, sizeof h) < 0) return -EFAULT;
        if (h.cmsg_len < sizeof h || h.cmsg_len > len - off) return -EINVAL;
        if (h.cmsg_level == SOL_SOCKET) {
            if (h.cmsg_type == SCM_CREDENTIALS) {
                zb_log(sb, "sendmsg with SCM_CREDENTIALS is not supported (EOPNOTSUPP): only SCM_RIGHTS");
                return -EOPNOTSUPP;
            }
            if (h.cmsg_type != SCM_RIGHTS) return -EINVAL;
            uint64_t num = (h.cmsg_len - sizeof h) / sizeof(int);
            if (num > ZB_SCM_MAX_FD || (uint64_t)*nfiles + num > ZB_SCM_MAX_FD) return -EINVAL;
            int fds[ZB_SCM_MAX_FD];
            if (num && zb_copy_from_guest(sb, fds, ctl + off + sizeof h, num * sizeof(int)) < 0) return -EFAULT;
            for (uint64_t i = 0; i < num; i++) {
                zb_file *g = fds[i] < 0 ? NULL : zb_fd_get(sb, (uint64_t)fds[i]);
                if (!g) return -EBADF;
                files[(*nfiles)++] = g;
            }
        }
        uint64_t step = CMSG_ALIGN(h.cmsg_len);
        if (step > len - off) break;
        off += step;
    }
    return 0;
}

/* Install the files of a record the read reached as the receiver's fds and write their cmsghdr
 * to its control buffer, as Linux's scm_detach_fds does: as many as the buffer holds, the lowest
 * free fds (EMFILE ends it), MSG_CTRUNC when any did not fit (the record's references to them are
 * closed with it). A buffer the guest cannot write gets none (Linux: EFAULT on the first fd). */
static int scm_deliver(zb_sandbox *sb, uint64_t ctl, uint64_t ctllen, const zb_scm *r, int cloexec, uint64_t *used) {
    uint64_t fdmax = ctllen <= sizeof(struct cmsghdr) ? 0 : (ctllen - sizeof(struct cmsghdr)) / sizeof(int);
    int want = (int)ZB_MIN(fdmax, (uint64_t)r->n), i = 0;
    int fds[ZB_SCM_MAX_FD];
    *used = 0;
    if (want > 0 && zb_guest_ptr(sb, ctl, CMSG_LEN((size_t)want * sizeof(int)), 1)) {
        for (; i < want; i++) {
            r->files[i]->refs++; /* the new fd's */
            int fd = zb_fd_install(sb, r->files[i], 0, cloexec);
            if (fd < 0) break; /* the table is full: that reference went again */
            fds[i] = fd;
        }
    }
    if (i > 0) {
        struct cmsghdr h = {.cmsg_len = CMSG_LEN((size_t)i * sizeof(int)), .cmsg_level = SOL_SOCKET, .cmsg_type = SCM_RIGHTS};
        /* validated above */
        (void)zb_copy_to_guest(sb, ctl, &h, sizeof h);
        (void)zb_copy_to_guest(sb, ctl + sizeof h, fds, (size_t)i * sizeof(int));
        *used = ZB_MIN((uint64_t)CMSG_SPACE((size_t)i * sizeof(int)), ctllen);
    }
    return i < r->n ? MSG_CTRUNC : 0;
}

/* sendmsg/recvmsg: the iovecs of a struct msghdr and its ancillary data (fds passed with
 * SCM_RIGHTS, attached to the bytes they are sent with). */
static long msg_io(zb_sandbox *sb, const uint64_t a[6], int is_send) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if ((err = is_send ? check_send_flags(a[2]) : check_recv_flags(a[2]))) return err;
    struct msghdr m;
    if (zb_copy_from_guest(sb, &m, a[1], sizeof m) < 0) return -EFAULT;
    if (m.msg_iovlen > MAX_IOV) return -EMSGSIZE;
    zb_file *files[ZB_SCM_MAX_FD];
    int nfiles = 0;
    int unix_socket = socket_family(f) == AF_UNIX;
    if (is_send && unix_socket && (err = scm_parse(sb, &m, files, &nfiles)) < 0) return err;
    if (is_send && m.msg_name && unix_socket) return -EISCONN; /* TCP ignores it */
    if (nfiles && sb->fs->scm_inflight + nfiles > ZB_SCM_INFLIGHT_MAX) {
        zb_log(sb, "sendmsg of %d fds refused with ETOOMANYREFS: %d are in flight on the sandbox's sockets, at most %d",
               nfiles, sb->fs->scm_inflight, ZB_SCM_INFLIGHT_MAX);
        return -ETOOMANYREFS;
    }
    struct iovec iov[MAX_IOV];
    if (m.msg_iovlen && zb_copy_from_guest(sb, iov, (uint64_t)(uintptr_t)m.msg_iov, m.msg_iovlen * sizeof *iov) < 0) return -EFAULT;
    zb_scm *rec = NULL;
    zb_pipe *tx = f->tx;
    uint64_t pos = tx ? tx->consumed + tx->len : 0;
    if (nfiles && !(rec = zb_scm_new(nfiles))) return -ENOMEM; /* made before anything is sent */
    int peeking = !is_send && (a[2] & MSG_PEEK);
    zb_scm *got = NULL;
    long r = zb_io_would_block(sb, f, transfer(sb, f, iov, m.msg_iovlen, is_send, peeking, is_send ? NULL : &got), is_send,
                               (a[2] & MSG_DONTWAIT) != 0, (a[2] & MSG_NOSIGNAL) != 0);
    if (rec) {
        if (r > 0 && tx && f->tx == tx) { /* the files ride on the first byte sent (none sent: none go, as in Linux) */
            for (int i = 0; i < nfiles; i++) {
                rec->files[i] = files[i];
                files[i]->refs++;
            }
            zb_scm_link(sb->fs, tx, rec, pos, pos + (uint64_t)r);
        } else {
            free(rec);
        }
    }
    if (r >= 0 && !is_send) {
        int flags = (int)(a[2] & MSG_CMSG_CLOEXEC); /* Linux reports it back */
        uint64_t used = 0;
        if (got) flags |= scm_deliver(sb, (uint64_t)(uintptr_t)m.msg_control, m.msg_controllen, got,
                                      (a[2] & MSG_CMSG_CLOEXEC) != 0, &used);
        m.msg_namelen = 0;
        m.msg_controllen = used;
        m.msg_flags = flags;
        if (zb_copy_to_guest(sb, a[1], &m, sizeof m) < 0) r = -EFAULT;
    }
    if (got && !peeking) zb_scm_drop(got); /* the references installed are the new fds' own */
    return r;
}
static long sys_sendmsg(zb_sandbox *sb, const uint64_t a[6]) { return msg_io(sb, a, 1); }
static long sys_recvmsg(zb_sandbox *sb, const uint64_t a[6]) { return msg_io(sb, a, 0); }

static long sys_shutdown(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if (a[1] != SHUT_RD && a[1] != SHUT_WR && a[1] != SHUT_RDWR) return -EINVAL;
    if (a[1] != SHUT_WR) zb_file_detach_rx(f);
    if (a[1] != SHUT_RD) zb_file_detach_tx(f);
    return 0;
}

static long sys_getsockopt(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    int family = socket_family(f), v;
    if (a[1] == IPPROTO_TCP && family != AF_UNIX) {
        if (a[2] != TCP_NODELAY) return -ENOPROTOOPT;
        v = 1; /* an in-memory stream never holds bytes back */
    } else if (a[1] == IPPROTO_IPV6 && family == AF_INET6) {
        if (a[2] != IPV6_V6ONLY) return -ENOPROTOOPT;
        v = zb_usock_of(f)->v6only;
    } else if (a[1] != SOL_SOCKET) {
        return -EOPNOTSUPP;
    } else {
        switch (a[2]) {
        case SO_TYPE: v = SOCK_STREAM; break;
        case SO_DOMAIN: v = family; break;
        case SO_PROTOCOL: v = family == AF_UNIX ? 0 : IPPROTO_TCP; break;
        case SO_ACCEPTCONN: v = zb_usock_listening(f); break;
        case SO_ERROR: case SO_REUSEADDR: case SO_KEEPALIVE: v = 0; break;
        case SO_RCVBUF: case SO_SNDBUF: v = (int)ZB_STREAM_CAP; break;
        default: return -ENOPROTOOPT;
        }
    }
    socklen_t len;
    if (zb_copy_from_guest(sb, &len, a[4], sizeof len) < 0) return -EFAULT;
    if ((int)len < 0) return -EINVAL;
    len = ZB_MIN(len, (socklen_t)sizeof v);
    if (zb_copy_to_guest(sb, a[3], &v, len) < 0 || zb_copy_to_guest(sb, a[4], &len, sizeof len) < 0) return -EFAULT;
    return 0;
}

/* Buffer sizes, keep-alive, TCP_NODELAY and the like have no effect on an in-memory stream:
 * accepted. IPV6_V6ONLY is kept (it decides which ports a wildcard name takes), until bound. */
static long sys_setsockopt(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    int family = socket_family(f);
    if (a[1] == IPPROTO_IPV6 && family == AF_INET6 && a[2] == IPV6_V6ONLY) {
        int on;
        if (a[4] < sizeof on) return -EINVAL;
        if (zb_copy_from_guest(sb, &on, a[3], sizeof on) < 0) return -EFAULT;
        if (zb_lo_bound(zb_usock_of(f))) return -EINVAL;
        zb_usock_of(f)->v6only = on != 0;
        return 0;
    }
    if (family != AF_UNIX && (a[1] == IPPROTO_TCP || a[1] == IPPROTO_IP || (a[1] == IPPROTO_IPV6 && family == AF_INET6)))
        return a[4] < sizeof(int) ? -EINVAL : 0;
    if (a[1] != SOL_SOCKET) return -ENOPROTOOPT;
    if (a[4] < sizeof(int) && a[2] != SO_BINDTODEVICE) return -EINVAL;
    return 0;
}

/* ---- names, listeners and connections ---- */

#define AUTOBIND_TRIES 256

/* A guest sockaddr_un, copied and checked as Linux's unix_validate_addr does, into out (the bytes
 * as getsockname returns them: a path is cut at its NUL and keeps one). *path is the path name
 * (in out), or NULL for an abstract name. len 2 (the family alone) is -EINVAL unless autobind_ok;
 * then *out_len is 0. */
static long read_addr(zb_sandbox *sb, uint64_t addr, uint64_t len, int autobind_ok, uint8_t out[ZB_USOCK_NAME_MAX],
                      uint32_t *out_len, const char **path) {
    uint8_t raw[sizeof(struct sockaddr_storage)];
    if ((int64_t)len < 0 || len > sizeof raw) return -EINVAL;
    if (len && zb_copy_from_guest(sb, raw, addr, len) < 0) return -EFAULT;
    sa_family_t family;
    if (len < sizeof family) return -EINVAL;
    memcpy(&family, raw, sizeof family);
    if (family != AF_UNIX) return -EINVAL;
    if (len == sizeof family && autobind_ok) { *out_len = 0; return 0; }
    if (len <= sizeof family || len > SUN_LEN_MAX) return -EINVAL;
    memset(out, 0, ZB_USOCK_NAME_MAX);
    memcpy(out, raw, len);
    *path = NULL;
    if (out[2] == 0) { *out_len = (uint32_t)len; return 0; } /* abstract: every byte counts */
    size_t n = strnlen((const char *)out + 2, len - 2);
    out[2 + n] = 0; /* within out: n <= 108 */
    *out_len = (uint32_t)(2 + n + 1);
    *path = (const char *)out + 2;
    return 0;
}

zb_file *zb_usock_find(zb_sandbox *sb, int (*fn)(const zb_usock *, const void *), const void *arg) {
    int members = sb->fam ? sb->fam->count : 1;
    for (int m = 0; m < members; m++) {
        const zb_sandbox *p = sb->fam ? sb->fam->m[m].sb : sb;
        if (!p || !p->fds) continue;
        for (int i = 0; i < ZB_MAX_FDS; i++) {
            zb_file *f = p->fds->fd[i];
            const zb_usock *u = f && f->kind == FILE_SOCKET ? zb_usock_of(f) : NULL;
            if (u && fn(u, arg)) return f;
        }
    }
    return NULL;
}

typedef struct {
    uint64_t bind_id;
    const uint8_t *name;
    uint32_t len;
    int listening;
} named_query;

static int is_named(const zb_usock *u, const void *arg) {
    const named_query *q = arg;
    if (q->listening && u->state != ZB_USOCK_LISTENING) return 0;
    return q->bind_id ? u->bind_id == q->bind_id : (!u->bind_id && u->name_len == q->len && !memcmp(u->name, q->name, q->len));
}

/* The socket of sb's processes with this name: a path name's bind id, or else the abstract name's
 * bytes; only listening ones if listening. Looked up in every fd table of the family, so it is
 * always what is open now. */
static zb_file *find_named(zb_sandbox *sb, uint64_t bind_id, const uint8_t *name, uint32_t len, int listening) {
    const named_query q = {bind_id, name, len, listening};
    return zb_usock_find(sb, is_named, &q);
}

int zb_usock_listeners(const zb_sandbox *sb) {
    int n = 0;
    for (int i = 0; sb->fds && i < ZB_MAX_FDS; i++) n += zb_usock_listening(sb->fds->fd[i]);
    return n;
}

int zb_usock_listeners_waiting(const zb_sandbox *sb) {
    int n = 0;
    for (int i = 0; sb->fds && i < ZB_MAX_FDS; i++)
        n += zb_usock_listening(sb->fds->fd[i]) && zb_usock_of(sb->fds->fd[i])->npending > 0;
    return n;
}

/* f's socket state, made for a socketpair end (connected, unnamed) when it is bound. */
static zb_usock *usock_made(zb_file *f) {
    if (!f->priv) f->priv = usock_new(AF_UNIX, ZB_USOCK_CONNECTED);
    return f->priv;
}

static long sys_bind(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    uint8_t name[ZB_USOCK_NAME_MAX];
    uint32_t len;
    const char *path = NULL;
    int family = socket_family(f);
    if (family != AF_UNIX) {
        zb_usock *u = zb_usock_of(f);
        if ((err = zb_lo_read_addr(sb, family, a[1], a[2], name, &len)) < 0) return err;
        if (zb_lo_bound(u) || u->state != ZB_USOCK_UNCONNECTED) return -EINVAL;
        return zb_lo_bind(sb, u, name);
    }
    if ((err = read_addr(sb, a[1], a[2], 1, name, &len, &path)) < 0) return err;
    zb_usock *u = usock_made(f);
    if (!u) return -ENOMEM;
    if (u->name_len > sizeof(sa_family_t)) return len ? -EINVAL : 0; /* bound already (autobind: nothing to do) */
    if (!len) { /* autobind: an abstract name of five hex digits, as Linux picks one; ENOSPC after
                   AUTOBIND_TRIES names taken in a row (each try scans the family's fds) */
        memset(name, 0, sizeof name);
        name[0] = AF_UNIX;
        for (int tries = 0; tries < AUTOBIND_TRIES; tries++) {
            snprintf((char *)name + 3, 6, "%05x", (unsigned)(zb_usock_new_bind_id() & 0xfffff));
            if (!find_named(sb, 0, name, 8, 0)) { len = 8; break; }
        }
        if (!len) return -ENOSPC;
    } else if (path) {
        uint64_t id = zb_usock_new_bind_id();
        if ((err = zb_fs_mksock(sb, path, id)) < 0) return err;
        u->bind_id = id;
    } else if (find_named(sb, 0, name, len, 0)) {
        return -EADDRINUSE;
    }
    memcpy(u->name, name, len);
    u->name_len = len;
    return 0;
}

static long sys_listen(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    zb_usock *u = zb_usock_of(f);
    if (u && u->state == ZB_USOCK_UNCONNECTED && zb_lo_family(u) != AF_UNIX && !zb_lo_bound(u)) {
        uint8_t any[ZB_USOCK_NAME_MAX]; /* TCP's listen without bind: the wildcard, a free port */
        memcpy(any, u->name, sizeof any);
        if ((err = zb_lo_bind(sb, u, any)) < 0) return err;
    }
    if (!u || u->state == ZB_USOCK_CONNECTED || u->name_len <= sizeof(sa_family_t)) return -EINVAL;
    unsigned backlog = (unsigned)(int)a[1]; /* negative: the most, as Linux caps it at somaxconn */
    u->backlog = (int)ZB_MIN(backlog, (unsigned)ZB_USOCK_BACKLOG_MAX);
    u->state = ZB_USOCK_LISTENING;
    return 0;
}

/* The listener a guest address names: ENOENT for a missing path, ECONNREFUSED for a file that is
 * no socket (a host file too: the sandbox never connects to host sockets) or no listener. */
static long find_listener(zb_sandbox *sb, const uint8_t *name, uint32_t len, const char *path, zb_file **out) {
    uint64_t id = 0;
    if (path) {
        zb_resolved r;
        long rc = zb_fs_resolve(sb, sb->proc.cwd, path, 0, &r);
        if (rc < 0) return rc;
        if (!r.exists) return -ENOENT;
        const zb_inode *in = r.loc.kind == LOC_OVERLAY ? zb_ovl_peek(sb->fs, r.loc.ino) : NULL;
        if (!in || in->type != INO_SOCKET || !in->sock_id) return -ECONNREFUSED;
        id = in->sock_id;
    }
    *out = find_named(sb, id, name, len, 1);
    return *out ? 0 : -ECONNREFUSED;
}

static long sys_connect(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    zb_usock *u = zb_usock_of(f);
    if (!u || u->state == ZB_USOCK_CONNECTED) return -EISCONN;
    if (u->state == ZB_USOCK_LISTENING) return -EINVAL;
    uint8_t name[ZB_USOCK_NAME_MAX];
    uint32_t len;
    const char *path = NULL;
    zb_file *l;
    zb_conn_names names;
    int family = zb_lo_family(u);
    if (family != AF_UNIX) {
        if ((err = zb_lo_read_addr(sb, family, a[1], a[2], name, &len)) < 0 || (err = zb_lo_connect(sb, u, name, &l, &names)) < 0)
            return err;
    } else {
        if ((err = read_addr(sb, a[1], a[2], 0, name, &len, &path)) < 0 || (err = find_listener(sb, name, len, path, &l)) < 0)
            return err;
        const zb_usock *lu = zb_usock_of(l); /* the server's end is named as the listener */
        memcpy(names.own, u->name, names.own_len = u->name_len);
        memcpy(names.peer, lu->name, names.peer_len = lu->name_len);
        memcpy(names.server, lu->name, names.server_len = lu->name_len);
        memcpy(names.server_peer, u->name, names.server_peer_len = u->name_len);
    }
    zb_usock *lu = zb_usock_of(l);
    if (lu->npending > lu->backlog) return zb_io_would_block(sb, f, -EAGAIN, 1, 0, 1); /* its queue is full */
    /* the server's end, queued until accept: its peer this socket */
    zb_pipe *up = zb_pipe_new(), *down = zb_pipe_new();
    zb_file *s = zb_file_new(FILE_SOCKET);
    zb_usock *su = usock_new(AF_UNIX, ZB_USOCK_CONNECTED);
    if (!up || !down || !s || !su) { free(up); free(down); free(s); free(su); return -ENOMEM; }
    memcpy(su->name, names.server, su->name_len = names.server_len);
    memcpy(su->peer, names.server_peer, su->peer_len = names.server_peer_len);
    s->priv = su;
    s->flags = O_RDWR;
    zb_file_attach_tx(f, up);
    zb_file_attach_rx(s, up);
    zb_file_attach_tx(s, down);
    zb_file_attach_rx(f, down);
    u->state = ZB_USOCK_CONNECTED;
    memcpy(u->name, names.own, u->name_len = names.own_len);
    memcpy(u->peer, names.peer, u->peer_len = names.peer_len);
    lu->pending[lu->npending++] = s; /* the queue's reference */
    return 0;
}

/* Write an address to the guest's (addr, *lenp) as Linux does: at most *lenp bytes, and the
 * address's full length to *lenp. */
static long put_addr(zb_sandbox *sb, uint64_t addr, uint64_t lenp, const uint8_t *name, uint32_t len) {
    socklen_t have;
    if (zb_copy_from_guest(sb, &have, lenp, sizeof have) < 0) return -EFAULT;
    if ((int)have < 0) return -EINVAL;
    if (zb_copy_to_guest(sb, addr, name, ZB_MIN(have, len)) < 0 || zb_copy_to_guest(sb, lenp, &len, sizeof len) < 0) return -EFAULT;
    return 0;
}

static long sys_accept4(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if (a[3] & ~(uint64_t)(SOCK_NONBLOCK | SOCK_CLOEXEC)) return -EINVAL;
    zb_usock *u = zb_usock_of(f);
    if (!u || u->state != ZB_USOCK_LISTENING) return -EINVAL;
    if (!u->npending) return zb_io_would_block(sb, f, -EAGAIN, 0, 0, 0);
    zb_file *c = u->pending[0];
    const zb_usock *cu = zb_usock_of(c);
    if (a[1] && a[2]) { /* checked before the connection is taken too: a bad buffer loses nothing */
        socklen_t have;
        if (zb_copy_from_guest(sb, &have, a[2], sizeof have) < 0) return -EFAULT;
        if ((int)have < 0) return -EINVAL;
        if (!zb_guest_ptr(sb, a[1], ZB_MIN(have, cu->peer_len), 1) || !zb_guest_ptr(sb, a[2], sizeof have, 1)) return -EFAULT;
    }
    c->flags = O_RDWR | ((a[3] & SOCK_NONBLOCK) ? O_NONBLOCK : 0);
    c->refs++; /* the fd's reference: EMFILE drops it again, and the connection stays queued */
    int fd = zb_fd_install(sb, c, 0, (a[3] & SOCK_CLOEXEC) != 0);
    if (fd < 0) return fd;
    memmove(u->pending, u->pending + 1, (size_t)--u->npending * sizeof *u->pending);
    c->refs--; /* the queue's */
    if (a[1] && a[2]) put_addr(sb, a[1], a[2], cu->peer, cu->peer_len); /* validated above */
    return fd;
}
static long sys_accept(zb_sandbox *sb, const uint64_t a[6]) {
    const uint64_t b[6] = {a[0], a[1], a[2], 0, 0, 0};
    return sys_accept4(sb, b);
}

/* getsockname / getpeername (peer): a socketpair end is unnamed, and so is its peer. */
static long socket_address(zb_sandbox *sb, const uint64_t a[6], int peer) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    static const uint8_t unnamed[2] = {AF_UNIX, 0};
    const zb_usock *u = zb_usock_of(f);
    if (!u) return put_addr(sb, a[1], a[2], unnamed, sizeof unnamed);
    if (peer && u->state != ZB_USOCK_CONNECTED) return -ENOTCONN;
    return peer ? put_addr(sb, a[1], a[2], u->peer, u->peer_len) : put_addr(sb, a[1], a[2], u->name, u->name_len);
}
static long sys_getsockname(zb_sandbox *sb, const uint64_t a[6]) { return socket_address(sb, a, 0); }
static long sys_getpeername(zb_sandbox *sb, const uint64_t a[6]) { return socket_address(sb, a, 1); }

void zb_sys_socket_register(zb_syscall_fn *t) {
    t[SYS_socket] = sys_socket;
    t[SYS_socketpair] = sys_socketpair;
    t[SYS_sendto] = sys_sendto;
    t[SYS_recvfrom] = sys_recvfrom;
    t[SYS_sendmsg] = sys_sendmsg;
    t[SYS_recvmsg] = sys_recvmsg;
    t[SYS_shutdown] = sys_shutdown;
    t[SYS_getsockopt] = sys_getsockopt;
    t[SYS_setsockopt] = sys_setsockopt;
    t[SYS_getsockname] = sys_getsockname;
    t[SYS_getpeername] = sys_getpeername;
    t[SYS_connect] = sys_connect;
    t[SYS_bind] = sys_bind;
    t[SYS_listen] = sys_listen;
    t[SYS_accept] = sys_accept;
    t[SYS_accept4] = sys_accept4;
}
