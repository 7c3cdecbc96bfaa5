/* fs_project.c - the notebook's own directory inside the sandbox (a "project" mount).
 *
 * The kernel's working directory on the host appears at the same path in the guest, so that
 * `pd.read_csv("data/sales.csv")` works unchanged. Three modes:
 *   READONLY   the host tree, read-only (EROFS on writes);
 *   OVERLAY    reads fall through to the host tree; every change lands in a private in-memory
 *              upper layer (copy-up of a host file on its first write, whiteouts for deletions),
 *              like overlayfs. The host is never changed, and the layer is part of the sandbox's
 *              state: snapshots, rewinds and forks carry it;
 *   READWRITE  changes go to the host, confined to the tree: every host call goes through the
 *              project's directory fd with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS).
 * Guest-side resolution (fs_namespace.c) already confines lookups to the guest namespace; the
 * host-side confinement of READWRITE is a second wall.
 */
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define COPY_CHUNK (1u << 20)

/* ---- mounting ---- */

int zb_fs_mount_project(zb_fs *fs, const char *host_dir, int mode, char *err) {
    if (mode != PROJ_READONLY && mode != PROJ_OVERLAY && mode != PROJ_READWRITE) {
        zb_seterr(err, "unknown project mode %d", mode);
        return -1;
    }
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(host_dir, real) || stat(real, &st) < 0 || !S_ISDIR(st.st_mode)) {
        zb_seterr(err, "%s is not a directory on the host", host_dir);
        return -1;
    }
    if (!strcmp(real, "/")) { zb_seterr(err, "the host's / cannot be a project directory"); return -1; }
    if (zb_fs_require_private(fs, err) < 0) return -1;
    char name[NAME_MAX + 1];
    zb_mnode *parent = zb_trie_parent(fs, real, name, err);
    if (!parent) return -1;
    zb_mnode *n = zb_mnode_child(parent, name);
    if (n && n->kind == MNT_PROJECT) return zb_fs_set_project_mode(fs, real, mode, err);
    if (n && n->kind != MNT_SYNTH) {
        zb_seterr(err, "%s is already part of the sandbox's file system (the Python installation, /tmp or the "
                       "home directory); run the notebook from another directory", real);
        return -1;
    }
    /* a synthetic directory (the project contains the venv, say) becomes the project; the view
     * entries below it stay in front, read-only */
    int fd = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC);
    uint32_t upper = zb_ovl_new_inode(fs, INO_DIR, st.st_mode & 07777);
    if (fd < 0 || !upper || (!n && !(n = zb_mnode_add(parent, name, MNT_PROJECT)))) {
        if (fd >= 0) close(fd);
        zb_seterr(err, "cannot mount %s: %s", real, strerror(fd < 0 ? errno : ENOMEM));
        return -1;
    }
    zb_ovl_inode(fs, upper)->nlink = 1; /* held by the mount point */
    /* the host folder's times show until the sandbox changes its entries (zb_fs_stat) */
    zb_ovl_inode(fs, upper)->mtime_ns = zb_ovl_inode(fs, upper)->ctime_ns = 0;
    n->kind = MNT_PROJECT;
    n->root_fd = fd;
    n->proj_mode = mode;
    n->ino = upper;
    return 0;
}

static zb_mnode *find_project(zb_fs *fs, const char *host_dir) {
    char real[PATH_MAX];
    if (!realpath(host_dir, real)) return NULL;
    zb_mnode *n = fs->root;
    const char *p = real;
    while (n && *p) {
        while (*p == '/') p++;
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char comp[NAME_MAX + 1];
        if (!len) break;
        if (len > NAME_MAX) return NULL;
        memcpy(comp, p, len);
        comp[len] = 0;
        n = zb_mnode_child(n, comp);
        p += len;
    }
    return n && n->kind == MNT_PROJECT ? n : NULL;
}

int zb_fs_set_project_mode(zb_fs *fs, const char *host_dir, int mode, char *err) {
    if (mode != PROJ_READONLY && mode != PROJ_OVERLAY && mode != PROJ_READWRITE) {
        zb_seterr(err, "unknown project mode %d", mode);
        return -1;
    }
    if (zb_fs_require_private(fs, err) < 0) return -1;
    zb_mnode *n = find_project(fs, host_dir);
    if (!n) { zb_seterr(err, "%s is not mounted in the sandbox", host_dir); return -1; }
    n->proj_mode = mode; /* the overlay layer stays: it shows again when back in overlay mode */
    return 0;
}

