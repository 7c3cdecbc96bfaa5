/* sys_inet.c - the socket syscalls of internet sockets (file_inet.c), for a session with a network
 * policy (net.h). Without one nothing here applies: socket() stays sys_socket.c's EACCES.
 *
 * zb_sys_inet_register runs after zb_sys_socket_register and wraps its handlers: a call on an
 * internet socket is served here, any other goes on to sys_socket.c (socketpair ends, EBADF,
 * ENOTSOCK). Every guest address is copied and checked (family, length) before use, every buffer
 * validated with zb_guest_ptr, iovec counts bounded. connect asks the policy (zb_net_check) and a
 * refusal is EACCES with a note in the cell's output saying which address and how to allow it.
 * bind, listen and accept are EACCES: the sandbox runs no servers.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "sandbox_state.h"
#include "inet.h"
#include "linux.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/syscall.h>

#define MAX_IOV 1024
#define SEND_MAX (64ul << 20) /* bytes of one send/recv call (a short transfer beyond, as Linux may) */

enum { P_SOCKET, P_CONNECT, P_SENDTO, P_RECVFROM, P_SENDMSG, P_RECVMSG, P_SHUTDOWN, P_GETSOCKOPT, P_SETSOCKOPT,
       P_GETSOCKNAME, P_GETPEERNAME, P_BIND, P_LISTEN, P_ACCEPT, P_ACCEPT4, P_COUNT };
static zb_syscall_fn prev[P_COUNT]; /* sys_socket.c's handlers, for every other file */

static zb_file *inet_file(zb_sandbox *sb, uint64_t fd) {
    zb_file *f = zb_fd_get(sb, fd);
    return f && f->kind == FILE_INET ? f : NULL;
}

static long sys_socket(zb_sandbox *sb, const uint64_t a[6]) {
    int domain = (int)a[0], type = (int)a[1] & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), proto = (int)a[2];
    if ((domain != AF_INET && domain != AF_INET6) || !sb->engine->net) return prev[P_SOCKET](sb, a);
    if (a[1] & ~(uint64_t)(0xf | SOCK_NONBLOCK | SOCK_CLOEXEC)) return -EINVAL;
    if (!((type == SOCK_STREAM && (!proto || proto == IPPROTO_TCP)) || (type == SOCK_DGRAM && (!proto || proto == IPPROTO_UDP)))) {
        zb_log(sb, "socket(%d, type %d, protocol %d) refused with EACCES: only TCP streams (and UDP to the "
               "sandbox's resolver) are served", domain, type, proto);
        return -EACCES;
    }
    zb_file *f = zb_inet_new(domain, type);
    if (!f) return -ENOMEM;
    if (a[1] & SOCK_NONBLOCK) f->flags |= O_NONBLOCK;
    return zb_fd_install(sb, f, 0, (a[1] & SOCK_CLOEXEC) != 0);
}

/* The guest's sockaddr for socket s: the policy's view (v4-mapped v6 as v4) and the host's copy. */
static long read_addr(zb_sandbox *sb, const zb_inet *s, uint64_t uaddr, uint64_t ulen, zb_net_addr *addr, int *port,
                      struct sockaddr_storage *host, socklen_t *hostlen) {
    if (ulen < sizeof(sa_family_t) || ulen > sizeof *host) return -EINVAL;
    memset(host, 0, sizeof *host);
    if (zb_copy_from_guest(sb, host, uaddr, ulen) < 0) return -EFAULT;
    memset(addr, 0, sizeof *addr);
    if (s->family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)host;
        if (ulen < sizeof *in) return -EINVAL;
        if (in->sin_family != AF_INET) return -EAFNOSUPPORT;
        addr->family = AF_INET;
        memcpy(addr->b, &in->sin_addr, 4);
        *port = ntohs(in->sin_port);
        memset(in->sin_zero, 0, sizeof in->sin_zero);
        *hostlen = sizeof *in;
        return 0;
    }
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)host;
    if (ulen < 24) return -EINVAL; /* SIN6_LEN_RFC2133, as Linux */
    if (in6->sin6_family != AF_INET6) return -EAFNOSUPPORT;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(&in6->sin6_addr, mapped, 12)) {
        addr->family = AF_INET;
        memcpy(addr->b, (uint8_t *)&in6->sin6_addr + 12, 4);
    } else {
        addr->family = AF_INET6;
        memcpy(addr->b, &in6->sin6_addr, 16);
    }
    *port = ntohs(in6->sin6_port);
    in6->sin6_flowinfo = 0;
    *hostlen = sizeof *in6;
    return 0;
}

