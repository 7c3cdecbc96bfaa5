/* sys_fsmeta.c - syscalls on names rather than open files: stat, access, readlink, directories,
 * cwd, mkdir/unlink/rename/symlink, getdents64. Only overlay directories can be changed.
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"
#include "guest_abi.h"
#include "shared_map.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

static long stat_to_guest(zb_sandbox *sb, const struct stat *st, uint64_t addr) {
    return zb_copy_to_guest(sb, addr, st, sizeof *st);
}

/* fstat: the open file's kind knows (a file without stat of its own is its location's). */
long zb_file_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    if (f->ops->stat) return f->ops->stat(sb, f, st);
    memset(st, 0, sizeof *st);
    return f->where ? zb_fs_stat(sb, f->where, st) : -EBADF;
}

static long do_fstatat(zb_sandbox *sb, int64_t dirfd, uint64_t upath, int flags, struct stat *st) {
    if (flags & ~(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH | AT_NO_AUTOMOUNT | AT_STATX_SYNC_TYPE)) return -EINVAL;
    char first;
    if ((flags & AT_EMPTY_PATH) && zb_copy_from_guest(sb, &first, upath, 1) == 0 && first == 0) {
        zb_file *f = (int)dirfd == AT_FDCWD ? NULL : zb_fd_get(sb, (uint64_t)dirfd);
        if ((int)dirfd == AT_FDCWD) {
            zb_resolved r;
            long rc = zb_fs_resolve(sb, "/", sb->proc.cwd, 0, &r);
            return rc < 0 ? rc : zb_fs_stat(sb, &r, st);
        }
        return f ? zb_file_stat(sb, f, st) : -EBADF;
    }
    zb_resolved r;
    long rc = zb_path_arg(sb, dirfd, upath, (flags & AT_SYMLINK_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0, 0, &r);
    if (rc < 0) return rc;
    if (!r.exists) return -ENOENT;
    return zb_fs_stat(sb, &r, st);
}

static long sys_stat(zb_sandbox *sb, const uint64_t a[6]) {
    struct stat st;
    long rc = do_fstatat(sb, AT_FDCWD, a[0], 0, &st);
    return rc < 0 ? rc : stat_to_guest(sb, &st, a[1]);
}
static long sys_lstat(zb_sandbox *sb, const uint64_t a[6]) {
    struct stat st;
    long rc = do_fstatat(sb, AT_FDCWD, a[0], AT_SYMLINK_NOFOLLOW, &st);
    return rc < 0 ? rc : stat_to_guest(sb, &st, a[1]);
}
static long sys_fstat(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    struct stat st;
    long rc = zb_file_stat(sb, f, &st);
    return rc < 0 ? rc : stat_to_guest(sb, &st, a[1]);
}
static long sys_newfstatat(zb_sandbox *sb, const uint64_t a[6]) {
    struct stat st;
    long rc = do_fstatat(sb, (int)a[0], a[1], (int)a[3], &st);
    return rc < 0 ? rc : stat_to_guest(sb, &st, a[2]);
}

/* ZB_SYS_STAT_MANY (guest_abi.h): what n stat(2) calls would answer, for one exit. Each path goes
 * through the same copy, resolution and confinement as stat's; a bad path pointer is that entry's
 * EFAULT, a bad array the call's. n is bounded, so one call costs at most ZB_STAT_MANY_MAX stats. */
static long sys_zb_stat_many(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t paths = a[0], n = a[1], out = a[2], errors = a[3];
    if (n > ZB_STAT_MANY_MAX || a[4] != 0) return -EINVAL;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t path;
        if (zb_copy_from_guest(sb, &path, paths + i * sizeof path, sizeof path) != 0) return -EFAULT;
        struct stat st;
        long rc = do_fstatat(sb, AT_FDCWD, path, 0, &st);
        int32_t err = rc >= 0 ? 0 : rc >= -4095 ? (int32_t)-rc : EIO; /* no pause or block in a stat */
        if (err == 0 && stat_to_guest(sb, &st, out + i * sizeof st) != 0) return -EFAULT;
        if (zb_copy_to_guest(sb, errors + i * sizeof err, &err, sizeof err) != 0) return -EFAULT;
    }
    return (long)n;
}

static void ts_to_statx(struct statx_timestamp *d, const struct timespec *s) {
    d->tv_sec = s->tv_sec;
    d->tv_nsec = (uint32_t)s->tv_nsec;
}

static long sys_statx(zb_sandbox *sb, const uint64_t a[6]) {
    struct stat st;
    long rc = do_fstatat(sb, (int)a[0], a[1], (int)a[2] & ~AT_STATX_SYNC_TYPE, &st);
    if (rc < 0) return rc;
    struct statx sx;
    memset(&sx, 0, sizeof sx);
    sx.stx_mask = STATX_BASIC_STATS;
    sx.stx_blksize = st.st_blksize;
    sx.stx_nlink = st.st_nlink;
    sx.stx_uid = st.st_uid;
    sx.stx_gid = st.st_gid;
    sx.stx_mode = st.st_mode;
    sx.stx_ino = st.st_ino;
    sx.stx_size = st.st_size;
    sx.stx_blocks = st.st_blocks;
    ts_to_statx(&sx.stx_atime, &st.st_atim);
    ts_to_statx(&sx.stx_mtime, &st.st_mtim);
    ts_to_statx(&sx.stx_ctime, &st.st_ctim);
    sx.stx_rdev_major = major(st.st_rdev);
    sx.stx_rdev_minor = minor(st.st_rdev);
    sx.stx_dev_major = major(st.st_dev);
    sx.stx_dev_minor = minor(st.st_dev);
    return zb_copy_to_guest(sb, a[4], &sx, sizeof sx);
}

