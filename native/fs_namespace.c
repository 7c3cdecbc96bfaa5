/* fs_namespace.c - building the guest's namespace (the mount trie) and resolving guest paths in it.
 * See fs.h for the model and why lookups cannot escape it.
 */
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define MAX_SYMLINKS 40

/* ---- the mount trie ---- */

zb_mnode *zb_mnode_child(const zb_mnode *n, const char *name) {
    for (size_t i = 0; n && i < n->nchildren; i++)
        if (!strcmp(n->children[i]->name, name)) return n->children[i];
    return NULL;
}

zb_mnode *zb_mnode_add(zb_mnode *parent, const char *name, int kind) {
    zb_mnode *c = calloc(1, sizeof *c);
    zb_mnode **nc = realloc(parent->children, (parent->nchildren + 1) * sizeof *nc);
    if (!c || !nc || !(c->name = strdup(name))) {
        free(c);
        if (nc) parent->children = nc;
        return NULL;
    }
    parent->children = nc;
    c->parent = parent;
    c->kind = kind;
    parent->children[parent->nchildren++] = c;
    return c;
}

static void mnode_free(zb_mnode *n) {
    if (!n) return;
    if (n->kind == MNT_PROJECT && n->root_fd >= 0) close(n->root_fd);
    zb_proj_policy_unref(n->policy);
    for (size_t i = 0; i < n->nchildren; i++) mnode_free(n->children[i]);
    free(n->children);
    free(n->name);
    free(n->target);
    free(n);
}

/* Deep copy of a trie; each (old, new) node pair is appended to map (2 entries per node). */
static zb_mnode *mnode_copy(const zb_mnode *n, zb_mnode *parent, zb_mnode ***map, size_t *nmap, size_t *cap) {
    zb_mnode *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->parent = parent;
    c->kind = n->kind;
    c->ino = n->ino;
    c->dev = n->dev;
    c->policy = n->policy; /* shared: the mode is the session's, whichever copy of the trie */
    if (c->policy) atomic_fetch_add(&c->policy->refs, 1);
    c->root_fd = n->kind == MNT_PROJECT ? fcntl(n->root_fd, F_DUPFD_CLOEXEC, 0) : 0;
    c->name = strdup(n->name);
    c->target = n->target ? strdup(n->target) : NULL;
    c->children = calloc(n->nchildren ? n->nchildren : 1, sizeof *c->children);
    if (*nmap + 2 > *cap) {
        size_t ncap = *cap ? *cap * 2 : 256;
        zb_mnode **nm = realloc(*map, ncap * sizeof *nm);
        if (nm) { *map = nm; *cap = ncap; }
    }
    if (!c->name || (n->target && !c->target) || !c->children || *nmap + 2 > *cap) { mnode_free(c); return NULL; }
    (*map)[(*nmap)++] = (zb_mnode *)n;
    (*map)[(*nmap)++] = c;
    for (size_t i = 0; i < n->nchildren; i++) {
        if (!(c->children[i] = mnode_copy(n->children[i], c, map, nmap, cap))) { mnode_free(c); return NULL; }
        c->nchildren++;
    }
    return c;
}

int zb_fs_privatize_trie(zb_fs *fs, zb_mnode ***map, size_t *nmap, char *err) {
    *map = NULL;
    *nmap = 0;
    if (atomic_load(fs->trie_refs) == 1) return 0;
    size_t cap = 0;
    atomic_int *refs = calloc(1, sizeof *refs);
    zb_mnode *root = refs ? mnode_copy(fs->root, NULL, map, nmap, &cap) : NULL;
    if (!root) {
        free(refs);
        free(*map);
        *map = NULL;
        *nmap = 0;
        zb_seterr(err, "out of memory");
        return -1;
    }
    atomic_init(refs, 1);
    atomic_fetch_sub(fs->trie_refs, 1);
    fs->root = root;
    fs->trie_refs = refs;
    return 0;
}

/* Mutations below require a trie of our own (zb_fs_privatize_trie, done by the caller, which
 * also re-points its open files at the copy). */
int zb_fs_require_private(zb_fs *fs, char *err) {
    if (atomic_load(fs->trie_refs) == 1) return 0;
    zb_seterr(err, "internal: the namespace is shared; privatize it first");
    return -1;
}

static zb_mnode *dev_add(zb_mnode *dir, const char *name, int dev) {
    zb_mnode *n = zb_mnode_add(dir, name, MNT_DEV);
    if (n) n->dev = dev;
    return n;
}

