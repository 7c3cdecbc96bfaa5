/* file_pty.c - pseudo-terminals: /dev/ptmx opens a master end (FILE_PTY_MASTER); TIOCGPTPEER on it
 * opens the slave end (FILE_PTY_SLAVE), which is what glibc's openpty/forkpty (os.openpty,
 * os.forkpty, pty.fork, pexpect) do. A pty is two streams (file_stream.c): input, master -> slave,
 * which holds the pty's state (zb_tty: termios, window size, index, lock, foreground group), and
 * output, slave -> master. So a pty is cloned, shared across fork and saved in snapshots as pipes
 * are (fdtable.c, fs_snapshot.c).
 *
 * The line discipline, as Linux's n_tty does it for what shells, coreutils, IPython and pexpect
 * use: input ICRNL/INLCR/IGNCR; ICANON (reads return whole lines, VERASE and VKILL edit the line
 * being typed, VEOF ends a read); ECHO, ECHOE, ECHOCTL, ECHONL; ISIG (VINTR, VQUIT and VSUSP signal
 * the foreground process group); output OPOST|ONLCR ("\n" -> "\r\n"). Not done: VMIN/VTIME (a raw
 * read returns what is there, as VMIN=1 VTIME=0), flow control (IXON), IUCLC/OLCUC and other
 * output delays, packet mode.
 * /dev/pts lists pty N as `N` while its master is open (with `ptmx`, mode 0000 as devpts has it);
 * opening /dev/pts/N opens another slave end as TIOCGPTPEER does (EIO while locked, ENOENT once the
 * master closed). A slave's fstat is its /dev/pts/N's stat (same st_dev, st_ino, st_rdev 136:N) and
 * a master's is /dev/ptmx's, so glibc's ttyname finds the name by scanning /dev/pts then /dev (the
 * guest has no /proc/self/fd for its first try). Opening a slave end without O_NOCTTY, either way,
 * makes it the controlling terminal of a session leader that has none, as Linux's tty_open does.
 * Closing: the slave's read after the master closed is EOF and its write EIO; the master's read
 * with no slave open and nothing queued is EIO (POLLHUP), as in Linux. The exit of the session
 * leader whose controlling terminal a pty is sends SIGHUP to the pty's foreground group.
 * Everything is bounded: a stream holds at most ZB_STREAM_CAP bytes (a full one makes writes wait
 * or EAGAIN), a sandbox has at most ZB_PTY_MAX ptys, each ioctl's guest pointer is copied through
 * zb_copy_from/to_guest.
 */
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>

/* the kernel's termios bits (asm/termbits.h; glibc's <termios.h> has the same values) */
#define T_IGNCR 0000200
#define T_INLCR 0000100
#define T_ICRNL 0000400
#define T_IXON 0002000
#define T_OPOST 0000001
#define T_ONLCR 0000004
#define T_CS8 0000060
#define T_CREAD 0000200
#define T_HUPCL 0002000
#define T_B38400 0000017
#define T_ISIG 0000001
#define T_ICANON 0000002
#define T_ECHO 0000010
#define T_ECHOE 0000020
#define T_ECHOK 0000040
#define T_ECHONL 0000100
#define T_NOFLSH 0000200
#define T_ECHOCTL 0001000
#define T_ECHOKE 0004000
#define T_IEXTEN 0100000
enum { C_VINTR = 0, C_VQUIT = 1, C_VERASE = 2, C_VKILL = 3, C_VEOF = 4, C_VTIME = 5, C_VMIN = 6,
       C_VSUSP = 10, C_VEOL = 11, C_VEOL2 = 16 };

/* struct termios (TCGETS) and struct termios2 (TCGETS2) as the kernel lays them out */
typedef struct {
    uint32_t iflag, oflag, cflag, lflag;
    uint8_t line, cc[ZB_TTY_NCCS];
} k_termios;
typedef struct {
    k_termios t;
    uint32_t ispeed, ospeed;
} k_termios2;
_Static_assert(sizeof(k_termios) == 36, "struct termios is 36 bytes");
_Static_assert(sizeof(k_termios2) == 44, "struct termios2 is 44 bytes");
typedef struct {
    uint16_t row, col, xpixel, ypixel;
} k_winsize;