zb_loc zb_proj_root_loc(zb_sandbox *sb, zb_mnode *m) {
    (void)sb;
    zb_loc l;
    memset(&l, 0, sizeof l);
    l.kind = LOC_HOST;
    l.mnode = m;
    l.is_dir = l.host_is_dir = 1;
    l.proj = m->proj_mode;
    l.proj_root = m;
    l.lower = 1;
    l.upper = m->proj_mode == PROJ_OVERLAY ? m->ino : 0;
    return l;
}

/* The guest (== host) path of a trie node. */
int zb_mnode_path(const zb_mnode *m, char *buf, size_t cap) {
    if (!m->parent) { snprintf(buf, cap, "/"); return 0; }
    char parent[PATH_MAX];
    if (zb_mnode_path(m->parent, parent, sizeof parent) < 0) return -1;
    int n = snprintf(buf, cap, "%s%s%s", parent, strcmp(parent, "/") ? "/" : "", m->name);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

int zb_proj_host_path(const zb_resolved *r, char *rel, size_t cap) {
    const zb_mnode *root = r->loc.proj_root ? r->loc.proj_root : r->parent.proj_root;
    char rp[PATH_MAX];
    if (!root || zb_mnode_path(root, rp, sizeof rp) < 0) return -EINVAL;
    size_t n = strlen(rp);
    if (strncmp(r->path, rp, n) || (r->path[n] && r->path[n] != '/')) return -EXDEV;
    snprintf(rel, cap, "%s", r->path[n] ? r->path + n + 1 : ".");
    return root->root_fd;
}

int zb_host_lstat(const char *path, struct stat *st) { return lstat(path, st) < 0 ? -errno : 0; }

int zb_proj_host_parent(const zb_resolved *r, char *name, size_t cap) {
    char rel[PATH_MAX];
    int root = zb_proj_host_path(r, rel, sizeof rel);
    if (root < 0) return root;
    char *slash = strrchr(rel, '/');
    snprintf(name, cap, "%s", slash ? slash + 1 : rel);
    if (slash) *slash = 0;
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC, .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS};
    int fd = (int)syscall(SYS_openat2, root, slash ? rel : ".", &how, sizeof how);
    return fd < 0 ? -errno : fd;
}

int zb_proj_host_open(const zb_resolved *r, int flags, unsigned mode) {
    char rel[PATH_MAX];
    int root = zb_proj_host_path(r, rel, sizeof rel);
    if (root < 0) return root;
    /* O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader (zb_host_open) */
    struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY),
                           .mode = (flags & O_CREAT) ? mode : 0, .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS};
    int fd = (int)syscall(SYS_openat2, root, rel, &how, sizeof how);
    return fd < 0 ? -errno : zb_host_fd_ordinary(fd);
}

/* ---- lookups and listings in overlay mode ---- */

int zb_proj_lookup(zb_sandbox *sb, const zb_loc *dir, const char *path, const char *name, zb_loc *out, char *link) {
    memset(out, 0, sizeof *out);
    out->proj = dir->proj;
    out->proj_root = dir->proj_root;
    char hp[PATH_MAX];
    int n = snprintf(hp, sizeof hp, "%s/%s", path, name);
    if (n < 0 || (size_t)n >= sizeof hp) return -ENAMETOOLONG;
    zb_inode *ud = dir->upper ? zb_ovl_inode(sb->fs, dir->upper) : NULL;
    int dir_lower = dir->lower && !(ud && ud->opaque);
    uint32_t up = ud ? zb_ovl_lookup(sb->fs, dir->upper, name) : 0;
    struct stat st;
    if (up) {
        zb_inode *in = zb_ovl_inode(sb->fs, up);
        if (in->type == INO_WHITEOUT) return -ENOENT;
        out->kind = LOC_OVERLAY;
        out->ino = out->upper = up;
        if (in->type == INO_SYMLINK) { snprintf(link, PATH_MAX, "%s", in->target); return 1; }
        if (in->type == INO_DIR) {
            out->is_dir = 1;
            out->lower = dir_lower && !in->opaque && lstat(hp, &st) == 0 && S_ISDIR(st.st_mode);
        }
        return 0;
    }
    if (!dir_lower || lstat(hp, &st) < 0) return -ENOENT;
    out->kind = LOC_HOST;
    out->lower = 1;
    out->is_dir = out->host_is_dir = S_ISDIR(st.st_mode);
    if (S_ISLNK(st.st_mode)) {
        ssize_t k = readlink(hp, link, PATH_MAX - 1);
        if (k < 0) return -ENOENT;
        link[k] = 0;
        return 1;
    }
    return 0;
}