static int is_resolver(const zb_net_addr *a, int port) {
    uint32_t v4 = htonl(ZB_NET_RESOLVER_V4);
    return a->family == AF_INET && !memcmp(a->b, &v4, 4) && port == ZB_NET_RESOLVER_PORT;
}

static long refuse(zb_sandbox *sb, const char *why) {
    zb_net *net = sb->engine->net;
    if (net) net->stats.refused++;
    zb_inet_note(sb, "zeroboot: the network policy refused a connection (EACCES): %s", why);
    return -EACCES;
}

static long sys_connect(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[P_CONNECT](sb, a);
    zb_inet *s = zb_inet_of(f);
    zb_net *net = sb->engine->net;
    zb_net_addr addr;
    int port = 0;
    struct sockaddr_storage host;
    socklen_t hostlen = 0;
    long r = read_addr(sb, s, a[1], a[2], &addr, &port, &host, &hostlen);
    if (r < 0) return r;
    char text[INET6_ADDRSTRLEN + 8], why[640];
    zb_net_addr_text(&addr, port, text, sizeof text);
    if (s->type == SOCK_DGRAM) {
        if (!is_resolver(&addr, port)) {
            /* counted and logged, but no note in the cell: glibc's getaddrinfo connects a UDP
             * socket to each of several answers to sort them (RFC 6724), sending nothing; a
             * datagram actually sent elsewhere gets its note (dgram_dest) */
            if (net) net->stats.refused++;
            zb_log(sb, "connect of a UDP socket to %s refused with EACCES: datagrams go only to the sandbox's "
                   "resolver (192.0.2.53:53)", text);
            return -EACCES;
        }
        s->state = INET_CONNECTED;
        s->peer = addr;
        s->peer_port = port;
        return 0;
    }
    if (!net) return refuse(sb, "the session has no network policy any more");
    if (s->state == INET_NEW) {
        if (is_resolver(&addr, port) || (addr.family == AF_INET && addr.b[0] == 192 && addr.b[1] == 0 && addr.b[2] == 2 && addr.b[3] == 53)) {
            snprintf(why, sizeof why, "%s is the sandbox's resolver, which answers UDP queries only", text);
            return refuse(sb, why);
        }
        if (port == 0) return -ECONNREFUSED; /* as Linux for port 0 */
        if (zb_net_check(net, &addr, port, why, sizeof why) < 0) return refuse(sb, why);
        net->stats.connects++;
        s->peer = addr;
        s->peer_port = port;
    }
    return zb_inet_connect(sb, f, (struct sockaddr *)&host, hostlen);
}

static long check_send_flags(uint64_t flags) {
    return flags & ~(uint64_t)(MSG_DONTWAIT | MSG_NOSIGNAL | MSG_EOR | MSG_MORE) ? -EOPNOTSUPP : 0;
}

static long check_recv_flags(uint64_t flags) {
    return flags & ~(uint64_t)(MSG_DONTWAIT | MSG_PEEK | MSG_WAITALL | MSG_CMSG_CLOEXEC | MSG_TRUNC) ? -EOPNOTSUPP : 0;
}

/* Guest iovecs as host ones, each buffer validated; at most SEND_MAX bytes in all. */
static long host_iov(zb_sandbox *sb, const struct iovec *guest, uint64_t cnt, struct iovec *out, int write) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < cnt; i++) {
        size_t len = ZB_MIN(guest[i].iov_len, SEND_MAX - total);
        out[i].iov_len = len;
        out[i].iov_base = len ? zb_guest_ptr(sb, (uint64_t)(uintptr_t)guest[i].iov_base, len, write) : NULL;
        if (len && !out[i].iov_base) return -EFAULT;
        total += len;
    }
    return 0;
}

