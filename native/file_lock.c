/* file_lock.c - advisory file locks between the processes of a sandbox, as Linux keeps them:
 *   - flock(2): a shared or exclusive lock on the whole file, owned by the open file description
 *     (shared across fork and dup), released by LOCK_UN or when the description's last reference
 *     goes;
 *   - fcntl(2) record locks (F_SETLK, F_SETLKW, F_GETLK): byte ranges owned by the process, released
 *     by F_UNLCK, when the process closes any descriptor of the file, and when it ends;
 *   - open file description locks (F_OFD_SETLK, F_OFD_SETLKW, F_OFD_GETLK): byte ranges owned by
 *     the description, released by F_UNLCK or with the description.
 * flock locks and record locks are separate (they never conflict with each other); record and OFD
 * locks share one space. Two locks conflict when their ranges overlap, their owners differ and one
 * of them is a write (exclusive) lock. A process's own record locks never conflict with each other:
 * setting one replaces (splits) what the owner held in that range.
 *
 * The table lives in the family's file system (zb_fs.locks), so every process of the sandbox sees
 * the same locks; a lock's file is named by its inode (the host's device and inode number for host
 * files, the overlay inode for the sandbox's own files); other kinds of files (pipes, sockets,
 * devices) are named by their open file description, so only users of that description contend.
 * A blocking request that conflicts waits as other blocking syscalls do (zb_sleep_until: it yields
 * to the other processes and is served again), so the cell's time limit and interrupt end it. A
 * blocking record-lock request that would close a cycle of waiting processes fails with EDEADLK,
 * as on Linux (would_deadlock); waits on flock and OFD locks are not followed, as on Linux either.
 * Locks are not part of snapshots: a checkpoint, a rollback or %rewind starts with none (the
 * processes that could contend end with it). Locks of the guest never reach the host's files.
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define LOCKS_MAX 65536u /* per sandbox: past it, ENOLCK (Linux's limit is memory) */
#define TO_EOF UINT64_MAX

enum { SPACE_FLOCK = 1, SPACE_RECORD };
enum { KEY_HOST = 1, KEY_OVERLAY, KEY_DESCRIPTION };

typedef struct lock_key {
    int cls;
    uint64_t a, b;
} lock_key;

struct zb_lock {
    int space;
    lock_key key;
    int type;             /* F_RDLCK or F_WRLCK */
    int32_t pid;          /* a record lock's process; 0 for flock and OFD locks */
    const zb_file *file;  /* a flock or OFD lock's description; NULL for record locks */
    uint64_t start, end;  /* [start, end); end TO_EOF: up to any size */
};

static int key_of(zb_file *f, lock_key *k) {
    memset(k, 0, sizeof *k);
    if (f->kind == FILE_HOST && f->host) {
        struct stat st;
        if (ZB_HOSTCALL(fstat(f->host->fd, &st)) < 0) return -errno;
        k->cls = KEY_HOST;
        k->a = (uint64_t)st.st_dev;
        k->b = (uint64_t)st.st_ino;
        return 0;
    }
    uint32_t ino = f->ops->overlay_ino ? f->ops->overlay_ino(f) : 0;
    k->cls = ino ? KEY_OVERLAY : KEY_DESCRIPTION;
    k->a = ino ? ino : (uint64_t)(uintptr_t)f;
    return 0;
}

static int same_key(const lock_key *x, const lock_key *y) { return x->cls == y->cls && x->a == y->a && x->b == y->b; }
static int same_owner(const struct zb_lock *l, int32_t pid, const zb_file *file) { return l->pid == pid && l->file == file; }
static int overlaps(const struct zb_lock *l, uint64_t start, uint64_t end) { return l->start < end && start < l->end; }

/* The first lock of another owner that a request (type over [start, end)) conflicts with, or NULL. */
static const struct zb_lock *conflict(const zb_fs *fs, int space, const lock_key *k, int type, int32_t pid,
                                      const zb_file *file, uint64_t start, uint64_t end) {
    for (size_t i = 0; i < fs->nlocks; i++) {
        const struct zb_lock *l = &fs->locks[i];
        if (l->space != space || !same_key(&l->key, k) || same_owner(l, pid, file) || !overlaps(l, start, end)) continue;
        if (l->type == F_WRLCK || type == F_WRLCK) return l;
    }
    return NULL;
}