static long do_access(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t mode, int flags) {
    if (mode & ~(uint64_t)(R_OK | W_OK | X_OK)) return -EINVAL;
    zb_resolved r;
    long rc = zb_path_arg(sb, dirfd, upath, (flags & AT_SYMLINK_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0,
                          flags & AT_EMPTY_PATH, &r);
    if (rc < 0) return rc;
    if (!r.exists) return -ENOENT;
    /* inside a project, its folder itself included (a trie node of its own: the cells' cwd) */
    if ((mode & W_OK) && r.loc.proj && (!r.loc.mnode || r.loc.mnode == r.loc.proj_root)) {
        if (r.loc.proj == PROJ_READONLY) return -EROFS;
        if (r.loc.proj == PROJ_READWRITE && access(r.path, W_OK) < 0) return -errno;
    } else if (mode & W_OK) {
        zb_inode *in = r.loc.kind == LOC_OVERLAY ? zb_ovl_inode(sb->fs, r.loc.ino) : NULL;
        if (r.loc.kind == LOC_HOST || r.loc.kind == LOC_SYNTH) return -EROFS;
        if (in && in->readonly) return -EACCES;
    }
    if (mode & X_OK) {
        struct stat st;
        if ((rc = zb_fs_stat(sb, &r, &st)) < 0) return rc;
        if (!(st.st_mode & 0111)) return -EACCES;
    }
    return 0;
}
static long sys_access(zb_sandbox *sb, const uint64_t a[6]) { return do_access(sb, AT_FDCWD, a[0], a[1], 0); }
static long sys_faccessat(zb_sandbox *sb, const uint64_t a[6]) { return do_access(sb, (int)a[0], a[1], a[2], 0); }
static long sys_faccessat2(zb_sandbox *sb, const uint64_t a[6]) { return do_access(sb, (int)a[0], a[1], a[2], (int)a[3]); }

static long do_readlink(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t ubuf, int64_t size) {
    if (size <= 0) return -EINVAL;
    zb_resolved r;
    long rc = zb_path_arg(sb, dirfd, upath, ZB_RESOLVE_NOFOLLOW, 0, &r);
    if (rc < 0) return rc;
    if (!r.exists) return -ENOENT;
    char target[PATH_MAX];
    ssize_t n;
    if (r.loc.kind == LOC_SYMLINK) {
        if ((n = zb_fs_symlink_target(sb, &r.loc, target, sizeof target)) < 0) return n;
        n = ZB_MIN(n, (ssize_t)sizeof target - 1);
    } else if (r.loc.kind == LOC_OVERLAY && zb_ovl_inode(sb->fs, r.loc.ino)->type == INO_SYMLINK) {
        n = snprintf(target, sizeof target, "%s", zb_ovl_inode(sb->fs, r.loc.ino)->target);
    } else if (r.loc.kind == LOC_HOST) {
        n = readlink(r.path, target, sizeof target);
        if (n < 0) return -errno;
    } else {
        return -EINVAL;
    }
    n = ZB_MIN(n, size);
    rc = zb_copy_to_guest(sb, ubuf, target, (uint64_t)n);
    return rc < 0 ? rc : n;
}
static long sys_readlink(zb_sandbox *sb, const uint64_t a[6]) { return do_readlink(sb, AT_FDCWD, a[0], a[1], (int64_t)a[2]); }
static long sys_readlinkat(zb_sandbox *sb, const uint64_t a[6]) { return do_readlink(sb, (int)a[0], a[1], a[2], (int64_t)a[3]); }

static long sys_getcwd(zb_sandbox *sb, const uint64_t a[6]) {
    size_t n = strlen(sb->proc.cwd) + 1;
    if (a[1] < n) return -ERANGE;
    long rc = zb_copy_to_guest(sb, a[0], sb->proc.cwd, n);
    return rc < 0 ? rc : (long)n;
}

static long set_cwd(zb_sandbox *sb, const zb_resolved *r) {
    if (!r->exists) return -ENOENT;
    if (!r->loc.is_dir) return -ENOTDIR;
    snprintf(sb->proc.cwd, sizeof sb->proc.cwd, "%s", r->path);
    return 0;
}
static long sys_chdir(zb_sandbox *sb, const uint64_t a[6]) {
    zb_resolved r;
    long rc = zb_path_arg(sb, AT_FDCWD, a[0], 0, 0, &r);
    return rc < 0 ? rc : set_cwd(sb, &r);
}
static long sys_fchdir(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    return f->where ? set_cwd(sb, f->where) : -ENOTDIR;
}

/* A name that can be created in the overlay: the parent must be an overlay directory. */
/* Creating r happens on the host (read-write project): the caller does it there. */
#define ON_HOST 1
/* r is in an overlay project: removing it may need a whiteout (zb_proj_remove). */
#define IN_PROJECT 2

static long creatable_at(zb_sandbox *sb, zb_resolved *r) {
    long rc;
    if (r->exists) return -EEXIST;
    if (r->parent.proj == PROJ_READONLY) return -EROFS;
    if (r->parent.proj == PROJ_READWRITE) return ON_HOST;
    if (r->parent.proj == PROJ_OVERLAY && (rc = zb_proj_copy_up(sb, r, 1)) < 0) return rc;
    if (r->parent.kind != LOC_OVERLAY) return -EROFS;
    return 0;
}

static long creatable(zb_sandbox *sb, int64_t dirfd, uint64_t upath, zb_resolved *r) {
    long rc = zb_path_arg(sb, dirfd, upath, ZB_RESOLVE_NOFOLLOW, 0, r);
    return rc < 0 ? rc : creatable_at(sb, r);
}

/* A host call on r's parent directory in a read-write project: fn(parent_fd, name). */
static long on_host(const zb_resolved *r, long (*fn)(int pfd, const char *name, const void *arg), const void *arg) {
    char name[NAME_MAX + 1];
    int pfd = zb_proj_host_parent(r, name, sizeof name);
    if (pfd < 0) return pfd;
    long rc = fn(pfd, name, arg);
    close(pfd);
    return rc;
}

static long host_mkdir(int pfd, const char *name, const void *mode) {
    return mkdirat(pfd, name, *(const mode_t *)mode & ZB_HOST_MODE_BITS) < 0 ? -errno : 0; /* no setuid/setgid/sticky */
}
static long host_symlink(int pfd, const char *name, const void *target) { return symlinkat(target, pfd, name) < 0 ? -errno : 0; }
static long host_unlink(int pfd, const char *name, const void *flags) { return unlinkat(pfd, name, *(const int *)flags) < 0 ? -errno : 0; }

static long do_mkdir(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t mode) {
    zb_resolved r;
    long rc = creatable(sb, dirfd, upath, &r);
    if (rc < 0) return rc;
    mode_t m = (mode_t)(mode & ~sb->proc.umask & 07777);
    if (rc == ON_HOST) return on_host(&r, host_mkdir, &m);
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_DIR, m);
    if (!ino) return -ENOSPC;
    zb_ovl_inode(sb->fs, ino)->opaque = r.opaque;
    if ((rc = zb_ovl_link(sb->fs, r.parent.ino, r.name, ino)) < 0) zb_ovl_discard(sb->fs, ino);
    return rc;
}
static long sys_mkdir(zb_sandbox *sb, const uint64_t a[6]) { return do_mkdir(sb, AT_FDCWD, a[0], a[1]); }
static long sys_mkdirat(zb_sandbox *sb, const uint64_t a[6]) { return do_mkdir(sb, (int)a[0], a[1], a[2]); }