/* A destination given with a datagram: only the resolver. */
static long dgram_dest(zb_sandbox *sb, zb_inet *s, uint64_t uaddr, uint64_t ulen) {
    if (!uaddr) return s->state == INET_CONNECTED ? 0 : -EDESTADDRREQ;
    zb_net_addr addr;
    int port = 0;
    struct sockaddr_storage host;
    socklen_t hostlen;
    long r = read_addr(sb, s, uaddr, ulen, &addr, &port, &host, &hostlen);
    if (r < 0) return r;
    if (is_resolver(&addr, port)) return 0;
    char text[INET6_ADDRSTRLEN + 8], why[256];
    zb_net_addr_text(&addr, port, text, sizeof text);
    snprintf(why, sizeof why, "UDP to %s: datagrams go only to the sandbox's resolver (192.0.2.53:53)", text);
    return refuse(sb, why);
}

static long do_send(zb_sandbox *sb, zb_file *f, const struct iovec *iov, uint64_t cnt, uint64_t flags, uint64_t uaddr, uint64_t ulen) {
    zb_inet *s = zb_inet_of(f);
    long r = check_send_flags(flags);
    if (r < 0) return r;
    struct iovec hv[MAX_IOV];
    if ((r = host_iov(sb, iov, cnt, hv, 0)) < 0) return r;
    if (s->type == SOCK_DGRAM) {
        if ((r = dgram_dest(sb, s, uaddr, ulen)) < 0) return r;
        return zb_inet_dgram_send(sb, f, hv, (int)cnt);
    }
    return zb_inet_send(sb, f, hv, (int)cnt, (int)flags); /* a stream ignores a destination, as TCP does */
}

/* The source address of what was received: the resolver for datagrams, none for a stream. */
static long write_source(zb_sandbox *sb, const zb_inet *s, uint64_t uaddr, uint64_t ulenp) {
    if (!uaddr || !ulenp) return 0;
    socklen_t len;
    if (zb_copy_from_guest(sb, &len, ulenp, sizeof len) < 0) return -EFAULT;
    if ((int)len < 0) return -EINVAL;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t full = 0;
    if (s->type == SOCK_DGRAM) {
        if (s->family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            in->sin_family = AF_INET;
            in->sin_port = htons(ZB_NET_RESOLVER_PORT);
            in->sin_addr.s_addr = htonl(ZB_NET_RESOLVER_V4);
            full = sizeof *in;
        } else {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            in6->sin6_family = AF_INET6;
            in6->sin6_port = htons(ZB_NET_RESOLVER_PORT);
            uint32_t v4 = htonl(ZB_NET_RESOLVER_V4);
            ((uint8_t *)&in6->sin6_addr)[10] = ((uint8_t *)&in6->sin6_addr)[11] = 0xff;
            memcpy((uint8_t *)&in6->sin6_addr + 12, &v4, 4);
            full = sizeof *in6;
        }
    }
    if ((full && zb_copy_to_guest(sb, uaddr, &ss, ZB_MIN(len, full)) < 0) || zb_copy_to_guest(sb, ulenp, &full, sizeof full) < 0)
        return -EFAULT;
    return 0;
}

static long do_recv(zb_sandbox *sb, zb_file *f, const struct iovec *iov, uint64_t cnt, uint64_t flags) {
    long r = check_recv_flags(flags);
    if (r < 0) return r;
    struct iovec hv[MAX_IOV];
    if ((r = host_iov(sb, iov, cnt, hv, 1)) < 0) return r;
    if (zb_inet_of(f)->type == SOCK_DGRAM) return zb_inet_dgram_recv(sb, f, hv, (int)cnt, (int)flags);
    return zb_inet_recv(sb, f, hv, (int)cnt, (int)flags);
}

static long sys_sendto(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[P_SENDTO](sb, a);
    struct iovec iov = {(void *)(uintptr_t)a[1], (size_t)a[2]};
    return do_send(sb, f, &iov, 1, a[3], a[4], a[5]);
}

static long sys_recvfrom(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[P_RECVFROM](sb, a);
    struct iovec iov = {(void *)(uintptr_t)a[1], (size_t)a[2]};
    long r = do_recv(sb, f, &iov, 1, a[3]);
    if (r >= 0) {
        long w = write_source(sb, zb_inet_of(f), a[4], a[5]);
        if (w < 0) return w;
    }
    return r;
}

