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
    zb_proj_policy *policy = zb_proj_policy_new(mode);
    if (fd < 0 || !upper || !policy || (!n && !(n = zb_mnode_add(parent, name, MNT_PROJECT)))) {
        if (fd >= 0) close(fd);
        zb_proj_policy_unref(policy);
        zb_seterr(err, "cannot mount %s: %s", real, strerror(fd < 0 ? errno : ENOMEM));
        return -1;
    }
    zb_ovl_inode(fs, upper)->nlink = 1; /* held by the mount point */
    /* the host folder's times show until the sandbox changes its entries (zb_fs_stat) */
    zb_ovl_inode(fs, upper)->mtime_ns = zb_ovl_inode(fs, upper)->ctime_ns = 0;
    n->kind = MNT_PROJECT;
    n->root_fd = fd;
    n->policy = policy;
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

/* ---- hidden paths (credentials in a home directory used as the notebook's folder) ----
 * A project node keeps its hidden paths, relative to the folder, as '\n'-separated text in
 * `target` (copied and freed with the node). A hidden path and everything under it is absent
 * from the guest's view of the host folder: lookups say ENOENT, listings leave it out, and in
 * readwrite mode no host call reaches it (EACCES), so it cannot be created or replaced either.
 * The guest may still make a private entry of that name in overlay mode (it never reaches the
 * host, and never shows the host's). */

int zb_fs_project_hide(zb_fs *fs, const char *host_dir, const char *paths, char *err) {
    if (zb_fs_require_private(fs, err) < 0) return -1;
    zb_mnode *n = find_project(fs, host_dir);
    if (!n) { zb_seterr(err, "%s is not mounted in the sandbox", host_dir); return -1; }
    char *copy = paths && paths[0] ? strdup(paths) : NULL;
    if (paths && paths[0] && !copy) { zb_seterr(err, "out of memory"); return -1; }
    free(n->target);
    n->target = copy;
    return 0;
}

/* 1 if host_path (absolute) is a hidden path of the project `root`, or below one. */
int zb_proj_hidden(const zb_mnode *root, const char *host_path) {
    if (!root || !root->target) return 0;
    char rp[PATH_MAX];
    if (zb_mnode_path(root, rp, sizeof rp) < 0) return 0;
    size_t rl = strlen(rp);
    if (strncmp(host_path, rp, rl) || host_path[rl] != '/') return 0;
    const char *rel = host_path + rl + 1;
    for (const char *h = root->target; *h;) {
        const char *e = strchr(h, '\n');
        size_t hl = e ? (size_t)(e - h) : strlen(h);
        if (hl && !strncmp(rel, h, hl) && (rel[hl] == 0 || rel[hl] == '/')) return 1;
        h += hl + (e ? 1 : 0);
    }
    return 0;
}

/* Add to `hide` the hidden entries that are direct children of dir_path (absolute). */
int zb_proj_hidden_children(const zb_mnode *root, const char *dir_path, zb_listing *hide) {
    if (!root || !root->target) return 0;
    char rp[PATH_MAX];
    if (zb_mnode_path(root, rp, sizeof rp) < 0) return 0;
    size_t rl = strlen(rp);
    if (strncmp(dir_path, rp, rl) || (dir_path[rl] && dir_path[rl] != '/')) return 0;
    const char *rel = dir_path[rl] ? dir_path + rl + 1 : "";
    size_t dl = strlen(rel);
    for (const char *h = root->target; *h;) {
        const char *e = strchr(h, '\n');
        size_t hl = e ? (size_t)(e - h) : strlen(h);
        const char *name = NULL;
        if (!dl) name = h;
        else if (hl > dl && !strncmp(h, rel, dl) && h[dl] == '/') name = h + dl + 1;
        size_t nl = name ? hl - (size_t)(name - h) : 0;
        if (name && nl && nl <= NAME_MAX && !memchr(name, '/', nl)) {
            char buf[NAME_MAX + 1];
            memcpy(buf, name, nl);
            buf[nl] = 0;
            int rc = zb_listing_add(hide, buf, DT_UNKNOWN, 0);
            if (rc < 0) return rc;
        }
        h += hl + (e ? 1 : 0);
    }
    return 0;
}

int zb_fs_set_project_mode(zb_fs *fs, const char *host_dir, int mode, char *err) {
    if (mode != PROJ_READONLY && mode != PROJ_OVERLAY && mode != PROJ_READWRITE) {
        zb_seterr(err, "unknown project mode %d", mode);
        return -1;
    }
    zb_mnode *n = find_project(fs, host_dir);
    if (!n || !n->policy) { zb_seterr(err, "%s is not mounted in the sandbox", host_dir); return -1; }
    /* the overlay layer stays: it shows again when back in overlay mode */
    atomic_store(&n->policy->mode, mode);
    return 0;
}