#define NO_TCGETS2 0x802c542a
#define NO_TCSETS2 0x402c542b
#define NO_TCSETSW2 0x402c542c
#define NO_TCSETSF2 0x402c542d
#ifndef TIOCGPTPEER
#define TIOCGPTPEER 0x5441
#endif

static int is_master(const zb_file *f) { return f->kind == FILE_PTY_MASTER; }
static zb_pipe *input_of(const zb_file *f) { return is_master(f) ? f->tx : f->rx; }
static zb_pipe *output_of(const zb_file *f) { return is_master(f) ? f->rx : f->tx; }
static zb_tty *tty_of(const zb_file *f) { return input_of(f)->tty; }

static void tty_defaults(zb_tty *t, uint32_t index) {
    static const uint8_t cc[ZB_TTY_NCCS] = {003, 034, 0177, 025, 004, 0, 1, 0, 021, 023, 032, 0, 022, 017, 027, 026, 0};
    memset(t, 0, sizeof *t);
    t->iflag = T_ICRNL | T_IXON;
    t->oflag = T_OPOST | T_ONLCR;
    t->cflag = T_B38400 | T_CS8 | T_CREAD | T_HUPCL;
    t->lflag = T_ISIG | T_ICANON | T_ECHO | T_ECHOE | T_ECHOK | T_ECHOCTL | T_ECHOKE | T_IEXTEN;
    memcpy(t->cc, cc, sizeof cc);
    t->index = index;
    t->locked = 1; /* until unlockpt (TIOCSPTLCK 0), as /dev/ptmx opens them */
}

/* The calling process's member entry, or NULL (out of memory). */
static zb_member *caller(zb_sandbox *sb) {
    if (!sb->fam && !zb_family_ensure(sb)) return NULL;
    int i = zb_family_self(sb->fam, sb);
    return i >= 0 ? &sb->fam->m[i] : NULL;
}

/* sig to every live process of group pgrp (the terminal's foreground group). */
static void signal_group(zb_sandbox *sb, int32_t pgrp, int sig) {
    if (pgrp <= 0 || !sb->fam) return;
    for (int i = 0; i < sb->fam->count; i++) {
        zb_member *m = &sb->fam->m[i];
        if (m->zombie || !m->sb || m->pgid != pgrp) continue;
        if (m->sb == sb) sb->sig.pending |= ZB_SIG_BIT(sig);
        else zb_family_signal(sb->fam, i, sig);
    }
}

void zb_pty_session_leader_ends(zb_family *fam, int i) {
    const zb_member *leader = &fam->m[i];
    if (leader->pid != leader->sid) return; /* only a session leader is a controlling process */
    for (int k = 0; k < fam->count; k++) {
        const zb_member *holder = &fam->m[k];
        const zb_fdtable *t = holder->zombie || !holder->sb ? NULL : holder->sb->fds;
        for (int fd = 0; t && fd < ZB_MAX_FDS; fd++) {
            const zb_file *f = t->fd[fd];
            if (!f || (f->kind != FILE_PTY_MASTER && f->kind != FILE_PTY_SLAVE) || !input_of(f)) continue;
            zb_tty *tty = tty_of(f);
            if (!tty || tty->sid != leader->sid) continue;
            int32_t pgrp = tty->pgrp;
            tty->sid = tty->pgrp = 0; /* so each pty is hung up once */
            for (int j = 0; pgrp > 0 && j < fam->count; j++)
                if (j != i && fam->m[j].pgid == pgrp) zb_family_signal(fam, j, SIGHUP);
        }
    }
}

/* The fd tables of the sandbox's processes: table k of tables(sb), NULL for a process that ended
 * (its own table alone before it ever forked). */
static int tables(const zb_sandbox *sb) { return sb->fam ? sb->fam->count : 1; }
static const zb_fdtable *table(const zb_sandbox *sb, int k) {
    if (!sb->fam) return sb->fds;
    const zb_member *m = &sb->fam->m[k];
    return m->zombie || !m->sb ? NULL : m->sb->fds;
}

static int is_pty(const zb_file *f) {
    return f && (f->kind == FILE_PTY_MASTER || f->kind == FILE_PTY_SLAVE) && input_of(f) && tty_of(f);
}