static long msg_io(zb_sandbox *sb, zb_file *f, const uint64_t a[6], int is_send) {
    struct msghdr m;
    if (zb_copy_from_guest(sb, &m, a[1], sizeof m) < 0) return -EFAULT;
    if (m.msg_iovlen > MAX_IOV) return -EMSGSIZE;
    if (is_send && m.msg_controllen) {
        zb_log(sb, "sendmsg with ancillary data is not supported on internet sockets");
        return -EOPNOTSUPP;
    }
    struct iovec iov[MAX_IOV];
    if (m.msg_iovlen && zb_copy_from_guest(sb, iov, (uint64_t)(uintptr_t)m.msg_iov, m.msg_iovlen * sizeof *iov) < 0) return -EFAULT;
    if (is_send) return do_send(sb, f, iov, m.msg_iovlen, a[2], (uint64_t)(uintptr_t)m.msg_name, m.msg_namelen);
    long r = do_recv(sb, f, iov, m.msg_iovlen, a[2]);
    if (r < 0) return r;
    socklen_t namelen = 0;
    if (m.msg_name && zb_inet_of(f)->type == SOCK_DGRAM) {
        uint64_t lenp = a[1] + offsetof(struct msghdr, msg_namelen);
        long w = write_source(sb, zb_inet_of(f), (uint64_t)(uintptr_t)m.msg_name, lenp);
        if (w < 0) return w;
        if (zb_copy_from_guest(sb, &namelen, lenp, sizeof namelen) < 0) return -EFAULT;
    }
    m.msg_namelen = namelen;
    m.msg_controllen = 0;
    m.msg_flags = 0;
    if (zb_copy_to_guest(sb, a[1], &m, sizeof m) < 0) return -EFAULT;
    return r;
}

static long sys_sendmsg(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    return f ? msg_io(sb, f, a, 1) : prev[P_SENDMSG](sb, a);
}

static long sys_recvmsg(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    return f ? msg_io(sb, f, a, 0) : prev[P_RECVMSG](sb, a);
}

static long sys_shutdown(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[P_SHUTDOWN](sb, a);
    zb_inet *s = zb_inet_of(f);
    if (a[1] != SHUT_RD && a[1] != SHUT_WR && a[1] != SHUT_RDWR) return -EINVAL;
    if (s->state != INET_CONNECTED) return -ENOTCONN;
    if (s->fd >= 0 && shutdown(s->fd, (int)a[1]) < 0) return -errno;
    if (a[1] != SHUT_WR) s->shut_rd = 1;
    if (a[1] != SHUT_RD) s->shut_wr = 1;
    return 0;
}

/* The options a client library sets (requests/urllib3, asyncio, TLS clients): applied to the host
 * socket, or kept until it exists. Their values are ints but SO_LINGER's struct linger. */
static int option_known(int level, int name) {
    switch (level) {
    case SOL_SOCKET:
        return name == SO_KEEPALIVE || name == SO_REUSEADDR || name == SO_REUSEPORT || name == SO_RCVBUF ||
               name == SO_SNDBUF || name == SO_LINGER || name == SO_OOBINLINE || name == SO_PRIORITY ||
               name == SO_RCVLOWAT || name == SO_BROADCAST;
    case IPPROTO_TCP:
        return name == TCP_NODELAY || name == TCP_KEEPIDLE || name == TCP_KEEPINTVL || name == TCP_KEEPCNT ||
               name == TCP_USER_TIMEOUT || name == TCP_QUICKACK || name == TCP_CORK || name == TCP_MAXSEG ||
               name == TCP_NOTSENT_LOWAT;
    case IPPROTO_IP: /* IP_RECVERR: glibc's resolver sets it on its UDP socket */
        return name == IP_TOS || name == IP_TTL || name == IP_RECVERR || name == IP_MTU_DISCOVER;
    case IPPROTO_IPV6:
        return name == IPV6_V6ONLY || name == IPV6_TCLASS || name == IPV6_UNICAST_HOPS || name == IPV6_RECVERR ||
               name == IPV6_MTU_DISCOVER;
    default: return 0;
    }
}