int zb_proj_list(zb_sandbox *sb, const zb_resolved *r, zb_listing *out) {
    const zb_loc *l = &r->loc;
    zb_inode *ud = l->upper ? zb_ovl_inode(sb->fs, l->upper) : NULL;
    zb_listing hide;
    memset(&hide, 0, sizeof hide);
    int ret = 0;
    for (size_t i = 0; ud && i < ud->nents && !ret; i++) {
        zb_inode *c = zb_ovl_inode(sb->fs, ud->ents[i].ino);
        if (c->type == INO_WHITEOUT) ret = zb_listing_add(&hide, ud->ents[i].name, DT_UNKNOWN, 0);
        else ret = zb_listing_add(out, ud->ents[i].name, c->type == INO_DIR ? DT_DIR : c->type == INO_SYMLINK ? DT_LNK : DT_REG,
                                  ud->ents[i].ino);
    }
    if (!ret && l->lower && !(ud && ud->opaque)) ret = zb_list_host_dir(r->path, out, &hide);
    zb_listing_free(&hide);
    return ret;
}

/* ---- copy-up (overlay mode) ---- */

/* The upper-layer directory for r's parent, creating upper directories along the path from the
 * project root as needed (mirroring the host directories' modes). */
static int upper_parent(zb_sandbox *sb, const zb_resolved *r, uint32_t *out) {
    const zb_mnode *root = r->loc.proj_root ? r->loc.proj_root : r->parent.proj_root;
    char rp[PATH_MAX];
    if (!root || zb_mnode_path(root, rp, sizeof rp) < 0) return -EINVAL;
    size_t rl = strlen(rp);
    if (strncmp(r->path, rp, rl) || r->path[rl] != '/') return -EXDEV;
    uint32_t cur = root->ino;
    char walked[PATH_MAX];
    snprintf(walked, sizeof walked, "%s", rp);
    const char *p = r->path + rl + 1;
    for (;;) {
        const char *slash = strchr(p, '/');
        if (!slash) break; /* the last component is r itself */
        size_t len = (size_t)(slash - p);
        char comp[NAME_MAX + 1];
        if (len > NAME_MAX) return -ENAMETOOLONG;
        memcpy(comp, p, len);
        comp[len] = 0;
        size_t wl = strlen(walked);
        snprintf(walked + wl, sizeof walked - wl, "/%s", comp);
        uint32_t c = zb_ovl_lookup(sb->fs, cur, comp);
        zb_inode *ci = c ? zb_ovl_inode(sb->fs, c) : NULL;
        if (ci && ci->type != INO_DIR) return ci->type == INO_WHITEOUT ? -ENOENT : -ENOTDIR;
        if (!c) {
            struct stat st;
            int mode = lstat(walked, &st) == 0 ? (int)(st.st_mode & 07777) : 0755;
            if (!(c = zb_ovl_new_inode(sb->fs, INO_DIR, (uint32_t)mode))) return -ENOSPC;
            int rc = zb_ovl_link(sb->fs, cur, comp, c);
            if (rc < 0) { zb_ovl_discard(sb->fs, c); return rc; }
        }
        cur = c;
        p = slash + 1;
    }
    *out = cur;
    return 0;
}

static int copy_host_file(zb_sandbox *sb, const char *path, uint32_t ino) {
    int fd = zb_host_open_ro(path, 0);
    if (fd < 0) return fd;
    uint8_t *buf = malloc(COPY_CHUNK);
    int rc = buf ? 0 : -ENOMEM;
    for (uint64_t off = 0; !rc;) {
        ssize_t n = pread(fd, buf, COPY_CHUNK, (off_t)off);
        if (n < 0) { rc = -errno; break; }
        if (n == 0) break;
        long w = zb_ovl_write(sb->fs, ino, buf, (size_t)n, off);
        if (w < 0) rc = (int)w;
        else if (w < n) rc = -ENOSPC;
        off += (uint64_t)n;
    }
    free(buf);
    close(fd);
    return rc;
}