static long do_symlink(zb_sandbox *sb, uint64_t utarget, int64_t dirfd, uint64_t upath) {
    char target[PATH_MAX];
    long rc = zb_guest_string(sb, utarget, target, sizeof target);
    if (rc < 0) return rc;
    if (!target[0]) return -ENOENT;
    zb_resolved r;
    if ((rc = creatable(sb, dirfd, upath, &r)) < 0) return rc;
    if (rc == ON_HOST) return on_host(&r, host_symlink, target);
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_SYMLINK, 0777);
    if (!ino) return -ENOSPC;
    if ((rc = zb_ovl_set_target(sb->fs, ino, target)) < 0 || (rc = zb_ovl_link(sb->fs, r.parent.ino, r.name, ino)) < 0)
        zb_ovl_discard(sb->fs, ino);
    return rc;
}
static long sys_symlink(zb_sandbox *sb, const uint64_t a[6]) { return do_symlink(sb, a[0], AT_FDCWD, a[1]); }
static long sys_symlinkat(zb_sandbox *sb, const uint64_t a[6]) { return do_symlink(sb, a[0], (int)a[1], a[2]); }

long zb_fs_mksock(zb_sandbox *sb, const char *path, uint64_t bind_id) {
    zb_resolved r;
    long rc = zb_fs_resolve(sb, sb->proc.cwd, path, ZB_RESOLVE_NOFOLLOW, &r);
    if (rc < 0) return rc;
    if (r.exists) return -EADDRINUSE;
    if ((rc = creatable_at(sb, &r)) == ON_HOST) {
        zb_log(sb, "bind(AF_UNIX, %s) refused with EACCES: socket files can be made only in the sandbox's own "
               "files (such as /tmp), never in a host folder", path);
        return -EACCES;
    }
    if (rc < 0) return rc;
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_SOCKET, 0777 & ~sb->proc.umask);
    if (!ino) return -ENOSPC;
    zb_ovl_inode(sb->fs, ino)->sock_id = bind_id;
    if ((rc = zb_ovl_link(sb->fs, r.parent.ino, r.name, ino)) < 0) zb_ovl_discard(sb->fs, ino);
    return rc;
}