/* Mark the indices of the ptys the sandbox's processes hold an end of (masters only: only_masters). */
static void mark_used(const zb_sandbox *sb, uint8_t used[ZB_PTY_MAX], int only_masters) {
    for (int k = 0; k < tables(sb); k++) {
        const zb_fdtable *t = table(sb, k);
        for (int i = 0; t && i < ZB_MAX_FDS; i++)
            if (is_pty(t->fd[i]) && (!only_masters || is_master(t->fd[i]))) used[tty_of(t->fd[i])->index % ZB_PTY_MAX] = 1;
    }
}

/* An open master end of pty `index` in the sandbox's processes, or NULL. */
static zb_file *find_master(const zb_sandbox *sb, uint32_t index) {
    for (int k = 0; k < tables(sb); k++) {
        const zb_fdtable *t = table(sb, k);
        for (int i = 0; t && i < ZB_MAX_FDS; i++)
            if (is_pty(t->fd[i]) && is_master(t->fd[i]) && tty_of(t->fd[i])->index == index) return t->fd[i];
    }
    return NULL;
}

/* Whether session sid has a controlling terminal (a pty whose session it is). */
static int session_has_tty(const zb_sandbox *sb, int32_t sid) {
    for (int k = 0; k < tables(sb); k++) {
        const zb_fdtable *t = table(sb, k);
        for (int i = 0; t && i < ZB_MAX_FDS; i++)
            if (is_pty(t->fd[i]) && tty_of(t->fd[i])->sid == sid) return 1;
    }
    return 0;
}

long zb_pty_open_master(zb_sandbox *sb, zb_file **out) {
    uint8_t used[ZB_PTY_MAX] = {0};
    mark_used(sb, used, 0);
    uint32_t index = 0;
    while (index < ZB_PTY_MAX && used[index]) index++;
    if (index == ZB_PTY_MAX) return -ENOSPC; /* as Linux past /proc/sys/kernel/pty/max */
    zb_pipe *in = zb_pipe_new(), *outs = zb_pipe_new();
    zb_tty *t = malloc(sizeof *t);
    zb_file *f = zb_file_new(FILE_PTY_MASTER);
    if (!in || !outs || !t || !f) {
        zb_pipe_free(in);
        zb_pipe_free(outs);
        free(t);
        zb_file_unref(sb->fs, f);
        return -ENOMEM;
    }
    tty_defaults(t, index);
    in->tty = t;
    zb_file_attach_rx(f, outs);
    zb_file_attach_tx(f, in);
    *out = f;
    return 0;
}

/* ---- output processing (the slave's writes, echoes) ---- */

/* Append bytes to out as the terminal shows them (ONLCR): the input bytes taken, or -EAGAIN. */
static long put_output(const zb_tty *t, zb_pipe *out, const uint8_t *p, size_t n) {
    int onlcr = (t->oflag & T_OPOST) && (t->oflag & T_ONLCR);
    uint8_t buf[4096];
    size_t taken = 0;
    while (taken < n) {
        size_t room = ZB_STREAM_CAP - out->len, b = 0, k = taken;
        while (k < n && b + 2 <= sizeof buf) {
            size_t need = onlcr && p[k] == '\n' ? 2 : 1;
            if (b + need > room) break;
            if (need == 2) buf[b++] = '\r';
            buf[b++] = p[k++];
        }
        if (k == taken) break; /* full */
        long r = zb_stream_append(out, buf, b);
        if (r < 0) return taken ? (long)taken : r;
        taken = k;
    }
    return taken ? (long)taken : -EAGAIN;
}

/* What ECHO shows for input byte c (ECHOCTL: ^X for control characters). Dropped if full. */
static void echo_byte(const zb_tty *t, zb_pipe *out, uint8_t c) {
    if (!(t->lflag & T_ECHO) && !(c == '\n' && (t->lflag & T_ECHONL))) return;
    if ((t->lflag & T_ECHOCTL) && (c < 0x20 || c == 0x7f) && c != '\n' && c != '\t' && c != '\r') {
        uint8_t ctl[2] = {'^', (uint8_t)(c == 0x7f ? '?' : c + 0x40)};
        (void)put_output(t, out, ctl, 2);
        return;
    }
    (void)put_output(t, out, &c, 1);
}