zb_proj_policy *zb_proj_policy_new(int mode) {
    zb_proj_policy *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    atomic_init(&p->refs, 1);
    atomic_init(&p->mode, mode);
    return p;
}

void zb_proj_policy_unref(zb_proj_policy *p) {
    if (p && atomic_fetch_sub(&p->refs, 1) == 1) free(p);
}

/* Walk the trie without recursion (parent links): fn on each project node; stops at fn's -1. */
static int each_project(zb_mnode *root, int (*fn)(zb_mnode *n)) {
    zb_mnode *n = root;
    while (n) {
        if (n->kind == MNT_PROJECT && fn(n) < 0) return -1;
        if (n->nchildren) { n = n->children[0]; continue; }
        for (;;) { /* up to the next sibling */
            zb_mnode *p = n->parent;
            if (!p) return 0;
            size_t i = 0;
            while (i < p->nchildren && p->children[i] != n) i++;
            if (i + 1 < p->nchildren) { n = p->children[i + 1]; break; }
            n = p;
        }
    }
    return 0;
}

static int found(zb_mnode *n) { (void)n; return -1; }
int zb_fs_has_project(const zb_fs *fs) { return each_project(fs->root, found) < 0; }

static int own_policy(zb_mnode *n) {
    zb_proj_policy *p = zb_proj_policy_new(zb_mnode_proj_mode(n));
    if (!p) return -1;
    zb_proj_policy_unref(n->policy);
    n->policy = p;
    return 0;
}
int zb_fs_own_policies(zb_fs *fs) { return each_project(fs->root, own_policy); }

int zb_file_write_check(const zb_file *f) {
    const zb_resolved *w = f->where;
    if (!w) return 0;
    const zb_mnode *root = w->loc.proj_root ? w->loc.proj_root : w->parent.proj_root;
    int opened = w->loc.proj_root ? w->loc.proj : w->parent.proj;
    return root && zb_mnode_proj_mode(root) != opened ? -EROFS : 0;
}

zb_loc zb_proj_root_loc(zb_sandbox *sb, zb_mnode *m) {
    (void)sb;
    zb_loc l;
    memset(&l, 0, sizeof l);
    l.kind = LOC_HOST;
    l.mnode = m;
    l.is_dir = l.host_is_dir = 1;
    l.proj = zb_mnode_proj_mode(m);
    l.proj_root = m;
    l.lower = 1;
    l.upper = l.proj == PROJ_OVERLAY ? m->ino : 0;
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
    if (zb_proj_hidden(root, r->path)) return -EACCES;
    snprintf(rel, cap, "%s", r->path[n] ? r->path + n + 1 : ".");
    return root->root_fd;
}

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
    if (zb_host_fd_room() < 0) return -EMFILE;
    char rel[PATH_MAX];
    int root = zb_proj_host_path(r, rel, sizeof rel);
    if (root < 0) return root;
    /* O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader (zb_host_open).
     * The mode keeps permission bits only: a guest never creates a setuid, setgid or sticky file
     * on the host (ZB_HOST_MODE_BITS). */
    struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY),
                           .mode = (flags & O_CREAT) ? (mode & ZB_HOST_MODE_BITS) : 0,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS};
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
    int dir_lower = dir->lower && !(ud && ud->opaque) && !zb_proj_hidden(dir->proj_root, hp);
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
    if (!ret) ret = zb_proj_hidden_children(l->proj_root, r->path, &hide);
    if (!ret && l->lower && !(ud && ud->opaque)) ret = zb_list_host_dir_for(sb, r->path, out, &hide);
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

/* ---- diff and export: structured records for the host side ----
 *
 * Names come from the guest, so they can hold any byte but '/' and NUL (newlines, tabs, ...):
 * the listings are binary records with explicit lengths, never text to split (the format is in
 * zeroboot.h; zeroboot_kernel/native.py decodes and validates it). */

typedef struct {
    uint8_t *buf;
    size_t len, used;
} rec_out;

static void rec_put(rec_out *t, const void *p, size_t n) {
    if (t->buf && t->used + n <= t->len) memcpy(t->buf + t->used, p, n);
    t->used += n;
}