/* mknod/mknodat: a regular file (S_IFREG or 0), in the overlay or, in a read-write folder, on the
 * host as open(O_CREAT | O_EXCL) would make it; a FIFO (S_IFIFO, what mkfifo(3) calls), in the
 * sandbox's own files only (file_fifo.c). Devices need CAP_MKNOD, which the guest's uid lacks
 * (EPERM). Socket files are made by bind(2) only: after the checks any creation makes (EEXIST,
 * EROFS in a read-only folder, ...) mknod(S_IFSOCK) answers ENOSYS, with one log line saying why.
 * A FIFO in a read-write folder is EPERM, what Linux answers on a file system without FIFOs (vfat):
 * made on the host, guest data would put a node there that blocks whoever opens it (the user's
 * editor, a backup); kept in the overlay, it would be a name the folder itself never shows
 * (%sandbox diff and export read the host there). */
static long do_mknod(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t mode, uint64_t dev) {
    (void)dev;
    unsigned type = (unsigned)mode & S_IFMT;
    if (type != 0 && type != S_IFREG && type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR && type != S_IFBLK)
        return -EINVAL;
    if (type == S_IFCHR || type == S_IFBLK) return -EPERM; /* no CAP_MKNOD */
    zb_resolved r;
    long rc = creatable(sb, dirfd, upath, &r);
    if (rc < 0) return rc;
    if (type == S_IFSOCK) {
        if (!sb->logged_mknod) {
            sb->logged_mknod = 1;
            zb_log(sb, "mknod(S_IFSOCK) answered ENOSYS: socket files made by mknod are not implemented; "
                       "bind(2) an AF_UNIX socket to the path instead");
        }
        return -ENOSYS;
    }
    unsigned perm = (unsigned)mode & 07777 & ~sb->proc.umask;
    if (rc == ON_HOST && type == S_IFIFO) {
        zb_log(sb, "mknod(S_IFIFO, mkfifo) of %s refused with EPERM: FIFOs can be made only in the sandbox's own "
                   "files (such as /tmp), never in a host folder", r.path);
        return -EPERM;
    }
    if (rc == ON_HOST) {
        int fd = zb_proj_host_open(&r, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, perm & ZB_HOST_MODE_BITS);
        if (fd < 0) return fd;
        close(fd);
        return 0;
    }
    uint32_t ino = zb_ovl_new_inode(sb->fs, type == S_IFIFO ? INO_FIFO : INO_FILE, perm);
    if (!ino) return -ENOSPC;
    if ((rc = zb_ovl_link(sb->fs, r.parent.ino, r.name, ino)) < 0) zb_ovl_discard(sb->fs, ino);
    return rc;
}
static long sys_mknod(zb_sandbox *sb, const uint64_t a[6]) { return do_mknod(sb, AT_FDCWD, a[0], a[1], a[2]); }
static long sys_mknodat(zb_sandbox *sb, const uint64_t a[6]) { return do_mknod(sb, (int)a[0], a[1], a[2], a[3]); }

/* The overlay entry a path names, for unlink/rename. */
static long overlay_entry(zb_sandbox *sb, int64_t dirfd, uint64_t upath, zb_resolved *r) {
    long rc = zb_path_arg(sb, dirfd, upath, ZB_RESOLVE_NOFOLLOW, 0, r);
    if (rc < 0) return rc;
    if (!r->exists) return -ENOENT;
    if (r->loc.mnode) return r->loc.kind == LOC_OVERLAY ? -EBUSY : -EROFS; /* a mount point */
    if (r->loc.proj == PROJ_READONLY) return -EROFS;
    if (r->loc.proj == PROJ_READWRITE) return ON_HOST;
    if (r->loc.proj == PROJ_OVERLAY) return IN_PROJECT;
    if (r->loc.kind != LOC_OVERLAY || r->parent.kind != LOC_OVERLAY) return -EROFS;
    return 0;
}

static long do_unlink(zb_sandbox *sb, int64_t dirfd, uint64_t upath, int flags) {
    if (flags & ~AT_REMOVEDIR) return -EINVAL;
    zb_resolved r;
    long rc = overlay_entry(sb, dirfd, upath, &r);
    if (rc < 0) return rc;
    if (rc != 0) {
        if ((flags & AT_REMOVEDIR) && !r.loc.is_dir) return -ENOTDIR;
        if (!(flags & AT_REMOVEDIR) && r.loc.is_dir) return -EISDIR;
        return rc == ON_HOST ? on_host(&r, host_unlink, &flags) : zb_proj_remove(sb, &r, flags & AT_REMOVEDIR);
    }
    zb_inode *in = zb_ovl_inode(sb->fs, r.loc.ino);
    if (flags & AT_REMOVEDIR) {
        if (in->type != INO_DIR) return -ENOTDIR;
        if (in->nents) return -ENOTEMPTY;
    } else if (in->type == INO_DIR) {
        return -EISDIR;
    }
    return zb_ovl_unlink(sb->fs, r.parent.ino, r.name);
}
static long sys_unlink(zb_sandbox *sb, const uint64_t a[6]) { return do_unlink(sb, AT_FDCWD, a[0], 0); }

/* Hard links, within the overlay only: a view file or a file the host put in place lives on
 * another filesystem (EXDEV), and directories cannot be linked (EPERM). */