static int ends_line(const zb_tty *t, uint8_t c) {
    return c == '\n' || (t->cc[C_VEOF] && c == t->cc[C_VEOF]) || (t->cc[C_VEOL] && c == t->cc[C_VEOL]) ||
           (t->cc[C_VEOL2] && c == t->cc[C_VEOL2]);
}

/* Remove the last byte of the line being typed (canonical mode); 1 if there was one. */
static int erase_one(const zb_tty *t, zb_pipe *in, zb_pipe *out) {
    if (!in->len || ends_line(t, zb_pipe_bytes(in)[in->len - 1])) return 0;
    in->len--; /* the bytes past len are never read: a buffer shared with a snapshot stays intact */
    if (!in->len) in->start = 0;
    if ((t->lflag & T_ECHO) && (t->lflag & T_ECHOE)) (void)put_output(t, out, (const uint8_t *)"\b \b", 3);
    return 1;
}

/* ---- the master end ---- */

static long master_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    zb_pipe *out = f->rx;
    if (out->len) return zb_stream_read(out, p, n);
    return out->writers ? -EAGAIN : -EIO; /* no slave open */
}

static long master_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    if (off >= 0) return -ESPIPE;
    zb_pipe *in = f->tx, *out = f->rx;
    zb_tty *t = in->tty;
    size_t k = 0;
    for (; k < n; k++) {
        uint8_t c = p[k];
        if ((t->lflag & T_ISIG) && c) {
            int sig = c == t->cc[C_VINTR] ? SIGINT : c == t->cc[C_VQUIT] ? SIGQUIT : c == t->cc[C_VSUSP] ? SIGTSTP : 0;
            if (sig) {
                if (!(t->lflag & T_NOFLSH)) in->start = in->len = 0;
                echo_byte(t, out, c);
                signal_group(sb, t->pgrp, sig);
                continue;
            }
        }
        if (c == '\r' && (t->iflag & T_IGNCR)) continue;
        if (c == '\r' && (t->iflag & T_ICRNL)) c = '\n';
        else if (c == '\n' && (t->iflag & T_INLCR)) c = '\r';
        if (t->lflag & T_ICANON) {
            if (c && c == t->cc[C_VERASE]) { (void)erase_one(t, in, out); continue; }
            if (c && c == t->cc[C_VKILL]) { while (erase_one(t, in, out)) {} continue; }
        }
        if (in->len >= ZB_STREAM_CAP) break;
        long r = zb_stream_append(in, &c, 1);
        if (r < 0) return k ? (long)k : r;
        if (!((t->lflag & T_ICANON) && c && c == t->cc[C_VEOF])) echo_byte(t, out, c);
    }
    return k ? (long)k : n ? -EAGAIN : 0;
}

static short master_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)want;
    (void)waits_uart;
    short ev = 0;
    if (f->rx->len) ev |= POLLIN | POLLRDNORM;
    if (!f->rx->writers) ev |= POLLHUP; /* no slave open: a read says EIO */
    if (f->tx->len < ZB_STREAM_CAP) ev |= POLLOUT | POLLWRNORM;
    return ev;
}

/* ---- the slave end ---- */

static long slave_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    zb_pipe *in = f->rx;
    const zb_tty *t = in->tty;
    if (!n) return 0;
    if (!(t->lflag & T_ICANON)) {
        if (in->len) return zb_stream_read(in, p, n);
        return in->writers ? -EAGAIN : 0; /* the master closed: end of file */
    }
    const uint8_t *b = zb_pipe_bytes(in);
    size_t k = 0;
    while (k < in->len && !ends_line(t, b[k])) k++;
    if (k == in->len) { /* no whole line yet */
        if (in->len && (!in->writers || in->len >= ZB_STREAM_CAP)) return zb_stream_read(in, p, n);
        return in->writers ? -EAGAIN : 0;
    }
    int is_eof = t->cc[C_VEOF] && b[k] == t->cc[C_VEOF];
    size_t line = is_eof ? k : k + 1;
    long r = line ? zb_stream_read(in, p, ZB_MIN(n, line)) : 0;
    if (r < 0) return r;
    if (is_eof && (size_t)r == k) { /* the VEOF byte itself is not data */
        uint8_t eof;
        (void)zb_stream_read(in, &eof, 1);
    }
    return r;
}