/* tag, u32 length, the relative path (ZB_DIFF_* records) */
static void emit_diff(rec_out *t, char tag, const char *rel, size_t rel_len) {
    size_t need = 1 + 4 + rel_len;
    if (t->buf && t->used + need > t->len) { t->used += need; return; } /* whole records only */
    uint8_t head[5];
    uint32_t n = (uint32_t)rel_len;
    head[0] = (uint8_t)tag;
    memcpy(head + 1, &n, 4);
    rec_put(t, head, 5);
    rec_put(t, rel, rel_len);
}

/* kind, u64 size, u16 name length, the name (ZB_ENTRY_* records) */
static void emit_entry(rec_out *t, char kind, uint64_t size, const char *name) {
    size_t nl = strlen(name);
    if (nl > NAME_MAX) return;
    size_t need = 1 + 8 + 2 + nl;
    if (t->buf && t->used + need > t->len) { t->used += need; return; }
    uint8_t head[11];
    uint16_t n16 = (uint16_t)nl;
    head[0] = (uint8_t)kind;
    memcpy(head + 1, &size, 8);
    memcpy(head + 9, &n16, 2);
    rec_put(t, head, 11);
    rec_put(t, name, nl);
}

/* A growable path buffer: the walk appends a component going down and cuts it going up. */
typedef struct {
    char *p;
    size_t len, cap;
} pathbuf;

static int path_push(pathbuf *b, const char *name, int slash) {
    size_t nl = strlen(name), need = b->len + (slash ? 1 : 0) + nl + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (slash) b->p[b->len++] = '/';
    memcpy(b->p + b->len, name, nl + 1);
    b->len += nl;
    return 0;
}

typedef struct {
    uint32_t dir;
    size_t next;      /* index of the next entry of dir to visit */
    size_t host_len;  /* lengths of the two paths at this level, to cut back to */
    size_t rel_len;
} diff_frame;

/* Iterative depth-first walk of the upper layer (the guest controls its depth: no C recursion).
 * Below ZB_DIFF_MAX_DEPTH a directory gets one '!' record instead of its contents. */
static int diff_tree(zb_sandbox *sb, uint32_t root, const char *host_root, rec_out *t) {
    pathbuf host = {0}, rel = {0};
    diff_frame *stack = calloc(ZB_DIFF_MAX_DEPTH + 1, sizeof *stack);
    int rc = (!stack || path_push(&host, host_root, 0) < 0 || path_push(&rel, "", 0) < 0) ? -ENOMEM : 0;
    size_t depth = 0;
    if (!rc) stack[0] = (diff_frame){root, 0, host.len, rel.len};
    while (!rc) {
        diff_frame *f = &stack[depth];
        host.len = f->host_len; host.p[host.len] = 0;
        rel.len = f->rel_len; rel.p[rel.len] = 0;
        zb_inode *d = zb_ovl_inode(sb->fs, f->dir);
        if (!d || f->next >= d->nents) {
            if (depth == 0) break;
            depth--;
            continue;
        }
        size_t i = f->next++;
        const char *name = d->ents[i].name;
        uint32_t ino = d->ents[i].ino;
        if ((rc = path_push(&host, name, 1)) < 0 || (rc = path_push(&rel, name, rel.len > 0)) < 0) break;
        zb_inode *c = zb_ovl_inode(sb->fs, ino);
        struct stat st;
        int on_host = host.len < PATH_MAX && lstat(host.p, &st) == 0;
        if (c->type == INO_WHITEOUT) {
            emit_diff(t, ZB_DIFF_DELETED, rel.p, rel.len);
        } else if (c->type == INO_DIR) {
            if (!on_host || c->opaque) emit_diff(t, on_host ? ZB_DIFF_CHANGED : ZB_DIFF_CREATED, rel.p, rel.len);
            if (depth + 1 > ZB_DIFF_MAX_DEPTH) {
                if (c->nents) emit_diff(t, ZB_DIFF_TOO_DEEP, rel.p, rel.len);
            } else {
                depth++;
                stack[depth] = (diff_frame){ino, 0, host.len, rel.len};
            }
        } else {
            emit_diff(t, on_host ? ZB_DIFF_CHANGED : ZB_DIFF_CREATED, rel.p, rel.len);
        }
    }
    free(stack);
    free(host.p);
    free(rel.p);
    return rc;
}

long zb_project_diff(zb_sandbox *sb, const char *host_dir, char *buf, size_t len, char *err) {
    zb_mnode *m = find_project(sb->fs, host_dir);
    if (!m) { zb_seterr(err, "%s is not mounted in the sandbox", host_dir); return -1; }
    char rp[PATH_MAX];
    if (zb_mnode_path(m, rp, sizeof rp) < 0) { zb_seterr(err, "%s: path too long", host_dir); return -1; }
    rec_out t = {(uint8_t *)buf, len, 0};
    int rc = diff_tree(sb, m->ino, rp, &t);
    if (rc < 0) { zb_seterr(err, "%s: %s", host_dir, strerror(-rc)); return -1; }
    return (long)t.used;
}

