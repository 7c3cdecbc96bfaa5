/* fs_namespace.c - building the guest's namespace (the mount trie) and resolving guest paths in it.
 * See fs.h for the model and why lookups cannot escape it.
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define MAX_SYMLINKS 40

/* ---- the mount trie (its nodes: fs_trie.c) ---- */







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
    zb_mnode *pts = NULL;
    if (no_inodes || !dev || !self || !dev_add(dev, "null", DEV_NULL) || !dev_add(dev, "zero", DEV_ZERO) ||
        !dev_add(dev, "urandom", DEV_URANDOM) || !dev_add(dev, "random", DEV_URANDOM) ||
        !dev_add(dev, "ttyS0", DEV_UART) || !dev_add(dev, "ptmx", DEV_PTMX) ||
        !(pts = zb_mnode_add(dev, "pts", MNT_PTS)) || !dev_add(pts, "ptmx", DEV_PTS_PTMX) || !zb_mnode_add(self, "exe", MNT_PROC_EXE) ||
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
    zb_scm_free_all(fs); /* files in flight on its family's sockets (cycles live until now) */
    zb_fifo_free_all(fs); /* the ends of FIFO opens still waiting */
    zb_lock_free_all(fs);
    zb_ovl_free_all(fs);
    if (fs->trie_refs && atomic_fetch_sub(fs->trie_refs, 1) == 1) {
        zb_mnode_free(fs->root);
        free(fs->trie_refs);
    }
    free(fs);
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

/* A host directory tree was added at node n (canonical host path `path`): synthetic directories
 * below it that earlier, narrower view entries made (the libraries of the Python view inside
 * /usr/lib, say) are that host tree too, so they become host directories: every other entry of
 * theirs must be visible, not only the ones named. Host-controlled depth, bounded by PATH_MAX. */
static void host_tree_below(zb_mnode *n, const char *path, int depth) {
    for (size_t i = 0; i < n->nchildren && depth < PATH_MAX / 2; i++) {
        zb_mnode *c = n->children[i];
        if (c->kind != MNT_SYNTH) continue;
        char sub[PATH_MAX];
        struct stat st;
        if (join_path(sub, sizeof sub, path, c->name) < 0 || lstat(sub, &st) < 0 || !S_ISDIR(st.st_mode)) continue;
        c->kind = MNT_HOST_DIR;
        host_tree_below(c, sub, depth + 1);
    }
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
    while ((r = zb_path_component(&p, comp)) > 0) {
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
            if (kind == MNT_HOST_DIR) {
                inside_tree = 1;
                host_tree_below(child, next, 0);
            }
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
    case MNT_SYNTH: case MNT_PTS: case MNT_PROC_FD: case MNT_PROC_FDINFO: loc->kind = LOC_SYNTH; loc->is_dir = 1; break;
    case MNT_HOST_DIR: loc->kind = LOC_HOST; loc->is_dir = loc->host_is_dir = 1; break;
    case MNT_HOST_FILE: loc->kind = LOC_HOST; break;
    case MNT_SYMLINK: case MNT_PROC_EXE: case MNT_PROC_CWD: loc->kind = LOC_SYMLINK; break;
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

static __thread struct {
    uint64_t serial, host_calls;
    struct stat st;
    char path[PATH_MAX];
} walk_st;

void zb_walk_stat_put(const char *host_path, const struct stat *st) {
    size_t n = strlen(host_path);
    walk_st.serial = 0;
    if (!(zb_syscall_serial & 1) || n >= sizeof walk_st.path) return; /* outside a syscall: never kept */
    memcpy(walk_st.path, host_path, n + 1);
    walk_st.st = *st;
    walk_st.serial = zb_syscall_serial;
    walk_st.host_calls = zb_host_calls;
}

int zb_walk_stat_get(const char *host_path, struct stat *st) {
    if (!(zb_syscall_serial & 1) || walk_st.serial != zb_syscall_serial || walk_st.host_calls != zb_host_calls ||
        strcmp(walk_st.path, host_path))
        return -1;
    *st = walk_st.st;
    return 0;
}

/* Host directories this syscall has looked up (lstat'ed) already: a ZB_SYS_STAT_MANY walks the
 * same few directories for each of its paths (the modules of one package). Kept for one syscall
 * only, like walk_st: no metadata outlives the syscall that read it. Directories only, so that a
 * hit never skips a symlink's readlink. */
#define DIR_MEMO_SLOTS 8
static __thread struct {
    uint64_t serial;
    struct stat st;
    char path[PATH_MAX];
} dir_memo[DIR_MEMO_SLOTS];
static __thread unsigned dir_memo_next;

static int dir_memo_get(const char *host_path, struct stat *st) {
    if (!(zb_syscall_serial & 1)) return -1;
    for (unsigned i = 0; i < DIR_MEMO_SLOTS; i++)
        if (dir_memo[i].serial == zb_syscall_serial && !strcmp(dir_memo[i].path, host_path)) {
            *st = dir_memo[i].st;
            return 0;
        }
    return -1;
}

static void dir_memo_put(const char *host_path, const struct stat *st) {
    size_t n = strlen(host_path);
    if (!(zb_syscall_serial & 1) || !S_ISDIR(st->st_mode) || n >= PATH_MAX) return;
    unsigned i = dir_memo_next++ % DIR_MEMO_SLOTS;
    memcpy(dir_memo[i].path, host_path, n + 1);
    dir_memo[i].st = *st;
    dir_memo[i].serial = zb_syscall_serial;
}

/* The pid a /proc entry's name is (digits, no leading zero, 1..INT32_MAX), else 0. */
static int32_t proc_pid_name(const char *name) {
    if (name[0] < '1' || name[0] > '9' || strlen(name) > 10) return 0;
    int64_t v = 0;
    for (const char *c = name; *c; c++) {
        if (*c < '0' || *c > '9') return 0;
        v = v * 10 + (*c - '0');
    }
    return v <= INT32_MAX ? (int32_t)v : 0;
}

/* mnode is the namespace's /proc, where the family's pids are entries too. */
static int is_proc_dir(const zb_sandbox *sb, const zb_mnode *m) {
    return m && m->parent == sb->fs->root && !strcmp(m->name, "proc");
}

int zb_fs_symlink_target(zb_sandbox *sb, const zb_loc *l, char *buf, size_t cap) {
    if (l->kind != LOC_SYMLINK || !l->mnode) return -EINVAL;
    if (l->mnode->kind == MNT_SYMLINK) return snprintf(buf, cap, "%s", l->mnode->target);
    zb_sandbox *t = zb_proc_target(sb, l->pid); /* /proc/<pid>/...: that process, as of now */
    if (!t) return -ENOENT;                     /* it ended since its directory was looked up */
    if (l->mnode->kind == MNT_PROC_EXE) return snprintf(buf, cap, "%s", t->proc.exe);
    if (l->mnode->kind == MNT_PROC_CWD) return snprintf(buf, cap, "%s", t->proc.cwd);
    if (l->mnode->kind == MNT_PROC_FD && l->proc_fd > 0) return zb_proc_fd_link(t, l->proc_fd - 1, buf, cap);
    return -EINVAL;
}

/* The fd an entry of /proc/<pid>/fd or fdinfo names (digits, no leading zero but "0"), or -1. */
static int proc_fd_name(const char *name) {
    if (!strcmp(name, "0")) return 0;
    int32_t v = proc_pid_name(name);
    return v > 0 && v < ZB_MAX_FDS ? (int)v : -1;
}

/* Look `name` up in directory `dir` (whose canonical path is `path`). If it is a symlink, its
 * target is copied to `link` and 1 is returned. */
static int lookup(zb_sandbox *sb, const zb_loc *dir, const char *path, const char *name, zb_loc *out, char *link) {
    zb_mnode *m = dir->mnode ? zb_mnode_child(dir->mnode, name) : NULL;
    /* /proc/<pid>/fd/N (a symlink to what fd N is) and fdinfo/N, while process pid has fd N open */
    if (!m && dir->mnode && (dir->mnode->kind == MNT_PROC_FD || dir->mnode->kind == MNT_PROC_FDINFO)) {
        int fd = proc_fd_name(name);
        zb_sandbox *t = zb_proc_target(sb, dir->pid);
        if (fd < 0 || !t || !zb_fd_get(t, (uint64_t)fd)) return -ENOENT;
        memset(out, 0, sizeof *out);
        out->mnode = dir->mnode;
        out->pid = dir->pid;
        out->proc_fd = fd + 1;
        if (dir->mnode->kind == MNT_PROC_FDINFO) {
            out->kind = LOC_DEV;
            out->dev = DEV_PROC_FDINFO;
            return 0;
        }
        out->kind = LOC_SYMLINK;
        int n = zb_fs_symlink_target(sb, out, link, PATH_MAX);
        return n < 0 ? n : 1;
    }
    /* /proc/<pid> of a process of the family (live or a zombie) is /proc/self's files of that
     * process (ps, psutil); <own pid> is /proc/self itself */
    if (!m && is_proc_dir(sb, dir->mnode)) {
        int32_t pid = proc_pid_name(name);
        if (pid > 0 && zb_proc_exists(sb, pid) && (m = zb_mnode_child(dir->mnode, "self"))) {
            int r = loc_from_mnode(sb, m, out);
            out->pid = zb_proc_target(sb, pid) == sb ? 0 : pid;
            return r < 0 ? r : 0;
        }
    }
    if (!m && dir->mnode && dir->mnode->kind == MNT_PTS) { /* /dev/pts/N: pty N, while its master is open */
        int dev = zb_pty_lookup(sb, name);
        if (dev < 0) return dev;
        memset(out, 0, sizeof *out);
        out->kind = LOC_DEV;
        out->dev = dev;
        return 0;
    }
    if (m) {
        int r = loc_from_mnode(sb, m, out);
        if (r < 0) return r;
        out->pid = dir->pid; /* below /proc/<pid>: that process's files */
        if (out->kind == LOC_SYMLINK) {
            int n = zb_fs_symlink_target(sb, out, link, PATH_MAX);
            return n < 0 ? n : 1;
        }
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
        if (dir_memo_get(hp, &st) != 0) {
            if (ZB_HOSTCALL(lstat(hp, &st)) < 0) return -ENOENT;
            dir_memo_put(hp, &st);
        }
        zb_walk_stat_put(hp, &st);
        out->kind = LOC_HOST;
        out->proj = dir->proj;
        out->proj_root = dir->proj_root;
        out->lower = 1;
        out->is_dir = out->host_is_dir = S_ISDIR(st.st_mode);
        if (S_ISLNK(st.st_mode)) {
            ssize_t n = ZB_HOSTCALL(readlink(hp, link, PATH_MAX - 1));
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
        int r = zb_path_component(&p, comp);
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
    st->st_ino = ZB_DEV_INO(dev);
    st->st_nlink = 1;
    st->st_blksize = 4096;
    st->st_mode = S_IFCHR | 0666;
    if (dev >= DEV_PTS_FIRST) { /* /dev/pts/N as devpts makes it: the owner's, group tty (here the guest's gid) */
        st->st_mode = S_IFCHR | 0620;
        st->st_uid = st->st_gid = 1000;
        st->st_rdev = makedev(136, (unsigned)(dev - DEV_PTS_FIRST));
        return;
    }
    if (dev == DEV_PTMX || dev == DEV_PTS_PTMX) {
        if (dev == DEV_PTS_PTMX) st->st_mode = S_IFCHR;
        st->st_rdev = makedev(5, 2);
        return;
    }
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
        int rc = zb_walk_stat_get(r->path, st) == 0 ? 0 : ZB_HOSTCALL(lstat(r->path, st)) < 0 ? -errno : 0;
        ZB_PROF_END(sb, t, host_ns);
        if (rc < 0) return rc;
        if (S_ISREG(st->st_mode)) st->st_blksize = ZB_IO_BLKSIZE;
        if (l->upper && S_ISDIR(st->st_mode)) upper_dir_times(sb, l->upper, st);
        if (l->proj) zb_proj_owner(st);
        return 0;
    }
    case LOC_OVERLAY:
        zb_ovl_stat(sb->fs, l->ino, st);
        return 0;
    case LOC_SYNTH:
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
        return 0;
    case LOC_SYMLINK: {
        char target[PATH_MAX];
        int n = zb_fs_symlink_target(sb, l, target, sizeof target);
        if (n < 0) return n;
        st->st_mode = S_IFLNK | 0777;
        if (l->proc_fd) { /* an fd's link: lr-x------, l-wx------ or lrwx------ by its access mode, as on Linux */
            zb_sandbox *t = zb_proc_target(sb, l->pid);
            const zb_file *f = t ? zb_fd_get(t, (uint64_t)(l->proc_fd - 1)) : NULL;
            int acc = f ? f->flags & O_ACCMODE : O_RDONLY;
            st->st_mode = S_IFLNK | (acc == O_RDONLY ? 0500 : acc == O_WRONLY ? 0300 : 0700);
        }
        st->st_size = n;
        return 0;
    }
    case LOC_DEV:
        zb_dev_stat(l->dev, st);
        return 0;
    }
    return -ENOENT;
}

/* ---- listings ---- */












static unsigned char mnode_dtype(zb_sandbox *sb, const zb_mnode *m) {
    switch (m->kind) {
    case MNT_SYNTH: case MNT_HOST_DIR: case MNT_PTS: case MNT_PROC_FD: case MNT_PROC_FDINFO: return DT_DIR;
    case MNT_HOST_FILE: return DT_REG;
    case MNT_SYMLINK: case MNT_PROC_EXE: case MNT_PROC_CWD: return DT_LNK;
    case MNT_DEV: return zb_dev_is_proc(m->dev) ? DT_REG : DT_CHR;
    case MNT_OVERLAY: {
        zb_inode *in = zb_ovl_inode(sb->fs, m->ino);
        return in && in->type == INO_DIR ? DT_DIR : DT_REG;
    }
    }
    return DT_UNKNOWN;
}






int zb_fs_list(zb_sandbox *sb, const zb_resolved *r, zb_listing *out) {
    memset(out, 0, sizeof *out);
    const zb_loc *l = &r->loc;
    if (!l->is_dir) return -ENOTDIR;
    int ret = 0;
    if ((ret = zb_listing_add(out, ".", DT_DIR, 0)) < 0 || (ret = zb_listing_add(out, "..", DT_DIR, 0)) < 0) goto fail;
    if (l->mnode && l->mnode->kind == MNT_PTS && (ret = zb_pty_list(sb, out)) < 0) goto fail; /* then its ptmx */
    if (is_proc_dir(sb, l->mnode) && (ret = zb_proc_list_pids(sb, out)) < 0)
        goto fail;
    if (l->mnode && (l->mnode->kind == MNT_PROC_FD || l->mnode->kind == MNT_PROC_FDINFO) &&
        (ret = zb_proc_list_fds(sb, l->pid, l->mnode->kind == MNT_PROC_FD ? DT_LNK : DT_REG, out)) < 0)
        goto fail;
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
            if ((ret = zb_listing_add(out, in->ents[i].name, zb_ovl_dtype(c), in->ents[i].ino)) < 0) goto fail;
        }
    }
    return 0;
fail:
    zb_listing_free(out);
    return ret;
}