zb_fs *zb_fs_new(char *err) {
    zb_fs *fs = calloc(1, sizeof *fs);
    if (!fs || !(fs->root = calloc(1, sizeof *fs->root)) || !(fs->trie_refs = calloc(1, sizeof(atomic_int))) ||
        !(fs->root->name = strdup(""))) {
        zb_seterr(err, "out of memory");
        if (fs) { free(fs->root); free(fs->trie_refs); free(fs); }
        return NULL;
    }
    atomic_init(fs->trie_refs, 1);
    fs->root->kind = MNT_SYNTH;
    fs->ninodes = 1; /* inode 0 is never used */
    int no_inodes = zb_ovl_reserve(fs, 1) < 0;
    fs->bytes_limit = 256ull << 20;
    zb_mnode *dev = zb_mnode_add(fs->root, "dev", MNT_SYNTH);
    zb_mnode *proc = zb_mnode_add(fs->root, "proc", MNT_SYNTH);
    zb_mnode *self = proc ? zb_mnode_add(proc, "self", MNT_SYNTH) : NULL;
    if (no_inodes || !dev || !self || !dev_add(dev, "null", DEV_NULL) || !dev_add(dev, "zero", DEV_ZERO) ||
        !dev_add(dev, "urandom", DEV_URANDOM) || !dev_add(dev, "random", DEV_URANDOM) ||
        !dev_add(dev, "ttyS0", DEV_UART) || !zb_mnode_add(self, "exe", MNT_PROC_EXE) ||
        zb_proc_add_files(proc, self) < 0) {
        zb_seterr(err, "out of memory");
        zb_fs_free(fs);
        return NULL;
    }
    return fs;
}

zb_fs *zb_fs_clone(const zb_fs *src) {
    zb_fs *fs = calloc(1, sizeof *fs);
    if (!fs) return NULL;
    fs->root = src->root;
    fs->trie_refs = src->trie_refs;
    atomic_fetch_add(fs->trie_refs, 1);
    fs->bytes_limit = src->bytes_limit;
    if (zb_ovl_clone(fs, src) < 0) { zb_fs_free(fs); return NULL; }
    return fs;
}

void zb_fs_free(zb_fs *fs) {
    if (!fs) return;
    zb_ovl_free_all(fs);
    if (fs->trie_refs && atomic_fetch_sub(fs->trie_refs, 1) == 1) {
        mnode_free(fs->root);
        free(fs->trie_refs);
    }
    free(fs);
}

/* Split an absolute path into the next component; returns 0 at the end. */
static int next_component(const char **p, char *comp) {
    while (**p == '/') (*p)++;
    if (!**p) return 0;
    size_t n = 0;
    while ((*p)[n] && (*p)[n] != '/') n++;
    if (n > NAME_MAX) return -ENAMETOOLONG;
    memcpy(comp, *p, n);
    comp[n] = 0;
    *p += n;
    return 1;
}