static long do_link(zb_sandbox *sb, int64_t olddir, uint64_t uold, int64_t newdir, uint64_t unew, int flags) {
    if (flags & ~(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH)) return -EINVAL;
    zb_resolved from, to;
    long rc = zb_path_arg(sb, olddir, uold, (flags & AT_SYMLINK_FOLLOW) ? 0 : ZB_RESOLVE_NOFOLLOW, flags & AT_EMPTY_PATH, &from);
    if (rc < 0) return rc;
    if (!from.exists) return -ENOENT;
    if (from.loc.is_dir) return -EPERM;
    if (from.loc.kind == LOC_OVERLAY) { /* a memfd never gets a name: on Linux it lives on the kernel's
                                          own shmem mount, so a link anywhere is across mounts */
        const zb_inode *in = zb_ovl_inode(sb->fs, from.loc.ino);
        if (in && in->memfd) return -EXDEV;
    }
    if ((rc = creatable(sb, newdir, unew, &to)) < 0) return rc;
    if (rc == ON_HOST || from.loc.kind != LOC_OVERLAY || from.loc.mnode) return -EXDEV;
    return zb_ovl_link(sb->fs, to.parent.ino, to.name, from.loc.ino);
}
static long sys_link(zb_sandbox *sb, const uint64_t a[6]) { return do_link(sb, AT_FDCWD, a[0], AT_FDCWD, a[1], 0); }
static long sys_linkat(zb_sandbox *sb, const uint64_t a[6]) { return do_link(sb, (int)a[0], a[1], (int)a[2], a[3], (int)a[4]); }
static long sys_rmdir(zb_sandbox *sb, const uint64_t a[6]) { return do_unlink(sb, AT_FDCWD, a[0], AT_REMOVEDIR); }
static long sys_unlinkat(zb_sandbox *sb, const uint64_t a[6]) { return do_unlink(sb, (int)a[0], a[1], (int)a[2]); }

/* rename within a read-write project: renameat2 between the two confined parent directories */
static long rename_on_host(const zb_resolved *from, const zb_resolved *to, uint64_t flags) {
    char n1[NAME_MAX + 1], n2[NAME_MAX + 1];
    int p1 = zb_proj_host_parent(from, n1, sizeof n1);
    if (p1 < 0) return p1;
    int p2 = zb_proj_host_parent(to, n2, sizeof n2);
    if (p2 < 0) { close(p1); return p2; }
    long rc = syscall(SYS_renameat2, p1, n1, p2, n2, (unsigned)flags) < 0 ? -errno : 0;
    close(p1);
    close(p2);
    return rc;
}

static long do_rename(zb_sandbox *sb, int64_t olddir, uint64_t uold, int64_t newdir, uint64_t unew, uint64_t flags) {
    if (flags & ~(uint64_t)RENAME_NOREPLACE) return -EINVAL; /* RENAME_EXCHANGE/WHITEOUT unsupported */
    zb_resolved from, to;
    long rc = overlay_entry(sb, olddir, uold, &from);
    if (rc < 0) return rc;
    long where = rc;
    if ((rc = zb_path_arg(sb, newdir, unew, ZB_RESOLVE_NOFOLLOW, 0, &to)) < 0) return rc;
    size_t fl = strlen(from.path);
    if (!strncmp(to.path, from.path, fl) && to.path[fl] == '/') return -EINVAL; /* into itself */
    int to_proj = to.exists ? to.loc.proj : to.parent.proj;
    if (where != 0 || to_proj) { /* a project on either side: both must be the same project */
        if (from.loc.proj != to_proj || from.loc.proj_root != (to.exists ? to.loc.proj_root : to.parent.proj_root))
            return -EXDEV;
        if (to_proj == PROJ_READONLY || (to.exists && to.loc.mnode)) return -EROFS;
        if (where == ON_HOST) return rename_on_host(&from, &to, flags);
        if (from.loc.is_dir && from.loc.kind == LOC_HOST) return -EXDEV; /* host directories stay put */
        if ((rc = zb_proj_copy_up(sb, &from, 0)) < 0) return rc;
        if (to.exists) {
            if (flags & RENAME_NOREPLACE) return -EEXIST;
            if (!strcmp(to.path, from.path)) return 0;
            if (from.loc.is_dir != to.loc.is_dir) return from.loc.is_dir ? -ENOTDIR : -EISDIR;
            if ((rc = zb_proj_remove(sb, &to, to.loc.is_dir)) < 0) return rc;
        }
        if ((rc = zb_proj_copy_up(sb, &to, 1)) < 0) return rc;
        if ((rc = zb_ovl_link(sb->fs, to.parent.ino, to.name, from.loc.ino)) < 0) return rc;
        return zb_proj_remove(sb, &from, 0); /* drops the old name, leaving a whiteout if the host has one */
    }
    if (to.parent.kind != LOC_OVERLAY || (to.exists && (to.loc.mnode || to.loc.kind != LOC_OVERLAY))) return -EROFS;
    if (to.exists) {
        if (flags & RENAME_NOREPLACE) return -EEXIST;
        if (to.loc.ino == from.loc.ino) return 0;
        zb_inode *src = zb_ovl_inode(sb->fs, from.loc.ino), *dst = zb_ovl_inode(sb->fs, to.loc.ino);
        if (src->type == INO_DIR && dst->type != INO_DIR) return -ENOTDIR;
        if (src->type != INO_DIR && dst->type == INO_DIR) return -EISDIR;
        if (dst->type == INO_DIR && dst->nents) return -ENOTEMPTY;
        if ((rc = zb_ovl_unlink(sb->fs, to.parent.ino, to.name)) < 0) return rc;
    }
    if ((rc = zb_ovl_link(sb->fs, to.parent.ino, to.name, from.loc.ino)) < 0) return rc;
    return zb_ovl_unlink(sb->fs, from.parent.ino, from.name);
}

