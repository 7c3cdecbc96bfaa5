/* sys_socket.c - sockets: connected AF_UNIX stream pairs inside the sandbox, and no network.
 *
 * socketpair(AF_UNIX, SOCK_STREAM) is what asyncio's event loop (its self-pipe) and other
 * in-process plumbing need, so it works: each end reads the stream its peer writes (two zb_pipe
 * buffers), with send/recv, sendmsg/recvmsg, shutdown, MSG_PEEK and the usual socket options.
 * The sandbox has no network and no socket files: socket() fails with EACCES (logged once, so
 * the notebook's log says why), and a socket never connects, binds or listens. The socket file
 * kind itself (reading, writing, readiness) is file_socket.c.
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>

#define MAX_IOV 1024

static zb_file *socket_file(zb_sandbox *sb, uint64_t fd, long *err) {
    zb_file *f = zb_fd_get(sb, fd);
    *err = !f ? -EBADF : f->kind != FILE_SOCKET ? -ENOTSOCK : 0;
    return *err ? NULL : f;
}

static long sys_socket(zb_sandbox *sb, const uint64_t a[6]) {
    int domain = (int)a[0];
    if (!sb->logged_no_network++)
        zb_log(sb, "socket(domain %d) refused with EACCES: the sandbox has no network (only socketpair() works)", domain);
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

/* MSG_PEEK: copy queued bytes from `skip` on, leaving them queued. */
static long peek(zb_file *f, uint8_t *p, size_t n, size_t skip) {
    const zb_pipe *pp = f->rx;
    if (!pp || skip >= pp->len) return !pp || !pp->writers || skip ? 0 : -EAGAIN;
    n = ZB_MIN(n, pp->len - skip);
    memcpy(p, zb_pipe_bytes(pp) + skip, n);
    return (long)n;
}

/* Move bytes between the guest's iovecs and the socket, stopping at the first short transfer. */
static long transfer(zb_sandbox *sb, zb_file *f, const struct iovec *iov, uint64_t cnt, int is_send, int peeking) {
    long total = 0;
    for (uint64_t i = 0; i < cnt; i++) {
        size_t len = iov[i].iov_len;
        if (!len) continue;
        uint8_t *p = zb_guest_ptr(sb, (uint64_t)(uintptr_t)iov[i].iov_base, len, !is_send);
        if (!p) return total ? total : -EFAULT;
        long r = is_send ? f->ops->write(sb, f, p, len, -1) : peeking ? peek(f, p, len, (size_t)total) : f->ops->read(sb, f, p, len, -1);
        if (r < 0) return total ? total : r;
        total += r;
        if ((size_t)r < len) break;
    }
    return total;
}

static long sys_sendto(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if ((err = check_send_flags(a[3]))) return err;
    if (a[4]) return -EISCONN;
    struct iovec iov = {(void *)(uintptr_t)a[1], (size_t)a[2]};
    return zb_io_would_block(sb, f, transfer(sb, f, &iov, 1, 1, 0), 1, (a[3] & MSG_DONTWAIT) != 0, (a[3] & MSG_NOSIGNAL) != 0);
}

static long sys_recvfrom(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if ((err = check_recv_flags(a[3]))) return err;
    struct iovec iov = {(void *)(uintptr_t)a[1], (size_t)a[2]};
    long r = zb_io_would_block(sb, f, transfer(sb, f, &iov, 1, 0, (a[3] & MSG_PEEK) != 0), 0, (a[3] & MSG_DONTWAIT) != 0, 0);
    if (r >= 0 && a[4] && a[5]) { /* a connected stream socket reports no source address */
        socklen_t zero = 0;
        if (zb_copy_to_guest(sb, a[5], &zero, sizeof zero) < 0) return -EFAULT;
    }
    return r;
}