static int push(zb_fs *fs, const struct zb_lock *l) {
    if (fs->nlocks == fs->locks_cap) {
        if (fs->locks_cap >= LOCKS_MAX) return -ENOLCK;
        size_t cap = fs->locks_cap ? fs->locks_cap * 2 : 16;
        struct zb_lock *grown = realloc(fs->locks, cap * sizeof *grown);
        if (!grown) return -ENOLCK;
        fs->locks = grown;
        fs->locks_cap = cap;
    }
    fs->locks[fs->nlocks++] = *l;
    return 0;
}

/* Take [start, end) out of the owner's locks of this file (a lock that covers more is split). The
 * split can need one more entry: that is checked before anything changes, so a failure changes
 * nothing. */
static int carve(zb_fs *fs, int space, const lock_key *k, int32_t pid, const zb_file *file, uint64_t start, uint64_t end) {
    for (size_t i = 0; i < fs->nlocks; i++) {
        const struct zb_lock *l = &fs->locks[i];
        if (l->space == space && same_key(&l->key, k) && same_owner(l, pid, file) && l->start < start && end < l->end &&
            fs->nlocks == fs->locks_cap && fs->locks_cap >= LOCKS_MAX)
            return -ENOLCK;
    }
    for (size_t i = 0; i < fs->nlocks;) {
        struct zb_lock *l = &fs->locks[i];
        if (l->space != space || !same_key(&l->key, k) || !same_owner(l, pid, file) || !overlaps(l, start, end)) { i++; continue; }
        if (l->start < start && end < l->end) { /* the range is inside: keep both sides */
            struct zb_lock right = *l;
            right.start = end;
            l->end = start;
            int rc = push(fs, &right);
            if (rc < 0) return rc;
            i++;
        } else if (l->start < start) {
            l->end = start;
            i++;
        } else if (end < l->end) {
            l->start = end;
            i++;
        } else {
            fs->locks[i] = fs->locks[--fs->nlocks];
        }
    }
    return 0;
}

static long flock_range(zb_sandbox *sb, zb_file *f, const struct flock *fl, uint64_t *start, uint64_t *end);

/* ---- deadlocks between processes waiting for record locks ----
 * Linux refuses a blocking record-lock request (F_SETLKW) with EDEADLK when the process holding the
 * conflicting lock itself waits in F_SETLKW for a lock of the requesting process, following such
 * waits up to ten steps (its MAX_DEADLK_ITERATIONS). Who waits for what is read from the processes
 * as they are, not recorded: a process waits when one of its threads is blocked in fcntl(F_SETLKW)
 * (the syscall yielded and is served again: cpu.pending_syscall), for the holder of the first lock
 * that request conflicts with now. So a wait that a signal ended (EINTR) or that the holder's exit
 * resolved never counts. Every value read from the waiting process (its fd, its struct flock) is
 * checked as its own request was. */
#define DEADLOCK_STEPS_MAX 10
/* Blocked requests a check looks at, at most: each costs a pass over the lock table, and a guest
 * could block up to 1,024 threads in each of its processes. Past it the check gives up (the
 * request just waits, as without the check). */
#define DEADLOCK_REQUESTS_MAX 64

/* Thread state c is blocked in fcntl (any command: request_waits_for looks at which). */
static int blocked_in_fcntl(const zb_cpu *c) { return c->pending_syscall && c->pending_nr == SYS_fcntl; }

/* The process whose record lock the blocked fcntl in thread state c of process m waits for, or 0. */
static int32_t request_waits_for(zb_sandbox *m, const zb_cpu *c) {
    if ((unsigned)c->regs.rsi != F_SETLKW) return 0;
    zb_file *f = zb_fd_get(m, c->regs.rdi);
    struct flock fl;
    if (!f || zb_copy_from_guest(m, &fl, c->regs.rdx, sizeof fl) < 0) return 0;
    if (fl.l_type != F_RDLCK && fl.l_type != F_WRLCK) return 0;
    uint64_t start, end;
    lock_key k;
    if (flock_range(m, f, &fl, &start, &end) < 0 || start == end || key_of(f, &k) < 0) return 0;
    const struct zb_lock *l = conflict(m->fs, SPACE_RECORD, &k, fl.l_type, zb_proc_getpid(m), NULL, start, end);
    return l ? l->pid : 0;
}