static long sys_setsockopt(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[P_SETSOCKOPT](sb, a);
    zb_inet *s = zb_inet_of(f);
    int level = (int)a[1], name = (int)a[2];
    uint64_t len = a[4];
    if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO || name == SO_RCVTIMEO_NEW || name == SO_SNDTIMEO_NEW)) {
        /* struct timeval (_OLD) and struct __kernel_sock_timeval (_NEW) are both two s64 here;
         * Linux's sock_set_timeout: a usec out of range is EDOM, a negative time or 0 is none */
        int64_t tv[2];
        if (len < sizeof tv) return -EINVAL;
        if (zb_copy_from_guest(sb, tv, a[3], sizeof tv) < 0) return -EFAULT;
        if (tv[1] < 0 || tv[1] >= 1000000) return -EDOM;
        int64_t ns = tv[0] < 0 ? 0 : tv[0] >= (int64_t)1 << 32 ? INT64_MAX / 4 : tv[0] * 1000000000 + tv[1] * 1000;
        if (name == SO_RCVTIMEO || name == SO_RCVTIMEO_NEW) s->rcv_timeout_ns = ns;
        else s->snd_timeout_ns = ns;
        return 0;
    }
    if (!option_known(level, name)) return -ENOPROTOOPT;
    size_t need = level == SOL_SOCKET && name == SO_LINGER ? sizeof(struct linger) : sizeof(int);
    if (len < need) return -EINVAL;
    zb_inet_opt o = {.level = level, .name = name, .len = (socklen_t)need};
    if (zb_copy_from_guest(sb, o.value, a[3], need) < 0) return -EFAULT;
    if (s->type == SOCK_DGRAM) return 0; /* nothing to apply them to */
    if (s->fd >= 0 && setsockopt(s->fd, level, name, o.value, o.len) < 0) return -errno;
    int i = 0;
    while (i < s->nopts && (s->opts[i].level != level || s->opts[i].name != name)) i++;
    if (i == ZB_INET_MAX_OPTS) return -ENOMEM;
    s->opts[i] = o;
    if (i == s->nopts) s->nopts++;
    return 0;
}

static long sys_getsockopt(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[P_GETSOCKOPT](sb, a);
    zb_inet *s = zb_inet_of(f);
    int level = (int)a[1], name = (int)a[2];
    uint8_t value[16];
    memset(value, 0, sizeof value);
    socklen_t vlen = sizeof(int);
    int v = 0;
    if (level == SOL_SOCKET && name == SO_ERROR) {
        zb_inet_settle(s); /* a connect under way may have finished: its error is the answer */
        if (!s->error && s->fd >= 0 && s->state == INET_CONNECTED) {
            socklen_t l = sizeof v;
            if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &v, &l) < 0) v = 0;
        } else {
            v = s->error;
            s->error = 0;
        }
        memcpy(value, &v, sizeof v);
    } else if (level == SOL_SOCKET && (name == SO_TYPE || name == SO_DOMAIN || name == SO_PROTOCOL || name == SO_ACCEPTCONN)) {
        v = name == SO_TYPE ? s->type : name == SO_DOMAIN ? s->family : name == SO_ACCEPTCONN ? 0
            : s->type == SOCK_STREAM ? IPPROTO_TCP : IPPROTO_UDP;
        memcpy(value, &v, sizeof v);
    } else if (option_known(level, name) || (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO ||
                                                                      name == SO_RCVTIMEO_NEW || name == SO_SNDTIMEO_NEW))) {
        if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO || name == SO_RCVTIMEO_NEW || name == SO_SNDTIMEO_NEW)) {
            int64_t ns = name == SO_RCVTIMEO || name == SO_RCVTIMEO_NEW ? s->rcv_timeout_ns : s->snd_timeout_ns;
            int64_t tv[2] = {ns / 1000000000, ns % 1000000000 / 1000}; /* struct timeval; zero: none */
            vlen = sizeof tv;
            memcpy(value, tv, sizeof tv);
        } else if (s->fd >= 0) {
            vlen = sizeof value;
            if (getsockopt(s->fd, level, name, value, &vlen) < 0) return -errno;
        } else {
            int i = 0;
            while (i < s->nopts && (s->opts[i].level != level || s->opts[i].name != name)) i++;
            if (i < s->nopts) {
                vlen = s->opts[i].len;
                memcpy(value, s->opts[i].value, vlen);
            } else if (level == SOL_SOCKET && name == SO_LINGER) {
                vlen = sizeof(struct linger);
            } else {
                v = level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_SNDBUF) ? 131072 : 0;
                memcpy(value, &v, sizeof v);
            }
        }
    } else {
        return -ENOPROTOOPT;
    }
    socklen_t len;
    if (zb_copy_from_guest(sb, &len, a[4], sizeof len) < 0) return -EFAULT;
    if ((int)len < 0) return -EINVAL;
    len = ZB_MIN(len, vlen);
    if (zb_copy_to_guest(sb, a[3], value, len) < 0 || zb_copy_to_guest(sb, a[4], &len, sizeof len) < 0) return -EFAULT;
    return 0;
}