/* sendmsg/recvmsg: the iovecs of a struct msghdr; no ancillary data (no fd passing). */
static long msg_io(zb_sandbox *sb, const uint64_t a[6], int is_send) {
    long err;
    zb_file *f = socket_file(sb, a[0], &err);
    if (!f) return err;
    if ((err = is_send ? check_send_flags(a[2]) : check_recv_flags(a[2]))) return err;
    struct msghdr m;
    if (zb_copy_from_guest(sb, &m, a[1], sizeof m) < 0) return -EFAULT;
    if (m.msg_iovlen > MAX_IOV) return -EMSGSIZE;
    if (is_send && m.msg_name) return -EISCONN;
    if (is_send && m.msg_controllen) {
        zb_log(sb, "sendmsg with ancillary data (e.g. passing fds) is not supported");
        return -EOPNOTSUPP;
    }
    struct iovec iov[MAX_IOV];
    if (m.msg_iovlen && zb_copy_from_guest(sb, iov, (uint64_t)(uintptr_t)m.msg_iov, m.msg_iovlen * sizeof *iov) < 0) return -EFAULT;
    long r = zb_io_would_block(sb, f, transfer(sb, f, iov, m.msg_iovlen, is_send, !is_send && (a[2] & MSG_PEEK)), is_send,
                               (a[2] & MSG_DONTWAIT) != 0, (a[2] & MSG_NOSIGNAL) != 0);
    if (r >= 0 && !is_send) {
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
        if (zb_copy_to_guest(sb, a[1], &m, sizeof m) < 0) return -EFAULT;
    }
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
    if (a[1] != SOL_SOCKET) return -EOPNOTSUPP;
    int v;
    switch (a[2]) {
    case SO_TYPE: v = SOCK_STREAM; break;
    case SO_DOMAIN: v = AF_UNIX; break;
    case SO_PROTOCOL: case SO_ERROR: case SO_ACCEPTCONN: case SO_REUSEADDR: case SO_KEEPALIVE: v = 0; break;
    case SO_RCVBUF: case SO_SNDBUF: v = (int)ZB_STREAM_CAP; break;
    default: return -ENOPROTOOPT;
    }
    socklen_t len;
    if (zb_copy_from_guest(sb, &len, a[4], sizeof len) < 0) return -EFAULT;
    if ((int)len < 0) return -EINVAL;
    len = ZB_MIN(len, (socklen_t)sizeof v);
    if (zb_copy_to_guest(sb, a[3], &v, len) < 0 || zb_copy_to_guest(sb, a[4], &len, sizeof len) < 0) return -EFAULT;
    return 0;
}

/* Buffer sizes, keep-alive and the like have no effect on an in-memory stream: accepted. */
static long sys_setsockopt(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    if (!socket_file(sb, a[0], &err)) return err;
    if (a[1] != SOL_SOCKET) return -ENOPROTOOPT;
    if (a[4] < sizeof(int) && a[2] != SO_BINDTODEVICE) return -EINVAL;
    return 0;
}

/* Both ends of a socketpair are unnamed: the address is just the family. */
static long unnamed_address(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    if (!socket_file(sb, a[0], &err)) return err;
    socklen_t len;
    if (zb_copy_from_guest(sb, &len, a[2], sizeof len) < 0) return -EFAULT;
    if ((int)len < 0) return -EINVAL;
    sa_family_t family = AF_UNIX;
    socklen_t full = sizeof family;
    if (zb_copy_to_guest(sb, a[1], &family, ZB_MIN(len, full)) < 0 || zb_copy_to_guest(sb, a[2], &full, sizeof full) < 0) return -EFAULT;
    return 0;
}

/* Connecting, binding, listening and accepting need a network or socket files; a socketpair end
 * is already connected. */
static long sys_connect(zb_sandbox *sb, const uint64_t a[6]) { long err; return socket_file(sb, a[0], &err) ? -EISCONN : err; }
static long sys_bind(zb_sandbox *sb, const uint64_t a[6]) { long err; return socket_file(sb, a[0], &err) ? -EINVAL : err; }
static long sys_listen(zb_sandbox *sb, const uint64_t a[6]) { long err; return socket_file(sb, a[0], &err) ? -EINVAL : err; }
static long sys_accept(zb_sandbox *sb, const uint64_t a[6]) { long err; return socket_file(sb, a[0], &err) ? -EINVAL : err; }

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
    t[SYS_getsockname] = unnamed_address;
    t[SYS_getpeername] = unnamed_address;
    t[SYS_connect] = sys_connect;
    t[SYS_bind] = sys_bind;
    t[SYS_listen] = sys_listen;
    t[SYS_accept] = sys_accept;
    t[SYS_accept4] = sys_accept;
}