static long slave_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    if (!f->tx->readers) return -EIO; /* the master closed */
    if (!n) return 0;
    return put_output(f->rx->tty, f->tx, p, n);
}

static short slave_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)want;
    (void)waits_uart;
    const zb_pipe *in = f->rx;
    if (!in->writers) return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLERR | POLLHUP; /* hung up */
    short ev = 0;
    if (in->len) {
        const zb_tty *t = in->tty;
        int whole = !(t->lflag & T_ICANON) || in->len >= ZB_STREAM_CAP;
        for (size_t k = 0; !whole && k < in->len; k++) whole = ends_line(t, zb_pipe_bytes(in)[k]);
        if (whole) ev |= POLLIN | POLLRDNORM;
    }
    if (f->tx->len + 2 <= ZB_STREAM_CAP) ev |= POLLOUT | POLLWRNORM;
    return ev;
}

/* ---- both ends ---- */

/* FIONREAD: the bytes a read could take; a canonical slave counts whole lines only, as Linux. */
static int pty_unread(zb_sandbox *sb, const zb_file *f) {
    (void)sb;
    const zb_pipe *rx = f->rx;
    if (is_master(f) || !(rx->tty->lflag & T_ICANON)) return (int)rx->len;
    size_t k = rx->len;
    while (k && !ends_line(rx->tty, zb_pipe_bytes(rx)[k - 1])) k--;
    return (int)k;
}

/* What stat of its name says (/dev/ptmx, /dev/pts/N): ttyname compares st_dev, st_ino and st_rdev. */
static long pty_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    zb_dev_stat(is_master(f) ? DEV_PTMX : DEV_PTS_FIRST + (int)(tty_of(f)->index % ZB_PTY_MAX), st);
    return 0;
}

/* A new slave end of master m's pty (TIOCGPTPEER, or /dev/pts/N by name) into *out. Without
 * O_NOCTTY, a session leader with no controlling terminal gets this one if no session has it
 * (Linux's tty_open_proc_set_tty). */
static long new_slave(zb_sandbox *sb, zb_file *m, uint64_t flags, zb_file **out) {
    zb_tty *t = tty_of(m);
    if (t->locked) return -EIO; /* until unlockpt */
    zb_member *self = flags & O_NOCTTY ? NULL : caller(sb);
    zb_file *s = zb_file_new(FILE_PTY_SLAVE);
    if (!s || (!(flags & O_NOCTTY) && !self)) {
        zb_file_unref(sb->fs, s);
        return -ENOMEM;
    }
    if (self && self->pid == self->sid && (t->sid <= 0 || zb_family_find(sb->fam, t->sid) < 0) &&
        !session_has_tty(sb, self->sid)) {
        t->sid = self->sid;
        t->pgrp = self->pgid;
    }
    s->flags = (int)(flags & (O_ACCMODE | O_NONBLOCK));
    zb_file_attach_rx(s, m->tx);
    zb_file_attach_tx(s, m->rx);
    *out = s;
    return 0;
}

static long open_peer(zb_sandbox *sb, zb_file *m, uint64_t flags) {
    /* Linux takes any flags here and uses the access mode, O_NONBLOCK, O_NOCTTY and O_CLOEXEC */
    zb_file *s;
    long r = new_slave(sb, m, flags, &s);
    return r < 0 ? r : zb_fd_install(sb, s, 0, (flags & O_CLOEXEC) != 0);
}

/* ---- /dev/pts ---- */

int zb_pty_lookup(zb_sandbox *sb, const char *name) {
    /* devpts names are the decimal index, no sign, no leading zero: anything else is no entry */
    uint32_t index = 0;
    size_t len = 0;
    for (; name[len]; len++) {
        if (name[len] < '0' || name[len] > '9' || len >= 3 || (len && !index)) return -ENOENT;
        index = index * 10 + (uint32_t)(name[len] - '0');
    }
    if (!len || index >= ZB_PTY_MAX || !find_master(sb, index)) return -ENOENT;
    return DEV_PTS_FIRST + (int)index;
}

