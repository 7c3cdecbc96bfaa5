/* fs_export.c - what the host reads out of a sandbox's files: the diff of a project's overlay
 * layer against the host (%sandbox diff) and the guest's files as the guest sees them (export).
 * The top layer of the namespace: it uses fs_namespace.c's resolution and fs_project.c's mounts.
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "shared_map.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

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
    zb_mnode *m = zb_fs_find_project(sb->fs, host_dir);
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
        (void)zb_shmap_writeback(sb, r.loc.ino, offset, len); /* a shared mapping holds the latest bytes */
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