static long write_name(zb_sandbox *sb, const struct sockaddr_storage *ss, socklen_t full, uint64_t uaddr, uint64_t ulenp) {
    socklen_t len;
    if (zb_copy_from_guest(sb, &len, ulenp, sizeof len) < 0) return -EFAULT;
    if ((int)len < 0) return -EINVAL;
    if (zb_copy_to_guest(sb, uaddr, ss, ZB_MIN(len, full)) < 0 || zb_copy_to_guest(sb, ulenp, &full, sizeof full) < 0) return -EFAULT;
    return 0;
}

static long socket_name(zb_sandbox *sb, const uint64_t a[6], int peer) {
    zb_file *f = inet_file(sb, a[0]);
    if (!f) return prev[peer ? P_GETPEERNAME : P_GETSOCKNAME](sb, a);
    zb_inet *s = zb_inet_of(f);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t full = s->family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    if (s->fd >= 0 && s->state == INET_CONNECTED) {
        socklen_t l = sizeof ss;
        if ((peer ? getpeername(s->fd, (struct sockaddr *)&ss, &l) : getsockname(s->fd, (struct sockaddr *)&ss, &l)) < 0) return -errno;
        full = l;
    } else if (peer && s->state == INET_CONNECTED) { /* a datagram socket connected to the resolver */
        return write_source(sb, s, a[1], a[2]);
    } else if (peer) {
        return -ENOTCONN;
    } else {
        ss.ss_family = (sa_family_t)s->family; /* unbound: the wildcard address, port 0 */
    }
    return write_name(sb, &ss, full, a[1], a[2]);
}

static long sys_getsockname(zb_sandbox *sb, const uint64_t a[6]) { return socket_name(sb, a, 0); }
static long sys_getpeername(zb_sandbox *sb, const uint64_t a[6]) { return socket_name(sb, a, 1); }

static long no_servers(zb_sandbox *sb, const char *call) {
    zb_log(sb, "%s refused with EACCES: the sandbox may connect out (ZEROBOOT_NETWORK) but runs no servers", call);
    return -EACCES;
}

static long sys_bind(zb_sandbox *sb, const uint64_t a[6]) { return inet_file(sb, a[0]) ? no_servers(sb, "bind") : prev[P_BIND](sb, a); }
static long sys_listen(zb_sandbox *sb, const uint64_t a[6]) { return inet_file(sb, a[0]) ? no_servers(sb, "listen") : prev[P_LISTEN](sb, a); }
static long sys_accept(zb_sandbox *sb, const uint64_t a[6]) { return inet_file(sb, a[0]) ? no_servers(sb, "accept") : prev[P_ACCEPT](sb, a); }
static long sys_accept4(zb_sandbox *sb, const uint64_t a[6]) { return inet_file(sb, a[0]) ? no_servers(sb, "accept4") : prev[P_ACCEPT4](sb, a); }

void zb_sys_inet_register(zb_syscall_fn *t) {
    static const struct { int p; int nr; zb_syscall_fn fn; } wraps[] = {
        {P_SOCKET, SYS_socket, sys_socket}, {P_CONNECT, SYS_connect, sys_connect}, {P_SENDTO, SYS_sendto, sys_sendto},
        {P_RECVFROM, SYS_recvfrom, sys_recvfrom}, {P_SENDMSG, SYS_sendmsg, sys_sendmsg}, {P_RECVMSG, SYS_recvmsg, sys_recvmsg},
        {P_SHUTDOWN, SYS_shutdown, sys_shutdown}, {P_GETSOCKOPT, SYS_getsockopt, sys_getsockopt},
        {P_SETSOCKOPT, SYS_setsockopt, sys_setsockopt}, {P_GETSOCKNAME, SYS_getsockname, sys_getsockname},
        {P_GETPEERNAME, SYS_getpeername, sys_getpeername}, {P_BIND, SYS_bind, sys_bind}, {P_LISTEN, SYS_listen, sys_listen},
        {P_ACCEPT, SYS_accept, sys_accept}, {P_ACCEPT4, SYS_accept4, sys_accept4},
    };
    for (size_t i = 0; i < sizeof wraps / sizeof wraps[0]; i++) {
        prev[wraps[i].p] = t[wraps[i].nr];
        t[wraps[i].nr] = wraps[i].fn;
    }
}