int zb_pty_list(zb_sandbox *sb, zb_listing *out) {
    uint8_t open[ZB_PTY_MAX] = {0};
    mark_used(sb, open, 1);
    for (int i = 0; i < ZB_PTY_MAX; i++) {
        char name[12]; /* an int's digits and sign (the compiler cannot see i < ZB_PTY_MAX at -O1) */
        snprintf(name, sizeof name, "%d", i);
        int r = open[i] ? zb_listing_add(out, name, DT_CHR, ZB_DEV_INO(DEV_PTS_FIRST + i)) : 0;
        if (r < 0) return r;
    }
    return 0;
}

long zb_pty_open_slave(zb_sandbox *sb, int dev, uint64_t flags, zb_file **out) {
    zb_file *m = dev >= DEV_PTS_FIRST && dev < DEV_PTS_FIRST + ZB_PTY_MAX ? find_master(sb, (uint32_t)(dev - DEV_PTS_FIRST)) : NULL;
    if (!m) return -ENOENT; /* its master closed between the lookup and the open */
    return new_slave(sb, m, flags, out);
}

static long set_termios(zb_tty *t, const k_termios *k, zb_pipe *in, int flush) {
    t->iflag = k->iflag;
    t->oflag = k->oflag;
    t->cflag = k->cflag;
    t->lflag = k->lflag;
    t->line = k->line;
    memcpy(t->cc, k->cc, sizeof t->cc);
    if (flush) in->start = in->len = 0;
    return 0;
}