static int join_path(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

/* The path a symlink in directory `dir` leads to, followed by the rest of the walk. */
static int splice_link(char *out, size_t cap, const char *dir, const char *link, const char *rest) {
    int n = link[0] == '/' ? snprintf(out, cap, "%s%s", link, rest) : snprintf(out, cap, "%s/%s%s", dir, link, rest);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

/* Add host_path (absolute) to the trie, mirroring host symlinks as trie symlinks so that every
 * host file the guest can open has a symlink-free canonical path. */
static int view_add(zb_fs *fs, const char *host_path, int depth, char *err) {
    if (depth > MAX_SYMLINKS) { zb_seterr(err, "%s: too many levels of symbolic links", host_path); return -1; }
    zb_mnode *node = fs->root;
    int inside_tree = 0; /* below a MNT_HOST_DIR: the host directory is already visible */
    char sofar[PATH_MAX] = "", comp[NAME_MAX + 1];
    const char *p = host_path;
    int r;
    while ((r = next_component(&p, comp)) > 0) {
        const char *rest = p;
        int last = 1;
        for (const char *q = rest; *q; q++) if (*q != '/') { last = 0; break; }
        if (!strcmp(comp, ".")) continue;
        if (!strcmp(comp, "..")) {
            char *slash = strrchr(sofar, '/');
            if (slash) *slash = 0;
            if (!inside_tree && node->parent) node = node->parent;
            continue;
        }
        char next[PATH_MAX];
        if (join_path(next, sizeof next, sofar, comp) < 0) { zb_seterr(err, "%s: path too long", host_path); return -1; }
        zb_mnode *child = inside_tree ? NULL : zb_mnode_child(node, comp);
        if (child && child->kind == MNT_SYMLINK) {
            char target[PATH_MAX];
            if (splice_link(target, sizeof target, sofar, child->target, rest) < 0) { zb_seterr(err, "%s: path too long", host_path); return -1; }
            return view_add(fs, target, depth + 1, err);
        }
        if (child && child->kind == MNT_OVERLAY && !last) {
            /* a host path below an overlay directory (a script in /tmp, say): it becomes a
             * read-only entry of the trie in front of the overlay's own files */
            node = child;
            memcpy(sofar, next, sizeof sofar);
            continue;
        }
        if (child && child->kind != MNT_SYNTH) {
            if (child->kind == MNT_HOST_DIR) inside_tree = 1;
            else if (!last) { zb_seterr(err, "%s: %s is not a directory", host_path, next); return -1; }
            node = child;
            memcpy(sofar, next, sizeof sofar);
            continue;
        }
        struct stat st;
        if (lstat(next, &st) < 0) { zb_seterr(err, "cannot add %s to the guest's view: %s: %s", host_path, next, strerror(errno)); return -1; }
        if (S_ISLNK(st.st_mode)) {
            char link[PATH_MAX], target[PATH_MAX];
            ssize_t n = readlink(next, link, sizeof link - 1);
            if (n < 0) { zb_seterr(err, "readlink %s: %s", next, strerror(errno)); return -1; }
            link[n] = 0;
            if (!inside_tree) {
                zb_mnode *s = zb_mnode_add(node, comp, MNT_SYMLINK);
                if (!s || !(s->target = strdup(link))) { zb_seterr(err, "out of memory"); return -1; }
            }
            if (splice_link(target, sizeof target, sofar, link, rest) < 0) { zb_seterr(err, "%s: path too long", host_path); return -1; }
            return view_add(fs, target, depth + 1, err);
        }
        if (!S_ISDIR(st.st_mode) && !last) { zb_seterr(err, "%s: %s is not a directory", host_path, next); return -1; }
        if (!inside_tree) {
            int kind = !last ? MNT_SYNTH : S_ISDIR(st.st_mode) ? MNT_HOST_DIR : MNT_HOST_FILE;
            if (child) child->kind = kind; /* a synthetic directory becomes the whole host tree */
            else if (!(child = zb_mnode_add(node, comp, kind))) { zb_seterr(err, "out of memory"); return -1; }
            node = child;
            if (kind == MNT_HOST_DIR) inside_tree = 1;
        }
        memcpy(sofar, next, sizeof sofar);
    }
    if (r < 0) { zb_seterr(err, "%s: path component too long", host_path); return -1; }
    return 0;
}

int zb_fs_view_add(zb_fs *fs, const char *host_path, char *err) {
    if (!host_path || host_path[0] != '/') { zb_seterr(err, "view paths must be absolute: %s", host_path ? host_path : "(null)"); return -1; }
    if (zb_fs_require_private(fs, err) < 0) return -1;
    return view_add(fs, host_path, 0, err);
}

/* Walk/create synthetic directories down to the parent of guest_path; returns the parent node
 * and the last component in `name`. */
zb_mnode *zb_trie_parent(zb_fs *fs, const char *guest_path, char *name, char *err) {
    if (!guest_path || guest_path[0] != '/') { zb_seterr(err, "guest paths must be absolute: %s", guest_path ? guest_path : "(null)"); return NULL; }
    zb_mnode *node = fs->root;
    const char *p = guest_path;
    char comp[NAME_MAX + 1];
    name[0] = 0;
    int r;
    while ((r = next_component(&p, comp)) > 0) {
        if (name[0]) {
            zb_mnode *c = zb_mnode_child(node, name);
            if (!c && !(c = zb_mnode_add(node, name, MNT_SYNTH))) { zb_seterr(err, "out of memory"); return NULL; }
            /* synthetic and overlay directories can hold trie entries (a project in /tmp, say) */
            if (c->kind != MNT_SYNTH && c->kind != MNT_OVERLAY) {
                zb_seterr(err, "%s: /%s is already something else in the guest", guest_path, name);
                return NULL;
            }
            node = c;
        }
        strcpy(name, comp);
    }
    if (r < 0 || !name[0]) { zb_seterr(err, "bad guest path %s", guest_path); return NULL; }
    return node;
}

int zb_fs_overlay_dir(zb_fs *fs, const char *guest_path, char *err) {
    char name[NAME_MAX + 1];
    if (zb_fs_require_private(fs, err) < 0) return -1;
    zb_mnode *parent = zb_trie_parent(fs, guest_path, name, err);
    if (!parent) return -1;
    zb_mnode *n = zb_mnode_child(parent, name);
    if (n && n->kind == MNT_OVERLAY) return 0;
    if (n && n->kind != MNT_SYNTH) { zb_seterr(err, "%s is already visible from the host; cannot make it an overlay", guest_path); return -1; }
    uint32_t ino = zb_ovl_new_inode(fs, INO_DIR, 0777);
    if (!ino || (!n && !(n = zb_mnode_add(parent, name, MNT_OVERLAY)))) { zb_seterr(err, "out of memory"); return -1; }
    /* a synthetic directory (say /tmp, when the venv lives in /tmp) becomes writable; the view
     * entries below it stay visible and read-only */
    n->kind = MNT_OVERLAY;
    n->ino = ino;
    zb_ovl_inode(fs, ino)->nlink = 1; /* held by the mount point */
    return 0;
}

int zb_fs_put_file(zb_fs *fs, const char *guest_path, const void *data, size_t len, char *err) {
    char name[NAME_MAX + 1];
    if (zb_fs_require_private(fs, err) < 0) return -1;
    zb_mnode *parent = zb_trie_parent(fs, guest_path, name, err);
    if (!parent) return -1;
    if (zb_mnode_child(parent, name)) { zb_seterr(err, "%s already exists in the guest", guest_path); return -1; }
    uint32_t ino = zb_ovl_new_inode(fs, INO_FILE, 0444);
    zb_mnode *n = ino ? zb_mnode_add(parent, name, MNT_OVERLAY) : NULL;
    if (!n || zb_ovl_write(fs, ino, data, len, 0) != (long)len) { zb_seterr(err, "cannot store %s", guest_path); return -1; }
    n->ino = ino;
    zb_ovl_inode(fs, ino)->readonly = 1;
    zb_ovl_inode(fs, ino)->nlink = 1; /* held by the mount point */
    return 0;
}

/* ---- resolution ---- */

static int loc_from_mnode(zb_sandbox *sb, zb_mnode *m, zb_loc *loc) {
    memset(loc, 0, sizeof *loc);
    loc->mnode = m;
    switch (m->kind) {
    case MNT_SYNTH: loc->kind = LOC_SYNTH; loc->is_dir = 1; break;
    case MNT_HOST_DIR: loc->kind = LOC_HOST; loc->is_dir = loc->host_is_dir = 1; break;
    case MNT_HOST_FILE: loc->kind = LOC_HOST; break;
    case MNT_SYMLINK: case MNT_PROC_EXE: loc->kind = LOC_SYMLINK; break;
    case MNT_DEV: loc->kind = LOC_DEV; loc->dev = m->dev; break;
    case MNT_PROJECT: *loc = zb_proj_root_loc(sb, m); break;
    case MNT_OVERLAY: {
        zb_inode *in = zb_ovl_inode(sb->fs, m->ino);
        if (!in) return -ENOENT;
        loc->kind = LOC_OVERLAY;
        loc->ino = m->ino;
        loc->is_dir = in->type == INO_DIR;
        break;
    }
    default: return -ENOENT;
    }
    return 0;
}

/* Look `name` up in directory `dir` (whose canonical path is `path`). If it is a symlink, its
 * target is copied to `link` and 1 is returned. */
static int lookup(zb_sandbox *sb, const zb_loc *dir, const char *path, const char *name, zb_loc *out, char *link) {
    zb_mnode *m = dir->mnode ? zb_mnode_child(dir->mnode, name) : NULL;
    if (m) {
        int r = loc_from_mnode(sb, m, out);
        if (r < 0) return r;
        if (m->kind == MNT_SYMLINK) { snprintf(link, PATH_MAX, "%s", m->target); return 1; }
        if (m->kind == MNT_PROC_EXE) { snprintf(link, PATH_MAX, "%s", sb->proc.exe); return 1; }
        if (out->kind == LOC_OVERLAY && zb_ovl_inode(sb->fs, out->ino)->type == INO_SYMLINK) {
            snprintf(link, PATH_MAX, "%s", zb_ovl_inode(sb->fs, out->ino)->target);
            return 1;
        }
        return 0;
    }
    if (dir->proj == PROJ_OVERLAY) return zb_proj_lookup(sb, dir, path, name, out, link);
    memset(out, 0, sizeof *out);
    if (dir->kind == LOC_HOST) {
        char hp[PATH_MAX];
        struct stat st;
        if (join_path(hp, sizeof hp, path, name) < 0) return -ENAMETOOLONG;
        if (dir->proj && zb_proj_hidden(dir->proj_root, hp)) return -ENOENT; /* fs_project.c */
        if (lstat(hp, &st) < 0) return -ENOENT;
        out->kind = LOC_HOST;
        out->proj = dir->proj;
        out->proj_root = dir->proj_root;
        out->lower = 1;
        out->is_dir = out->host_is_dir = S_ISDIR(st.st_mode);
        if (S_ISLNK(st.st_mode)) {
            ssize_t n = readlink(hp, link, PATH_MAX - 1);
            if (n < 0) return -ENOENT;
            link[n] = 0;
            return 1;
        }
        return 0;
    }
    if (dir->kind == LOC_OVERLAY) {
        uint32_t ino = zb_ovl_lookup(sb->fs, dir->ino, name);
        if (!ino) return -ENOENT;
        zb_inode *in = zb_ovl_inode(sb->fs, ino);
        out->kind = LOC_OVERLAY;
        out->ino = ino;
        out->is_dir = in->type == INO_DIR;
        if (in->type == INO_SYMLINK) { snprintf(link, PATH_MAX, "%s", in->target); return 1; }
        return 0;
    }
    return -ENOENT;
}

typedef struct {
    zb_loc loc;
    size_t pathlen;
} frame_t;

/* The walk's work space, per thread and reused: allocated per call it was over 128 KiB, so malloc
 * mmap'ed and unmapped it every time (a third of an os.stat's host time). A walk never starts
 * another walk, so one set per thread suffices. */
static __thread char resolve_todo[2 * PATH_MAX + 4], resolve_tmp[2 * PATH_MAX + 4];
static __thread frame_t resolve_stack[PATH_MAX / 2 + 2];

int zb_fs_resolve(zb_sandbox *sb, const char *base, const char *path, int flags, zb_resolved *out) {
    if (!path[0]) return -ENOENT;
    /* `todo` holds what is left to walk; symlinks are spliced in front of it */
    char *todo = resolve_todo, *tmp = resolve_tmp;
    frame_t *stack = resolve_stack;
    char link[PATH_MAX], comp[NAME_MAX + 1];
    int ret = 0, links = 0, depth = 1;
    size_t plen = strlen(path);
    int trailing_slash = plen > 0 && path[plen - 1] == '/';
    if (snprintf(todo, 2 * PATH_MAX, "%s/%s%s", path[0] == '/' ? "" : base, path, trailing_slash ? "." : "") >= 2 * PATH_MAX) {
        ret = -ENAMETOOLONG;
        goto done;
    }
    memset(out, 0, sizeof *out);
    loc_from_mnode(sb, sb->fs->root, &stack[0].loc);
    stack[0].pathlen = 0;
    out->path[0] = 0;
    const char *p = todo;
    for (;;) {
        int r = next_component(&p, comp);
        if (r < 0) { ret = r; goto done; }
        if (r == 0) break;
        int last = 1;
        for (const char *q = p; *q; q++) if (*q != '/') { last = 0; break; }
        if (!strcmp(comp, ".")) {
            if (!stack[depth - 1].loc.is_dir) { ret = -ENOTDIR; goto done; }
            continue;
        }
        if (!strcmp(comp, "..")) {
            if (depth > 1) depth--;
            out->path[stack[depth - 1].pathlen] = 0;
            continue;
        }
        frame_t *top = &stack[depth - 1];
        if (!top->loc.is_dir) { ret = -ENOTDIR; goto done; }
        zb_loc child;
        r = lookup(sb, &top->loc, out->path, comp, &child, link);
        if (r == -ENOENT && last) { /* creatable: report the parent */
            out->exists = 0;
            out->parent = top->loc;
            snprintf(out->name, sizeof out->name, "%s", comp);
            if (join_path(tmp, PATH_MAX, out->path, comp) < 0) { ret = -ENAMETOOLONG; goto done; }
            memcpy(out->path, tmp, strlen(tmp) + 1);
            ret = 0;
            goto done;
        }
        if (r < 0) { ret = r; goto done; }
        if (r == 1 && (!last || !(flags & ZB_RESOLVE_NOFOLLOW))) {
            if (++links > MAX_SYMLINKS) { ret = -ELOOP; goto done; }
            if (snprintf(tmp, 2 * PATH_MAX, "%s/%s", link, p) >= 2 * PATH_MAX) { ret = -ENAMETOOLONG; goto done; }
            memcpy(todo, tmp, strlen(tmp) + 1);
            p = todo;
            if (link[0] == '/') { depth = 1; out->path[0] = 0; }
            continue;
        }
        size_t len = strlen(out->path);
        if (len + 1 + strlen(comp) >= PATH_MAX) { ret = -ENAMETOOLONG; goto done; }
        out->path[len] = '/';
        strcpy(out->path + len + 1, comp);
        stack[depth].loc = child;
        stack[depth].pathlen = strlen(out->path);
        depth++;
        snprintf(out->name, sizeof out->name, "%s", comp);
    }
    out->exists = 1;
    out->loc = stack[depth - 1].loc;
    out->parent = stack[depth > 1 ? depth - 2 : 0].loc;
    if (depth == 1) { strcpy(out->path, "/"); strcpy(out->name, "/"); }
done:
    return ret;
}

void zb_dev_stat(int dev, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_dev = ZB_DEV_ID;
    st->st_ino = 100 + (unsigned)dev;
    st->st_nlink = 1;
    st->st_blksize = 4096;
    st->st_mode = S_IFCHR | 0666;
    if (zb_dev_is_proc(dev)) { /* /proc files: regular, read-only, size 0 as Linux reports them */
        st->st_mode = S_IFREG | 0444;
        st->st_blksize = 1024;
        return;
    }
    st->st_rdev = dev == DEV_UART ? makedev(4, 64) : makedev(1, dev == DEV_NULL ? 3 : dev == DEV_ZERO ? 5 : 9);
}

/* A project folder seen through an overlay (its upper layer holds the sandbox's changes): entries
 * the sandbox created, renamed or deleted there change its mtime and ctime, as on Linux. */
static void upper_dir_times(zb_sandbox *sb, uint32_t upper, struct stat *st) {
    const zb_inode *in = zb_ovl_inode(sb->fs, upper);
    if (!in) return;
    int64_t m = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    int64_t c = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
    if (in->mtime_ns > m) { st->st_mtim.tv_sec = in->mtime_ns / 1000000000; st->st_mtim.tv_nsec = in->mtime_ns % 1000000000; }
    if (in->ctime_ns > c) { st->st_ctim.tv_sec = in->ctime_ns / 1000000000; st->st_ctim.tv_nsec = in->ctime_ns % 1000000000; }
}

int zb_fs_stat(zb_sandbox *sb, const zb_resolved *r, struct stat *st) {
    memset(st, 0, sizeof *st);
    const zb_loc *l = &r->loc;
    st->st_dev = ZB_DEV_ID;
    st->st_ino = (uint64_t)(uintptr_t)l->mnode >> 4;
    st->st_nlink = 1;
    st->st_blksize = 4096;
    switch (l->kind) {
    case LOC_HOST: {
        ZB_PROF_BEGIN(sb, t);
        int rc = lstat(r->path, st) < 0 ? -errno : 0;
        ZB_PROF_END(sb, t, host_ns);
        if (rc < 0) return rc;
        if (S_ISREG(st->st_mode)) st->st_blksize = ZB_IO_BLKSIZE;
        if (l->upper && S_ISDIR(st->st_mode)) upper_dir_times(sb, l->upper, st);
        return 0;
    }
    case LOC_OVERLAY:
        zb_ovl_stat(sb->fs, l->ino, st);
        return 0;
    case LOC_SYNTH:
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
        return 0;
    case LOC_SYMLINK:
        st->st_mode = S_IFLNK | 0777;
        st->st_size = l->mnode->kind == MNT_PROC_EXE ? strlen(sb->proc.exe) : strlen(l->mnode->target);
        return 0;
    case LOC_DEV:
        zb_dev_stat(l->dev, st);
        return 0;
    }
    return -ENOENT;
}

/* ---- listings ---- */

/* FNV-1a: names are guest-chosen, but a collision only costs a longer probe, never correctness,
 * and the listing's size is bounded by the budget. */
uint64_t zb_name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The name of entry k of an array whose entries start with `char *name` (see fs.h). */
#define ENTRY_NAME(ents, stride, k) (*(char *const *)((const char *)(ents) + (size_t)(k) * (stride)))

size_t zb_name_slot(const uint32_t *index, size_t cap, const void *ents, size_t stride, const char *name) {
    size_t mask = cap - 1, i = (size_t)zb_name_hash(name) & mask;
    while (index[i] && strcmp(ENTRY_NAME(ents, stride, index[i] - 1), name)) i = (i + 1) & mask;
    return i;
}

int zb_name_index_build(uint32_t **index, size_t *cap, const void *ents, size_t stride, size_t n, size_t want) {
    size_t c = 64;
    while (c < 2 * want) c *= 2; /* load <= 1/2 */
    uint32_t *idx = calloc(c, sizeof *idx);
    if (!idx) return -ENOMEM;
    for (size_t k = 0; k < n; k++) idx[zb_name_slot(idx, c, ents, stride, ENTRY_NAME(ents, stride, k))] = (uint32_t)(k + 1);
    free(*index);
    *index = idx;
    *cap = c;
    return 0;
}

_Static_assert(offsetof(struct zb_listing_ent, name) == 0, "zb_name_slot reads names at offset 0");

/* The slot of `name` in the listing's index (holding 0 when absent). */
static size_t index_slot(const zb_listing *l, const char *name) {
    return zb_name_slot(l->index, l->index_cap, l->ents, sizeof *l->ents, name);
}

static int index_grow(zb_listing *l) {
    return zb_name_index_build(&l->index, &l->index_cap, l->ents, sizeof *l->ents, l->n, l->n + 1);
}

int zb_listing_has(const zb_listing *l, const char *name) {
    return l && l->index_cap && l->index[index_slot(l, name)] != 0;
}

int zb_listing_add(zb_listing *l, const char *name, unsigned char type, uint64_t ino) {
    if (zb_listing_has(l, name)) return 0;
    if (l->n >= UINT32_MAX - 1 || l->bytes > ZB_LISTING_BUDGET) return -ENOMEM; /* no listing outgrows it */
    if (2 * (l->n + 1) > l->index_cap && index_grow(l) < 0) return -ENOMEM; /* load <= 1/2 */
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        void *ne = realloc(l->ents, cap * sizeof *l->ents);
        if (!ne) return -ENOMEM;
        l->ents = ne;
        l->bytes += (cap - l->cap) * sizeof *l->ents;
        l->cap = cap;
    }
    size_t len = strlen(name);
    if (!(l->ents[l->n].name = malloc(len + 1))) return -ENOMEM;
    memcpy(l->ents[l->n].name, name, len + 1);
    l->ents[l->n].type = type;
    l->ents[l->n].ino = ino ? ino : l->n + 1;
    l->n++;
    l->index[index_slot(l, name)] = (uint32_t)l->n;
    l->bytes += len + 1 + 16; /* the name and malloc's overhead for it */
    return 0;
}

void zb_listing_free(zb_listing *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->ents[i].name);
    free(l->ents);
    free(l->index);
    l->ents = NULL;
    l->index = NULL;
    l->n = l->cap = l->index_cap = l->bytes = 0;
}