static long sys_rename(zb_sandbox *sb, const uint64_t a[6]) { return do_rename(sb, AT_FDCWD, a[0], AT_FDCWD, a[1], 0); }
static long sys_renameat(zb_sandbox *sb, const uint64_t a[6]) { return do_rename(sb, (int)a[0], a[1], (int)a[2], a[3], 0); }
static long sys_renameat2(zb_sandbox *sb, const uint64_t a[6]) { return do_rename(sb, (int)a[0], a[1], (int)a[2], a[3], a[4]); }

static long sys_getdents64(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    return f->ops->getdents ? f->ops->getdents(sb, f, a[1], a[2]) : -ENOTDIR;
}

static long overlay_file_for(zb_sandbox *sb, int64_t dirfd, uint64_t upath, int flags, uint32_t *ino) {
    zb_resolved r;
    long rc;
    if (!upath && (int)dirfd != AT_FDCWD) { /* futimens-style: the fd itself */
        zb_file *f = zb_fd_get(sb, (uint64_t)dirfd);
        if (!f) return -EBADF;
        uint32_t own = f->ops->overlay_ino ? f->ops->overlay_ino(f) : 0;
        if (!own) return -EROFS; /* host files, synthetic directories, streams */
        long denied = zb_file_write_check(f);
        if (denied) return denied;
        *ino = own;
        return 0;
    }
    if ((rc = zb_path_arg(sb, dirfd, upath, flags, flags & AT_EMPTY_PATH, &r)) < 0) return rc;
    if (!r.exists) return -ENOENT;
    if (r.loc.proj == PROJ_OVERLAY && !r.loc.mnode && (rc = zb_proj_copy_up(sb, &r, 0)) < 0) return rc;
    if (r.loc.proj == PROJ_READWRITE) return -EOPNOTSUPP; /* metadata of host files stays the host's */
    if (r.loc.kind != LOC_OVERLAY) return -EROFS;
    if (zb_ovl_inode(sb->fs, r.loc.ino)->readonly) return -EPERM;
    *ino = r.loc.ino;
    return 0;
}

static long sys_truncate(zb_sandbox *sb, const uint64_t a[6]) {
    zb_resolved r;
    if ((int64_t)a[1] < 0) return -EINVAL;
    if (zb_path_arg(sb, AT_FDCWD, a[0], 0, 0, &r) == 0 && r.exists && r.loc.proj == PROJ_READWRITE) {
        int fd = zb_proj_host_open(&r, O_WRONLY, 0);
        if (fd < 0) return fd;
        long rc = ftruncate(fd, (off_t)a[1]) < 0 ? -errno : 0;
        close(fd);
        return rc;
    }
    uint32_t ino;
    long rc = overlay_file_for(sb, AT_FDCWD, a[0], 0, &ino);
    return rc < 0 ? rc : zb_overlay_truncate(sb, ino, a[1]);
}

static long do_chmod(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t mode, int flags) {
    uint32_t ino;
    long rc = overlay_file_for(sb, dirfd, upath, flags, &ino);
    if (rc < 0) return rc;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    zb_inode *in = zb_ovl_inode(sb->fs, ino);
    in->mode = mode & 07777;
    in->ctime_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec; /* a status change */
    return 0;
}
static long sys_chmod(zb_sandbox *sb, const uint64_t a[6]) { return do_chmod(sb, AT_FDCWD, a[0], a[1], 0); }
static long sys_fchmodat(zb_sandbox *sb, const uint64_t a[6]) { return do_chmod(sb, (int)a[0], a[1], a[2], 0); }
static long sys_fchmod(zb_sandbox *sb, const uint64_t a[6]) { return do_chmod(sb, (int)a[0], 0, a[1], 0); }

/* One time of utimensat: 1 with *out set, 0 for UTIME_OMIT, -EINVAL for a bad tv_nsec. */
static int utime_value(const struct timespec *t, int64_t now, int64_t *out) {
    if (t->tv_nsec == UTIME_OMIT) return 0;
    if (t->tv_nsec == UTIME_NOW) { *out = now; return 1; }
    if (t->tv_nsec < 0 || t->tv_nsec >= 1000000000) return -EINVAL;
    /* times are kept in ns: clamp what does not fit (~292 years either side of 1970), as a
     * filesystem clamps to the range it can store, instead of overflowing */
    const int64_t max_sec = INT64_MAX / 1000000000 - 1;
    int64_t sec = t->tv_sec > max_sec ? max_sec : t->tv_sec < -max_sec ? -max_sec : t->tv_sec;
    *out = sec * 1000000000 + t->tv_nsec;
    return 1;
}