/* ---- reading what the guest sees (for export, done by the host side) ----
 * Export never follows a guest symlink: every path is resolved without following its last
 * component, and a symlink is reported as one (ZB_ENTRY_SYMLINK), never read through. */

static char entry_kind(const struct stat *st) {
    if (S_ISDIR(st->st_mode)) return ZB_ENTRY_DIR;
    if (S_ISREG(st->st_mode)) return ZB_ENTRY_FILE;
    if (S_ISLNK(st->st_mode)) return ZB_ENTRY_SYMLINK;
    return ZB_ENTRY_OTHER;
}

long zb_guest_read_file(zb_sandbox *sb, const char *guest_path, uint64_t offset, void *buf, size_t len, char *err) {
    zb_resolved r;
    int rc = zb_fs_resolve(sb, sb->proc.cwd, guest_path, ZB_RESOLVE_NOFOLLOW, &r);
    if (rc < 0 || !r.exists) { zb_seterr(err, "%s does not exist in the sandbox", guest_path); return -1; }
    if (r.loc.is_dir) { zb_seterr(err, "%s is a directory", guest_path); return -1; }
    if (r.loc.kind == LOC_OVERLAY) {
        struct stat st;
        zb_ovl_stat(sb->fs, r.loc.ino, &st);
        if (!S_ISREG(st.st_mode)) { zb_seterr(err, "%s is not a regular file", guest_path); return -1; }
        long n = zb_ovl_read(sb->fs, r.loc.ino, buf, len, offset);
        if (n < 0) { zb_seterr(err, "%s: %s", guest_path, strerror((int)-n)); return -1; }
        return n;
    }
    if (r.loc.kind != LOC_HOST) { zb_seterr(err, "%s is not a regular file", guest_path); return -1; }
    int fd = zb_host_open_ro(r.path, 0); /* O_NOFOLLOW, regular files and directories only */
    if (fd < 0) { zb_seterr(err, "%s: %s", guest_path, strerror(-fd)); return -1; }
    long n = pread(fd, buf, len, (off_t)offset);
    if (n < 0) zb_seterr(err, "%s: %s", guest_path, strerror(errno));
    close(fd);
    return n;
}

long zb_guest_stat(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err) {
    zb_resolved r;
    struct stat st;
    int rc = zb_fs_resolve(sb, sb->proc.cwd, guest_path, ZB_RESOLVE_NOFOLLOW, &r);
    if (rc < 0 || !r.exists) { zb_seterr(err, "%s does not exist in the sandbox", guest_path); return -1; }
    if ((rc = zb_fs_stat(sb, &r, &st)) < 0) { zb_seterr(err, "%s: %s", guest_path, strerror(-rc)); return -1; }
    rec_out t = {(uint8_t *)buf, len, 0};
    emit_entry(&t, entry_kind(&st), S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0, r.name[0] ? r.name : "/");
    return (long)t.used;
}

long zb_guest_list_dir(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err) {
    zb_resolved r;
    zb_listing l;
    int rc = zb_fs_resolve(sb, sb->proc.cwd, guest_path, ZB_RESOLVE_NOFOLLOW, &r);
    if (rc < 0 || !r.exists || !r.loc.is_dir) { zb_seterr(err, "%s is not a directory in the sandbox", guest_path); return -1; }
    if ((rc = zb_fs_list(sb, &r, &l)) < 0) { zb_seterr(err, "%s: %s", guest_path, strerror(-rc)); return -1; }
    rec_out t = {(uint8_t *)buf, len, 0};
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", r.path);
    for (size_t i = 0; i < l.n; i++) {
        const char *name = l.ents[i].name;
        if (!name[0] || !strcmp(name, ".") || !strcmp(name, "..") || strchr(name, '/')) continue;
        zb_resolved c;
        struct stat st;
        char kind = ZB_ENTRY_OTHER;
        uint64_t size = 0;
        if (zb_fs_resolve(sb, dir, name, ZB_RESOLVE_NOFOLLOW, &c) == 0 && c.exists && zb_fs_stat(sb, &c, &st) == 0) {
            kind = entry_kind(&st);
            if (kind == ZB_ENTRY_FILE) size = (uint64_t)st.st_size;
        }
        emit_entry(&t, kind, size, name);
    }
    zb_listing_free(&l);
    return (long)t.used;
}