void zb_listing_unref(zb_listing *l) {
    if (l && atomic_fetch_sub(&l->refs, 1) == 1) {
        zb_listing_free(l);
        free(l);
    }
}

static unsigned char mnode_dtype(zb_sandbox *sb, const zb_mnode *m) {
    switch (m->kind) {
    case MNT_SYNTH: case MNT_HOST_DIR: return DT_DIR;
    case MNT_HOST_FILE: return DT_REG;
    case MNT_SYMLINK: case MNT_PROC_EXE: return DT_LNK;
    case MNT_DEV: return zb_dev_is_proc(m->dev) ? DT_REG : DT_CHR;
    case MNT_OVERLAY: {
        zb_inode *in = zb_ovl_inode(sb->fs, m->ino);
        return in && in->type == INO_DIR ? DT_DIR : DT_REG;
    }
    }
    return DT_UNKNOWN;
}

static int hidden(const zb_listing *hide, const char *name) { return zb_listing_has(hide, name); }

/* The guest only ever gets regular files and directories of the host. A FIFO in a view or in the
 * notebook's folder would block the engine in open() or read() (the kick signal is blocked while
 * a syscall is served, so neither an interrupt nor the deadline could end that wait), and a device
 * node would be a way past the sandbox. So anything but a regular file or a directory is closed
 * again at once. */
