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
#include "util.h"
#include "sandbox_state.h"
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define COPY_CHUNK (1u << 20)

static uid_t engine_uid;
static gid_t engine_gid;
static pthread_once_t engine_ids_once = PTHREAD_ONCE_INIT;
static void read_engine_ids(void) {
    engine_uid = geteuid();
    engine_gid = getegid();
}

void zb_proj_owner(struct stat *st) {
    pthread_once(&engine_ids_once, read_engine_ids);
    if (st->st_uid == engine_uid) st->st_uid = ZB_GUEST_UID;
    if (st->st_gid == engine_gid) st->st_gid = ZB_GUEST_GID;
}

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

zb_mnode *zb_fs_find_project(zb_fs *fs, const char *host_dir) {
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
    zb_mnode *n = zb_fs_find_project(fs, host_dir);
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
    zb_mnode *n = zb_fs_find_project(fs, host_dir);
    if (!n || !n->policy) { zb_seterr(err, "%s is not mounted in the sandbox", host_dir); return -1; }
    /* the overlay layer stays: it shows again when back in overlay mode */
    atomic_store(&n->policy->mode, mode);
    return 0;
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
    int fd = (int)ZB_HOSTCALL(syscall(SYS_openat2, root, slash ? rel : ".", &how, sizeof how));
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
    int fd = (int)ZB_HOSTCALL(syscall(SYS_openat2, root, rel, &how, sizeof how));
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
            out->lower = dir_lower && !in->opaque && ZB_HOSTCALL(lstat(hp, &st)) == 0 && S_ISDIR(st.st_mode);
        }
        return 0;
    }
    if (!dir_lower || ZB_HOSTCALL(lstat(hp, &st)) < 0) return -ENOENT;
    zb_walk_stat_put(hp, &st);
    out->kind = LOC_HOST;
    out->lower = 1;
    out->is_dir = out->host_is_dir = S_ISDIR(st.st_mode);
    if (S_ISLNK(st.st_mode)) {
        ssize_t k = ZB_HOSTCALL(readlink(hp, link, PATH_MAX - 1));
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
        else ret = zb_listing_add(out, ud->ents[i].name, zb_ovl_dtype(c), ud->ents[i].ino);
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
    if (ZB_HOSTCALL(lstat(r->path, &st)) < 0) return -errno;
    uint32_t ino;
    if (S_ISDIR(st.st_mode)) {
        ino = zb_ovl_new_inode(sb->fs, INO_DIR, st.st_mode & 07777);
    } else if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = ZB_HOSTCALL(readlink(r->path, target, sizeof target - 1));
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
    if (dir) { /* (r is a directory, and no mount point: the callers checked) */
        zb_listing l;
        memset(&l, 0, sizeof l);
        int rc = zb_proj_list(sb, r, &l);
        size_t n = l.n;
        zb_listing_free(&l);
        if (rc < 0) return rc;
        if (n) return -ENOTEMPTY;
    }
    uint32_t parent;
    int rc = upper_parent(sb, r, &parent);
    if (rc < 0) return rc;
    int had_lower = r->loc.kind == LOC_HOST || r->loc.lower;
    if (!had_lower && r->loc.kind == LOC_OVERLAY) {
        struct stat st; /* an upper file can shadow a host file of the same name */
        had_lower = ZB_HOSTCALL(lstat(r->path, &st)) == 0;
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

