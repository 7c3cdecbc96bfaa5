/* inet.h - the internet socket file kind (file_inet.c) as its syscalls (sys_inet.c) see it.
 *
 * A guest SOCK_STREAM socket of AF_INET/AF_INET6 is served by a host socket the engine creates
 * itself at connect time, after the policy (net.h) allowed the address; the host socket is always
 * non-blocking and a blocking guest call waits for it (interruptibly: kicks, deadlines, alarms).
 * A SOCK_DGRAM socket only talks to the sandbox's resolver: its datagrams are answered in the
 * engine (net_dns.c) and queued, with no host socket at all.
 * A host connection cannot be copied: a snapshot's (a checkpoint's, a template's) or a fork's copy
 * of a connected socket is reset (reads ECONNRESET, writes EPIPE); the live sandbox keeps its own.
 */
#ifndef ZB_INET_H
#define ZB_INET_H
#include "fs.h"
#include "net.h"

#include <sys/socket.h>

enum { INET_NEW = 0, INET_CONNECTING, INET_CONNECTED, INET_RESET };

#define ZB_INET_MAX_OPTS 16
#define ZB_INET_DGRAM_QUEUE 4
#define ZB_INET_DGRAM_MAX 512

typedef struct zb_inet_opt {  /* an option set before the host socket existed */
    int level, name;
    socklen_t len;
    uint8_t value[16];
} zb_inet_opt;

typedef struct zb_inet {
    int family;              /* AF_INET or AF_INET6 */
    int type;                /* SOCK_STREAM or SOCK_DGRAM (the resolver only) */
    int fd;                  /* the host socket (streams, once connecting), else -1 */
    int state;               /* INET_* */
    int error;               /* a pending SO_ERROR (positive errno) */
    int shut_rd, shut_wr;
    zb_net_addr peer;
    int peer_port;
    zb_inet_opt opts[ZB_INET_MAX_OPTS];
    int nopts;
    /* SO_RCVTIMEO / SO_SNDTIMEO as the guest set them (0: none): a blocking recv (send, connect)
     * that waited this long with nothing transferred answers EAGAIN (EINPROGRESS for connect) */
    int64_t rcv_timeout_ns, snd_timeout_ns;
    /* SOCK_DGRAM: a host DNS lookup under way (lfd >= 0: a non-blocking UDP socket connected to
     * the upstream server, the query's id, when it was sent, the guest's question), then the
     * resolver's answers not read yet */
    int lfd;
    uint16_t lid;
    int64_t lstart;
    zb_dns_question lq;
    int nq;
    uint16_t qlen[ZB_INET_DGRAM_QUEUE];
    uint8_t q[ZB_INET_DGRAM_QUEUE][ZB_INET_DGRAM_MAX];
} zb_inet;

static inline zb_inet *zb_inet_of(const zb_file *f) { return f->priv; }
/* A new unconnected socket file (no host socket yet), or NULL. */
zb_file *zb_inet_new(int family, int type);
/* Connect the stream to an address the policy allowed: creates the host socket, applies the
 * options set so far, and waits for the connection unless the file is O_NONBLOCK (EINPROGRESS). */
long zb_inet_connect(zb_sandbox *sb, zb_file *f, const struct sockaddr *sa, socklen_t salen);
/* Send or receive over the host socket (iov: host pointers the caller validated; n <= 1024):
 * a blocking file waits only while nothing was transferred. */
long zb_inet_send(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags);
long zb_inet_recv(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags);
/* SOCK_DGRAM: a query to the resolver (answered and queued at once, or sent on to the host's DNS
 * server without waiting), and the next answer (a blocking socket waits for a lookup under way,
 * at most ZB_NET_LOOKUP_TIMEOUT_NS after it was sent, then SERVFAIL). */
long zb_inet_dgram_send(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n);
long zb_inet_dgram_recv(zb_sandbox *sb, zb_file *f, const struct iovec *iov, int n, int flags);
/* A connect under way finished? (No wait; a failure leaves its errno for SO_ERROR.) */
void zb_inet_settle(zb_inet *s);
/* A line for the user (the cell's stderr, at most 20 per session) and the sandbox log. */
void zb_inet_note(zb_sandbox *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