int zb_proj_copy_up(zb_sandbox *sb, zb_resolved *r, int create) {
    uint32_t parent;
    int rc = upper_parent(sb, r, &parent);
    if (rc < 0) return rc;
    r->parent.kind = LOC_OVERLAY;
    r->parent.ino = r->parent.upper = parent;
    r->parent.is_dir = 1;
    uint32_t existing = zb_ovl_lookup(sb->fs, parent, r->name);
    if (create) {
        if (existing && zb_ovl_inode(sb->fs, existing)->type == INO_WHITEOUT) {
            zb_ovl_unlink(sb->fs, parent, r->name); /* the new entry replaces what was deleted */
            r->opaque = 1;                           /* and a new directory must not show the old one */
        }
        return 0;
    }
    if (r->loc.kind == LOC_OVERLAY) return 0; /* already in the upper layer */
    struct stat st;
    if (lstat(r->path, &st) < 0) return -errno;
    uint32_t ino;
    if (S_ISDIR(st.st_mode)) {
        ino = zb_ovl_new_inode(sb->fs, INO_DIR, st.st_mode & 07777);
    } else if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(r->path, target, sizeof target - 1);
        if (n < 0) return -errno;
        target[n] = 0;
        ino = zb_ovl_new_inode(sb->fs, INO_SYMLINK, 0777);
        if (ino && (rc = zb_ovl_set_target(sb->fs, ino, target)) < 0) { zb_ovl_discard(sb->fs, ino); return rc; }
    } else if (S_ISREG(st.st_mode)) {
        ino = zb_ovl_new_inode(sb->fs, INO_FILE, st.st_mode & 07777);
        if (ino && (rc = copy_host_file(sb, r->path, ino)) < 0) {
            zb_ovl_open_ref(sb->fs, ino, 0); /* unlinked and unopened: releases the half copy */
            return rc;
        }
    } else {
        return -EOPNOTSUPP; /* devices, fifos, sockets in the project: not copied */
    }
    if (!ino) return -ENOSPC;
    zb_inode *in = zb_ovl_inode(sb->fs, ino);
    in->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if ((rc = zb_ovl_link(sb->fs, parent, r->name, ino)) < 0) { zb_ovl_discard(sb->fs, ino); return rc; }
    r->loc.kind = LOC_OVERLAY;
    r->loc.ino = r->loc.upper = ino;
    r->loc.lower = S_ISDIR(st.st_mode);
    return 0;
}

int zb_proj_remove(zb_sandbox *sb, zb_resolved *r, int dir) {
    if (dir) {
        zb_listing l;
        int rc = zb_fs_list(sb, r, &l);
        if (rc < 0) return rc;
        size_t n = l.n;
        zb_listing_free(&l);
        if (n > 2) return -ENOTEMPTY; /* more than . and .. */
    }
    uint32_t parent;
    int rc = upper_parent(sb, r, &parent);
    if (rc < 0) return rc;
    int had_lower = r->loc.kind == LOC_HOST || r->loc.lower;
    if (!had_lower && r->loc.kind == LOC_OVERLAY) {
        struct stat st; /* an upper file can shadow a host file of the same name */
        had_lower = lstat(r->path, &st) == 0;
    }
    uint32_t up = zb_ovl_lookup(sb->fs, parent, r->name);
    if (up) {
        zb_inode *in = zb_ovl_inode(sb->fs, up);
        while (in->type == INO_DIR && in->nents) /* only whiteouts are left in it */
            zb_ovl_unlink(sb->fs, up, in->ents[0].name);
        if ((rc = zb_ovl_unlink(sb->fs, parent, r->name)) < 0) return rc;
    }
    if (!had_lower) return 0;
    uint32_t wh = zb_ovl_new_inode(sb->fs, INO_WHITEOUT, 0);
    if (!wh) return -ENOSPC;
    if ((rc = zb_ovl_link(sb->fs, parent, r->name, wh)) < 0) zb_ovl_discard(sb->fs, wh);
    return rc;
}

/* ---- diff and export ---- */