static long pty_ioctl(zb_sandbox *sb, zb_file *f, uint64_t cmd, uint64_t arg) {
    zb_tty *t = tty_of(f);
    zb_pipe *in = input_of(f), *out = output_of(f);
    switch (cmd) {
    case TCGETS: case NO_TCGETS2: {
        k_termios2 k;
        memset(&k, 0, sizeof k);
        k.t.iflag = t->iflag;
        k.t.oflag = t->oflag;
        k.t.cflag = t->cflag;
        k.t.lflag = t->lflag;
        k.t.line = t->line;
        memcpy(k.t.cc, t->cc, sizeof k.t.cc);
        k.ispeed = k.ospeed = 38400;
        return zb_copy_to_guest(sb, arg, &k, cmd == TCGETS ? sizeof k.t : sizeof k) < 0 ? -EFAULT : 0;
    }
    case TCSETS: case TCSETSW: case TCSETSF: case NO_TCSETS2: case NO_TCSETSW2: case NO_TCSETSF2: {
        k_termios2 k;
        int two = cmd == NO_TCSETS2 || cmd == NO_TCSETSW2 || cmd == NO_TCSETSF2;
        if (zb_copy_from_guest(sb, &k, arg, two ? sizeof k : sizeof k.t) < 0) return -EFAULT;
        return set_termios(t, &k.t, in, cmd == TCSETSF || cmd == NO_TCSETSF2);
    }
    case TIOCGWINSZ: {
        k_winsize w = {t->rows, t->cols, t->xpixel, t->ypixel};
        return zb_copy_to_guest(sb, arg, &w, sizeof w) < 0 ? -EFAULT : 0;
    }
    case TIOCSWINSZ: {
        k_winsize w;
        if (zb_copy_from_guest(sb, &w, arg, sizeof w) < 0) return -EFAULT;
        int changed = w.row != t->rows || w.col != t->cols || w.xpixel != t->xpixel || w.ypixel != t->ypixel;
        t->rows = w.row;
        t->cols = w.col;
        t->xpixel = w.xpixel;
        t->ypixel = w.ypixel;
        if (changed) signal_group(sb, t->pgrp, SIGWINCH);
        return 0;
    }
    case TIOCGPTN: {
        if (!is_master(f)) return -ENOTTY;
        uint32_t n = t->index;
        return zb_copy_to_guest(sb, arg, &n, sizeof n) < 0 ? -EFAULT : 0;
    }
    case TIOCSPTLCK: {
        if (!is_master(f)) return -ENOTTY;
        int v;
        if (zb_copy_from_guest(sb, &v, arg, sizeof v) < 0) return -EFAULT;
        t->locked = v != 0;
        return 0;
    }
    case TIOCGPTLCK: {
        if (!is_master(f)) return -ENOTTY;
        int v = (int)t->locked;
        return zb_copy_to_guest(sb, arg, &v, sizeof v) < 0 ? -EFAULT : 0;
    }
    case TIOCGPTPEER:
        return is_master(f) ? open_peer(sb, f, arg) : -ENOTTY;
    case TIOCSCTTY: {
        zb_member *self = caller(sb);
        if (!self) return -ENOMEM;
        if (self->pid != self->sid) return -EPERM; /* only a session leader takes a terminal */
        if (t->sid == self->sid) return 0;
        if (t->sid > 0 && zb_family_find(sb->fam, t->sid) >= 0) return -EPERM; /* another session's */
        t->sid = self->sid;
        t->pgrp = self->pgid;
        return 0;
    }
    case TIOCNOTTY: {
        zb_member *self = caller(sb);
        if (!self) return -ENOMEM;
        if (t->sid != self->sid) return -ENOTTY;
        if (self->pid == self->sid) {
            signal_group(sb, t->pgrp, SIGHUP);
            signal_group(sb, t->pgrp, SIGCONT);
            t->sid = t->pgrp = 0;
        }
        return 0;
    }
    case TIOCGPGRP: case TIOCGSID: {
        zb_member *self = caller(sb);
        if (!self) return -ENOMEM;
        if (!is_master(f) && t->sid != self->sid) return -ENOTTY; /* not its controlling terminal */
        if (cmd == TIOCGSID && !t->sid) return -ENOTTY;
        int32_t v = cmd == TIOCGPGRP ? t->pgrp : t->sid;
        return zb_copy_to_guest(sb, arg, &v, sizeof v) < 0 ? -EFAULT : 0;
    }
    case TIOCSPGRP: {
        zb_member *self = caller(sb);
        if (!self) return -ENOMEM;
        int32_t pgrp;
        if (zb_copy_from_guest(sb, &pgrp, arg, sizeof pgrp) < 0) return -EFAULT;
        if (!t->sid || t->sid != self->sid) return -ENOTTY;
        if (pgrp < 0) return -EINVAL;
        if (!zb_family_group_in_session(sb->fam, pgrp, self->sid)) return -EPERM;
        t->pgrp = pgrp;
        return 0;
    }
    case TIOCOUTQ: {
        int v = (int)f->tx->len;
        return zb_copy_to_guest(sb, arg, &v, sizeof v) < 0 ? -EFAULT : 0;
    }
    case TCFLSH: /* TCIFLUSH 0, TCOFLUSH 1, TCIOFLUSH 2 */
        if (arg > 2) return -EINVAL;
        if (arg != 1) in->start = in->len = 0;
        if (arg != 0) out->start = out->len = 0;
        return 0;
    case TCSBRK: case TCSBRKP: case TCXONC:
        return 0; /* tcdrain / tcsendbreak / tcflow: nothing is in flight to wait for */
    default:
        return -ENOTTY;
    }
}

/* Snapshots: the streams (with the tty state) are the generic file table's; check they are there. */
static int pty_load(zb_file *f, struct zb_in *in);

const zb_file_ops zb_file_pty_master_ops = {
    .name = "pty master",
    .props = ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS,
    .read = master_read,
    .write = master_write,
    .stat = pty_stat,
    .ready = master_ready,
    .unread = pty_unread,
    .ioctl = pty_ioctl,
    .load = pty_load,
};

const zb_file_ops zb_file_pty_slave_ops = {
    .name = "pty slave",
    .props = ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS,
    .read = slave_read,
    .write = slave_write,
    .stat = pty_stat,
    .ready = slave_ready,
    .unread = pty_unread,
    .ioctl = pty_ioctl,
    .load = pty_load,
};

#include "serial.h"
static int pty_load(zb_file *f, struct zb_in *in) {
    uint32_t n = in_u32(in);
    if (in->err || n || !f->rx || !f->tx) return -1;
    /* the input stream holds the tty and the output stream none */
    if (!input_of(f)->tty || output_of(f)->tty) return -1;
    return 0;
}