int zb_host_fd_ordinary(int fd) {
    struct stat st;
    if (fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return fd;
    close(fd);
    return -EACCES;
}

/* Open a host file of the view or of a project for reading. The path is canonical: the namespace
 * walk lstat'ed every component and turned host symlinks into guest-side lookups, and the guest
 * cannot run between that walk and this open (one vCPU, stopped in the syscall), so O_NOFOLLOW on
 * the last component suffices. O_NONBLOCK | O_NOCTTY: an open never waits for a FIFO's other end
 * or takes a terminal. Plain open (not openat2) lets the run-phase seccomp filter check the flags. */
int zb_host_open_ro(const char *path, int dir) {
    if (zb_host_fd_room() < 0) return -EMFILE;
    struct stat st; /* before opening: opening a socket file fails with ENXIO, which would say too little */
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return S_ISLNK(st.st_mode) ? -ELOOP : -EACCES;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | (dir ? O_DIRECTORY : 0));
    return fd < 0 ? -errno : zb_host_fd_ordinary(fd); /* the file could have been swapped since the lstat */
}

int zb_list_host_dir_for(zb_sandbox *sb, const char *path, zb_listing *out, const zb_listing *hide) {
    int fd = zb_host_open_ro(path, 1);
    if (fd < 0) return fd;
    char buf[16384];
    int ret = 0;
    for (;;) {
        if (sb && zb_should_stop(sb)) { ret = ZB_DEADLINE_PASSED; break; }
        long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n < 0) { ret = -errno; break; }
        if (n == 0) break;
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..") && !hidden(hide, d->d_name) &&
                (ret = zb_listing_add(out, d->d_name, d->d_type, d->d_ino)) < 0)
                goto out;
        }
    }