static long sys_utimensat(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[3] & ~(uint64_t)(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)) return -EINVAL;
    struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}}; /* NULL times: both now */
    if (a[2] && zb_copy_from_guest(sb, ts, a[2], sizeof ts) < 0) return -EFAULT;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    int64_t now = (int64_t)wall.tv_sec * 1000000000 + wall.tv_nsec, atime = 0, mtime = 0;
    int set_a = utime_value(&ts[0], now, &atime), set_m = utime_value(&ts[1], now, &mtime);
    if (set_a < 0 || set_m < 0) return -EINVAL;
    uint32_t ino;
    long rc = overlay_file_for(sb, (int)a[0], a[1], (a[3] & AT_SYMLINK_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0, &ino);
    if (rc < 0) return rc;
    zb_inode *in = zb_ovl_inode(sb->fs, ino);
    if (set_a) in->atime_ns = atime;
    if (set_m) in->mtime_ns = mtime;
    in->ctime_ns = now; /* any change of the inode's times is a status change */
    return 0;
}

/* ---- owners: files belong to the guest's user (1000) and keep belonging to it ---- */

/* chown to the owner it already has succeeds (what shutil.copystat-style code does); giving a file
 * away needs CAP_CHOWN, which the guest does not have (EPERM); the view is read-only (EROFS). */
static long do_chown(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t uid, uint64_t gid, int flags) {
    if (flags & ~(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)) return -EINVAL;
    zb_resolved r;
    long rc = zb_path_arg(sb, dirfd, upath, (flags & AT_SYMLINK_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0, flags & AT_EMPTY_PATH, &r);
    if (rc < 0) return rc;
    if (!r.exists) return -ENOENT;
    if (r.loc.kind != LOC_OVERLAY) return -EROFS;
    if (zb_ovl_inode(sb->fs, r.loc.ino)->readonly) return -EPERM;
    return zb_own_ids(uid, gid);
}
static long sys_chown(zb_sandbox *sb, const uint64_t a[6]) { return do_chown(sb, AT_FDCWD, a[0], a[1], a[2], 0); }
static long sys_lchown(zb_sandbox *sb, const uint64_t a[6]) { return do_chown(sb, AT_FDCWD, a[0], a[1], a[2], AT_SYMLINK_NOFOLLOW); }
static long sys_fchownat(zb_sandbox *sb, const uint64_t a[6]) { return do_chown(sb, (int)a[0], a[1], a[2], a[3], (int)a[4]); }
static long sys_fchown(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    /* the kind decides (the view is read-only); pipes, the console and the like are the guest's own */
    return f->ops->chown ? f->ops->chown(sb, f, a[1], a[2]) : zb_own_ids(a[1], a[2]);
}

/* ---- extended attributes: none are stored anywhere, as on a filesystem without xattr support:
 * listing gives nothing, reading and writing say EOPNOTSUPP (which shutil.copystat expects), and
 * the view is read-only. ENOSYS here would break shutil.copy2 and copytree. ---- */

static long xattr_target(zb_sandbox *sb, const uint64_t a[6], int by, int follow, zb_resolved *r, zb_file **f) {
    *f = NULL;
    if (by == 'f') {
        if (!(*f = zb_fd_get(sb, a[0]))) return -EBADF;
        if (!(*f)->where) return -EOPNOTSUPP; /* pipes and the console */
        *r = *(*f)->where;
        return 0;
    }
    long rc = zb_path_arg(sb, AT_FDCWD, a[0], follow ? 0 : ZB_RESOLVE_NOFOLLOW, 0, r);
    if (rc < 0) return rc;
    return r->exists ? 0 : -ENOENT;
}

static long xattr_name(zb_sandbox *sb, uint64_t uname) {
    char name[256];
    long rc = zb_guest_string(sb, uname, name, sizeof name);
    if (rc == -ENAMETOOLONG || (rc == 0 && !name[0])) return -ERANGE;
    return rc;
}

static long xattr_list(zb_sandbox *sb, const uint64_t a[6], int by, int follow) {
    zb_resolved r;
    zb_file *f;
    long rc = xattr_target(sb, a, by, follow, &r, &f);
    return rc == -EOPNOTSUPP ? 0 : rc; /* no names: an empty list */
}
static long sys_listxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_list(sb, a, 'p', 1); }
static long sys_llistxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_list(sb, a, 'l', 0); }
static long sys_flistxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_list(sb, a, 'f', 1); }

static long xattr_get(zb_sandbox *sb, const uint64_t a[6], int by, int follow) {
    zb_resolved r;
    zb_file *f;
    long rc = xattr_target(sb, a, by, follow, &r, &f);
    if (rc < 0) return rc;
    if ((rc = xattr_name(sb, a[1])) < 0) return rc;
    return -EOPNOTSUPP;
}
static long sys_getxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_get(sb, a, 'p', 1); }
static long sys_lgetxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_get(sb, a, 'l', 0); }
static long sys_fgetxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_get(sb, a, 'f', 1); }