/* The process that process pid of sb's family waits for (a record lock it holds), or 0; each
 * blocked request looked at takes one from *budget (none left: 0). */
static int32_t process_waits_for(zb_sandbox *sb, int32_t pid, int *budget) {
    zb_family *fam = sb->fam;
    int i = fam ? zb_family_find(fam, pid) : -1;
    zb_sandbox *m = i >= 0 ? fam->m[i].sb : NULL; /* NULL: a zombie waits for nothing */
    if (!m || m == sb) return 0;
    const zb_threads *ts = &m->threads;
    for (int t = 0; t < ts->cap; t++) {
        const zb_cpu *c = t == ts->current ? &m->cpu : &ts->t[t].cpu;
        if (!ts->t[t].tid || !blocked_in_fcntl(c)) continue;
        if ((*budget)-- <= 0) return 0;
        int32_t holder = request_waits_for(m, c);
        if (holder) return holder;
    }
    return 0;
}

/* Process pid waiting for holder's record lock would close a cycle of waits. */
static int would_deadlock(zb_sandbox *sb, int32_t pid, int32_t holder) {
    int budget = DEADLOCK_REQUESTS_MAX;
    for (int step = 0; holder > 0 && step < DEADLOCK_STEPS_MAX; step++) {
        holder = process_waits_for(sb, holder, &budget);
        if (holder == pid) return 1;
    }
    return 0;
}

/* Set (or with F_UNLCK clear) the owner's lock; a conflict waits or fails with EAGAIN (or EDEADLK). */
static long set_lock(zb_sandbox *sb, int space, const lock_key *k, int type, int32_t pid, const zb_file *file,
                     uint64_t start, uint64_t end, int wait) {
    zb_fs *fs = sb->fs;
    const struct zb_lock *held = type != F_UNLCK ? conflict(fs, space, k, type, pid, file, start, end) : NULL;
    if (held) {
        if (!wait) return -EAGAIN;
        if (space == SPACE_RECORD && pid > 0 && held->pid > 0 && would_deadlock(sb, pid, held->pid)) return -EDEADLK;
        long rc = zb_sleep_until(sb, INT64_MAX); /* yields to the holder; the syscall is served again */
        if (rc == ZB_SYSCALL_BLOCK || rc == ZB_SYSCALL_STOP) return rc;
        return rc < 0 ? rc : -EINTR;
    }
    long rc = carve(fs, space, k, pid, file, start, end);
    if (rc < 0 || type == F_UNLCK) return rc;
    struct zb_lock l = {.space = space, .key = *k, .type = type, .pid = pid, .file = file, .start = start, .end = end};
    return push(fs, &l);
}

long zb_lock_flock(zb_sandbox *sb, zb_file *f, unsigned op) {
    if (op & LOCK_MAND) return 0; /* Linux ignores the retired mandatory flock locks */
    unsigned kind = op & ~(unsigned)LOCK_NB;
    int type = kind == LOCK_SH ? F_RDLCK : kind == LOCK_EX ? F_WRLCK : kind == LOCK_UN ? F_UNLCK : -1;
    if (type < 0) return -EINVAL;
    lock_key k;
    long rc = key_of(f, &k);
    if (rc < 0) return rc;
    /* Linux converts a held lock by dropping it first: another waiter may get in between */
    if (type != F_UNLCK && (rc = carve(sb->fs, SPACE_FLOCK, &k, 0, f, 0, TO_EOF)) < 0) return rc;
    return set_lock(sb, SPACE_FLOCK, &k, type, 0, f, 0, TO_EOF, !(op & LOCK_NB));
}