out:
    close(fd);
    return ret;
}

int zb_list_host_dir(const char *path, zb_listing *out, const zb_listing *hide) {
    return zb_list_host_dir_for(NULL, path, out, hide);
}

int zb_fs_list(zb_sandbox *sb, const zb_resolved *r, zb_listing *out) {
    memset(out, 0, sizeof *out);
    const zb_loc *l = &r->loc;
    if (!l->is_dir) return -ENOTDIR;
    int ret = 0;
    if ((ret = zb_listing_add(out, ".", DT_DIR, 0)) < 0 || (ret = zb_listing_add(out, "..", DT_DIR, 0)) < 0) goto fail;
    for (size_t i = 0; l->mnode && i < l->mnode->nchildren; i++) {
        zb_mnode *c = l->mnode->children[i];
        if ((ret = zb_listing_add(out, c->name, mnode_dtype(sb, c), 0)) < 0) goto fail;
    }
    if (l->proj == PROJ_OVERLAY) {
        if ((ret = zb_proj_list(sb, r, out)) < 0) goto fail;
        return 0;
    }
    if (l->kind == LOC_HOST) {
        zb_listing hide; /* hidden paths of a project folder (fs_project.c) */
        memset(&hide, 0, sizeof hide);
        if (l->proj) ret = zb_proj_hidden_children(l->proj_root, r->path, &hide);
        if (!ret) ret = zb_list_host_dir_for(sb, r->path, out, &hide);
        zb_listing_free(&hide);
        if (ret < 0) goto fail;
    }
    if (l->kind == LOC_OVERLAY) {
        zb_inode *in = zb_ovl_inode(sb->fs, l->ino);
        for (size_t i = 0; in && i < in->nents; i++) {
            if (!(i & 4095) && zb_should_stop(sb)) { ret = ZB_DEADLINE_PASSED; goto fail; }
            zb_inode *c = zb_ovl_inode(sb->fs, in->ents[i].ino);
            unsigned char t = c->type == INO_DIR ? DT_DIR : c->type == INO_SYMLINK ? DT_LNK : DT_REG;
            if ((ret = zb_listing_add(out, in->ents[i].name, t, in->ents[i].ino)) < 0) goto fail;
        }
    }
    return 0;
fail:
    zb_listing_free(out);
    return ret;
}