static long xattr_change(zb_sandbox *sb, const uint64_t a[6], int by, int follow) {
    zb_resolved r;
    zb_file *f;
    long rc = xattr_target(sb, a, by, follow, &r, &f);
    if (rc < 0) return rc;
    if ((rc = xattr_name(sb, a[1])) < 0) return rc;
    if (r.loc.kind == LOC_HOST || r.loc.kind == LOC_SYNTH) return -EROFS;
    return -EOPNOTSUPP;
}
static long sys_setxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_change(sb, a, 'p', 1); }
static long sys_lsetxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_change(sb, a, 'l', 0); }
static long sys_fsetxattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_change(sb, a, 'f', 1); }
static long sys_removexattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_change(sb, a, 'p', 1); }
static long sys_lremovexattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_change(sb, a, 'l', 0); }
static long sys_fremovexattr(zb_sandbox *sb, const uint64_t a[6]) { return xattr_change(sb, a, 'f', 1); }

static long sys_umask(zb_sandbox *sb, const uint64_t a[6]) {
    unsigned old = sb->proc.umask;
    sb->proc.umask = a[0] & 0777;
    return old;
}

static long fill_statfs(zb_sandbox *sb, uint64_t addr) {
    struct statfs s;
    memset(&s, 0, sizeof s);
    s.f_type = 0x01021994; /* TMPFS_MAGIC */
    s.f_bsize = 4096;
    s.f_frsize = 4096;
    s.f_blocks = sb->fs->bytes_limit / 4096;
    s.f_bfree = s.f_bavail = (sb->fs->bytes_limit - ZB_MIN(sb->fs->bytes_used, sb->fs->bytes_limit)) / 4096;
    s.f_files = 1 << 20;
    s.f_ffree = (1 << 20) - sb->fs->ninodes;
    s.f_namelen = NAME_MAX;
    return zb_copy_to_guest(sb, addr, &s, sizeof s);
}
static long sys_statfs(zb_sandbox *sb, const uint64_t a[6]) {
    zb_resolved r;
    long rc = zb_path_arg(sb, AT_FDCWD, a[0], 0, 0, &r);
    if (rc < 0) return rc;
    return r.exists ? fill_statfs(sb, a[1]) : -ENOENT;
}
static long sys_fstatfs(zb_sandbox *sb, const uint64_t a[6]) {
    return zb_fd_get(sb, a[0]) ? fill_statfs(sb, a[1]) : -EBADF;
}

void zb_sys_fsmeta_register(zb_syscall_fn *t) {
    t[SYS_stat] = sys_stat;
    t[SYS_lstat] = sys_lstat;
    t[SYS_fstat] = sys_fstat;
    t[SYS_newfstatat] = sys_newfstatat;
    t[SYS_statx] = sys_statx;
    t[SYS_access] = sys_access;
    t[SYS_faccessat] = sys_faccessat;
    t[SYS_faccessat2] = sys_faccessat2;
    t[SYS_readlink] = sys_readlink;
    t[SYS_readlinkat] = sys_readlinkat;
    t[SYS_getcwd] = sys_getcwd;
    t[SYS_chdir] = sys_chdir;
    t[SYS_fchdir] = sys_fchdir;
    t[SYS_mkdir] = sys_mkdir;
    t[SYS_mkdirat] = sys_mkdirat;
    t[SYS_symlink] = sys_symlink;
    t[SYS_symlinkat] = sys_symlinkat;
    t[SYS_unlink] = sys_unlink;
    t[SYS_rmdir] = sys_rmdir;
    t[SYS_unlinkat] = sys_unlinkat;
    t[SYS_rename] = sys_rename;
    t[SYS_renameat] = sys_renameat;
    t[SYS_renameat2] = sys_renameat2;
    t[SYS_getdents64] = sys_getdents64;
    t[SYS_truncate] = sys_truncate;
    t[SYS_chmod] = sys_chmod;
    t[SYS_fchmod] = sys_fchmod;
    t[SYS_fchmodat] = sys_fchmodat;
    t[SYS_utimensat] = sys_utimensat;
    t[SYS_link] = sys_link;
    t[SYS_linkat] = sys_linkat;
    t[SYS_mknod] = sys_mknod;
    t[SYS_mknodat] = sys_mknodat;
    t[SYS_chown] = sys_chown;
    t[SYS_lchown] = sys_lchown;
    t[SYS_fchown] = sys_fchown;
    t[SYS_fchownat] = sys_fchownat;
    t[SYS_listxattr] = sys_listxattr;
    t[SYS_llistxattr] = sys_llistxattr;
    t[SYS_flistxattr] = sys_flistxattr;
    t[SYS_getxattr] = sys_getxattr;
    t[SYS_lgetxattr] = sys_lgetxattr;
    t[SYS_fgetxattr] = sys_fgetxattr;
    t[SYS_setxattr] = sys_setxattr;
    t[SYS_lsetxattr] = sys_lsetxattr;
    t[SYS_fsetxattr] = sys_fsetxattr;
    t[SYS_removexattr] = sys_removexattr;
    t[SYS_lremovexattr] = sys_lremovexattr;
    t[SYS_fremovexattr] = sys_fremovexattr;
    t[SYS_umask] = sys_umask;
    t[SYS_statfs] = sys_statfs;
    t[SYS_fstatfs] = sys_fstatfs;
    t[ZB_SYS_STAT_MANY] = sys_zb_stat_many;
}