typedef struct {
    char *buf;
    size_t len, used;
} text_out;

static void emit(text_out *t, char tag, const char *rel) {
    int n = snprintf(t->buf && t->used < t->len ? t->buf + t->used : NULL,
                     t->buf && t->used < t->len ? t->len - t->used : 0, "%c\t%s\n", tag, rel);
    if (n > 0) t->used += (size_t)n;
}

static void diff_dir(zb_sandbox *sb, uint32_t dir, const char *host, const char *rel, text_out *t) {
    zb_inode *d = zb_ovl_inode(sb->fs, dir);
    for (size_t i = 0; d && i < d->nents; i++) {
        char h[PATH_MAX], r[PATH_MAX];
        snprintf(h, sizeof h, "%s/%s", host, d->ents[i].name);
        snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", d->ents[i].name);
        zb_inode *c = zb_ovl_inode(sb->fs, d->ents[i].ino);
        struct stat st;
        int on_host = lstat(h, &st) == 0;
        if (c->type == INO_WHITEOUT) emit(t, 'D', r);
        else if (c->type == INO_DIR) {
            if (!on_host || c->opaque) emit(t, on_host ? 'M' : 'A', r);
            diff_dir(sb, d->ents[i].ino, h, r, t);
        } else {
            emit(t, on_host ? 'M' : 'A', r);
        }
    }
}

long zb_project_diff(zb_sandbox *sb, const char *host_dir, char *buf, size_t len, char *err) {
    zb_mnode *m = find_project(sb->fs, host_dir);
    if (!m) { zb_seterr(err, "%s is not mounted in the sandbox", host_dir); return -1; }
    char rp[PATH_MAX];
    zb_mnode_path(m, rp, sizeof rp);
    text_out t = {buf, len, 0};
    diff_dir(sb, m->ino, rp, "", &t);
    if (buf && t.used < len) buf[t.used] = 0;
    return (long)t.used;
}

/* ---- reading what the guest sees (for export, done by the host side) ---- */

long zb_guest_read_file(zb_sandbox *sb, const char *guest_path, uint64_t offset, void *buf, size_t len, char *err) {
    zb_resolved r;
    int rc = zb_fs_resolve(sb, sb->proc.cwd, guest_path, 0, &r);
    if (rc < 0 || !r.exists) { zb_seterr(err, "%s does not exist in the sandbox", guest_path); return -1; }
    if (r.loc.is_dir) { zb_seterr(err, "%s is a directory", guest_path); return -1; }
    if (r.loc.kind == LOC_OVERLAY) {
        long n = zb_ovl_read(sb->fs, r.loc.ino, buf, len, offset);
        if (n < 0) { zb_seterr(err, "%s: %s", guest_path, strerror((int)-n)); return -1; }
        return n;
    }
    if (r.loc.kind != LOC_HOST) { zb_seterr(err, "%s is not a regular file", guest_path); return -1; }
    int fd = zb_host_open_ro(r.path, 0);
    if (fd < 0) { zb_seterr(err, "%s: %s", guest_path, strerror(-fd)); return -1; }
    long n = pread(fd, buf, len, (off_t)offset);
    if (n < 0) zb_seterr(err, "%s: %s", guest_path, strerror(errno));
    close(fd);
    return n;
}

long zb_guest_list_dir(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err) {
    zb_resolved r;
    zb_listing l;
    int rc = zb_fs_resolve(sb, sb->proc.cwd, guest_path, 0, &r);
    if (rc < 0 || !r.exists || !r.loc.is_dir) { zb_seterr(err, "%s is not a directory in the sandbox", guest_path); return -1; }
    if ((rc = zb_fs_list(sb, &r, &l)) < 0) { zb_seterr(err, "%s: %s", guest_path, strerror(-rc)); return -1; }
    text_out t = {buf, len, 0};
    for (size_t i = 0; i < l.n; i++) {
        if (!strcmp(l.ents[i].name, ".") || !strcmp(l.ents[i].name, "..")) continue;
        emit(&t, l.ents[i].type == DT_DIR ? 'd' : l.ents[i].type == DT_LNK ? 'l' : 'f', l.ents[i].name);
    }
    zb_listing_free(&l);
    if (buf && t.used < len) buf[t.used] = 0;
    return (long)t.used;
}
