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
 * to the other processes and is served again), so the cell's time limit and interrupt end it; a
 * deadlock between two waiters is not detected (Linux answers EDEADLK for record locks) and lasts
 * until then. Locks are not part of snapshots: a checkpoint, a rollback or %rewind starts with none
 * (the processes that could contend end with it). Locks of the guest never reach the host's files.
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

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

/* Set (or with F_UNLCK clear) the owner's lock; a conflict waits or fails with EAGAIN. */
static long set_lock(zb_sandbox *sb, int space, const lock_key *k, int type, int32_t pid, const zb_file *file,
                     uint64_t start, uint64_t end, int wait) {
    zb_fs *fs = sb->fs;
    if (type != F_UNLCK && conflict(fs, space, k, type, pid, file, start, end)) {
        if (!wait) return -EAGAIN;
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