/* struct flock's range made absolute: [start, end). */
static long flock_range(zb_sandbox *sb, zb_file *f, const struct flock *fl, uint64_t *start, uint64_t *end) {
    int64_t base;
    switch (fl->l_whence) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)ZB_MIN(f->offset, (uint64_t)INT64_MAX); break;
    case SEEK_END: {
        struct stat st;
        if (!f->ops->stat) return -EINVAL;
        long rc = f->ops->stat(sb, f, &st);
        if (rc < 0) return rc;
        base = st.st_size;
        break;
    }
    default: return -EINVAL;
    }
    int64_t s, e;
    if (__builtin_add_overflow(base, (int64_t)fl->l_start, &s) || s < 0) return -EINVAL;
    if (fl->l_len > 0) {
        if (__builtin_add_overflow(s, (int64_t)fl->l_len, &e)) return -EOVERFLOW;
    } else if (fl->l_len < 0) { /* POSIX: the bytes before start */
        e = s;
        if (__builtin_add_overflow(s, (int64_t)fl->l_len, &s) || s < 0) return -EINVAL;
    } else {
        *start = (uint64_t)s;
        *end = TO_EOF;
        return 0;
    }
    *start = (uint64_t)s;
    *end = (uint64_t)e;
    return 0;
}

long zb_lock_fcntl(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t uflock) {
    struct flock fl;
    if (zb_copy_from_guest(sb, &fl, uflock, sizeof fl) < 0) return -EFAULT;
    int ofd = cmd == F_OFD_GETLK || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW;
    if (ofd && fl.l_pid != 0) return -EINVAL; /* Linux: OFD requests must say pid 0 */
    int type = fl.l_type;
    if (type != F_RDLCK && type != F_WRLCK && type != F_UNLCK) return -EINVAL;
    uint64_t start, end;
    long rc = flock_range(sb, f, &fl, &start, &end);
    if (rc < 0) return rc;
    lock_key k;
    if ((rc = key_of(f, &k)) < 0) return rc;
    int32_t pid = ofd ? 0 : (int32_t)zb_proc_getpid(sb);
    const zb_file *owner = ofd ? f : NULL;
    if (cmd == F_GETLK || cmd == F_OFD_GETLK) {
        if (type == F_UNLCK) return -EINVAL;
        const struct zb_lock *l = conflict(sb->fs, SPACE_RECORD, &k, type, pid, owner, start, end);
        if (!l) {
            fl.l_type = F_UNLCK;
        } else {
            fl.l_type = (short)l->type;
            fl.l_whence = SEEK_SET;
            fl.l_start = (off_t)l->start;
            fl.l_len = l->end == TO_EOF ? 0 : (off_t)(l->end - l->start);
            fl.l_pid = l->file ? -1 : l->pid; /* an OFD lock has no process */
        }
        return zb_copy_to_guest(sb, uflock, &fl, sizeof fl);
    }
    int acc = f->flags & O_ACCMODE;
    if ((type == F_RDLCK && acc == O_WRONLY) || (type == F_WRLCK && acc == O_RDONLY)) return -EBADF;
    if (start == end) return 0; /* an empty range (l_len < 0 reaching back to start) */
    return set_lock(sb, SPACE_RECORD, &k, type, pid, owner, start, end, cmd == F_SETLKW || cmd == F_OFD_SETLKW);
}

/* Drop every lock that matches (space 0: any space; key NULL: any file). */
static void drop(zb_fs *fs, const lock_key *k, int32_t pid, const zb_file *file, int space) {
    for (size_t i = 0; i < fs->nlocks;) {
        const struct zb_lock *l = &fs->locks[i];
        if ((!space || l->space == space) && (!k || same_key(&l->key, k)) && same_owner(l, pid, file))
            fs->locks[i] = fs->locks[--fs->nlocks];
        else
            i++;
    }
}

void zb_lock_closed_fd(zb_sandbox *sb, zb_file *f) {
    if (!sb->fs || !sb->fs->nlocks) return;
    lock_key k;
    if (key_of(f, &k) == 0) drop(sb->fs, &k, (int32_t)zb_proc_getpid(sb), NULL, SPACE_RECORD);
}

void zb_lock_file_gone(zb_fs *fs, const zb_file *f) {
    if (fs && fs->nlocks) drop(fs, NULL, 0, f, 0);
}

void zb_lock_process_gone(zb_fs *fs, int32_t pid) {
    if (fs && fs->nlocks && pid > 0) drop(fs, NULL, pid, NULL, SPACE_RECORD);
}

void zb_lock_free_all(zb_fs *fs) {
    free(fs->locks);
    fs->locks = NULL;
    fs->nlocks = fs->locks_cap = 0;
}
