/* fs_snapshot.c - saving and loading the guest's namespace, overlay files and fd table with a
 * snapshot (a template on disk). Host files the guest had open are saved by path and opened again
 * when the template is loaded; a template whose host files are gone fails to load with an error.
 */
#include "util.h"
#include "process.h"
#include "fs.h"
#include "serial.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>


#define MAX_TRIE_DEPTH 256
#define MAX_TRIE_NODES 1000000
#define MAX_INODES (1u << 20)
#define MAX_FILES 65536

/* ---- the mount trie ---- */

static void save_mnode(zb_out *o, const zb_mnode *n) {
    out_str(o, n->name);
    out_u32(o, (uint32_t)n->kind);
    out_str(o, n->target);
    out_u32(o, n->ino);
    out_u32(o, (uint32_t)n->dev);
    out_u32(o, (uint32_t)zb_mnode_proj_mode(n));
    out_u32(o, (uint32_t)n->nchildren);
    for (size_t i = 0; i < n->nchildren; i++) save_mnode(o, n->children[i]);
}

static zb_mnode *load_mnode(zb_in *in, zb_mnode *parent, int depth, size_t *count) {
    if (depth > MAX_TRIE_DEPTH || ++*count > MAX_TRIE_NODES) { in->err = 1; return NULL; }
    zb_mnode *n = calloc(1, sizeof *n);
    if (!n) { in->err = 1; return NULL; }
    n->parent = parent;
    n->name = in_str(in, NAME_MAX);
    n->kind = (int)in_u32(in);
    char *target = in_str(in, PATH_MAX);
    if (target && target[0]) n->target = target;
    else free(target);
    n->ino = in_u32(in);
    n->dev = (int)in_u32(in);
    int proj_mode = (int)in_u32(in);
    n->root_fd = -1;
    if (n->kind == MNT_PROJECT && (proj_mode < PROJ_READONLY || proj_mode > PROJ_READWRITE)) in->err = 1;
    if (n->kind == MNT_PROJECT && !in->err && !(n->policy = zb_proj_policy_new(proj_mode))) in->err = 1;
    if (n->kind == MNT_PROJECT && !in->err) { /* the host directory, opened again */
        char path[PATH_MAX];
        if (zb_mnode_path(n, path, sizeof path) < 0 || (n->root_fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
            in->err = 1;
    }
    uint32_t nch = in_u32(in);
    if (in->err || n->kind < MNT_SYNTH || n->kind > MNT_LAST || (n->kind == MNT_SYMLINK && !n->target) ||
        nch > MAX_TRIE_NODES || !(n->children = calloc(nch ? nch : 1, sizeof *n->children))) {
        in->err = 1;
        zb_proj_policy_unref(n->policy);
        free(n->name);
        free(n->target);
        free(n);
        return NULL;
    }
    for (uint32_t i = 0; i < nch && !in->err; i++) {
        zb_mnode *c = load_mnode(in, n, depth + 1, count);
        if (c) n->children[n->nchildren++] = c;
    }
    return n;
}

/* ---- overlay inodes ---- */

static void save_inode(zb_out *o, const zb_inode *in) {
    out_u32(o, (uint32_t)in->type);
    if (in->type == INO_FREE) return;
    out_u32(o, in->mode);
    out_u32(o, in->nlink);
    out_u32(o, (uint32_t)in->readonly);
    out_u32(o, in->opens);
    out_u32(o, in->parent);
    out_u32(o, (uint32_t)in->opaque);
    out_u64(o, (uint64_t)in->atime_ns);
    out_u64(o, (uint64_t)in->mtime_ns);
    out_u64(o, (uint64_t)in->ctime_ns);
    out_u64(o, in->size);
    out_u32(o, (uint32_t)in->nents);
    for (size_t i = 0; i < in->nents; i++) {
        out_str(o, in->ents[i].name);
        out_u32(o, in->ents[i].ino);
    }
    out_u64(o, in->nblocks);
    for (size_t i = 0; i < in->nblocks; i++) {
        uint32_t cap = in->blocks[i] ? in->blocks[i]->cap : 0;
        out_u32(o, cap);
        if (cap) out_bytes(o, in->blocks[i]->data, cap);
    }
    out_str(o, in->target);
    out_u32(o, (uint32_t)in->memfd);
    out_u32(o, in->seals);
    out_u64(o, in->type == INO_SOCKET ? in->sock_id : 0);
}

static void load_inode(zb_in *in, zb_fs *fs, zb_inode *n) {
    n->type = (int)in_u32(in);
    if (n->type == INO_FREE || in->err) return;
    if (n->type < INO_DIR || n->type > INO_FIFO) { in->err = 1; n->type = INO_FREE; return; }
    n->mode = in_u32(in) & 07777;
    n->nlink = in_u32(in);
    n->readonly = (int)in_u32(in);
    n->opens = in_u32(in);
    n->parent = in_u32(in);
    n->opaque = (int)in_u32(in);
    n->atime_ns = (int64_t)in_u64(in);
    n->mtime_ns = (int64_t)in_u64(in);
    n->ctime_ns = (int64_t)in_u64(in);
    n->size = in_u64(in);
    uint32_t nents = in_u32(in);
    if (in->err || nents > MAX_INODES) { in->err = 1; return; }
    for (uint32_t i = 0; i < nents && !in->err; i++) {
        char *name = in_str(in, NAME_MAX);
        uint32_t ino = in_u32(in);
        if (!name) break;
        if (zb_ovl_dir_append(n, name, ino) < 0) in->err = 1;
        free(name);
    }
    uint64_t nblocks = in_u64(in);
    if (in->err || nblocks > (1ull << 40) / ZB_BLOCK_SIZE ||
        (nblocks && !(n->blocks = calloc(nblocks, sizeof *n->blocks)))) {
        in->err = 1;
        return;
    }
    n->nblocks = nblocks;
    for (uint64_t i = 0; i < nblocks && !in->err; i++) {
        uint32_t cap = in_u32(in);
        if (!cap) continue;
        zb_block *b = cap <= ZB_BLOCK_SIZE ? calloc(1, sizeof *b + cap) : NULL;
        if (!b) { in->err = 1; return; }
        atomic_init(&b->refs, 1);
        b->cap = cap;
        in_bytes(in, b->data, cap);
        n->blocks[i] = b;
        fs->bytes_used += cap;
    }
    char *target = in_str(in, PATH_MAX);
    if (target && target[0]) n->target = target;
    else free(target);
    if (n->type == INO_SYMLINK && !n->target) in->err = 1;
    uint32_t memfd = in_u32(in), seals = in_u32(in);
    if (memfd > 1 || (memfd && n->type != INO_FILE) || seals & ~0x3fu || (!memfd && seals)) in->err = 1;
    n->memfd = (int)memfd;
    n->seals = seals;
    uint64_t sock_id = in_u64(in);
    if ((sock_id && n->type != INO_SOCKET) || sock_id > ZB_USOCK_BIND_ID_MAX) in->err = 1;
    n->sock_id = sock_id; /* the socket bound to the name, if the snapshot holds it (file_socket.c) */
    zb_usock_bind_id_loaded(sock_id);
    fs->bytes_used += zb_ovl_meta_cost(n); /* as when it was created (fs_overlay.c) */
}

void zb_fs_save(const zb_fs *fs, zb_out *o) {
    save_mnode(o, fs->root);
    out_u64(o, fs->bytes_limit);
    out_u64(o, fs->ninodes);
    for (size_t i = 1; i < fs->ninodes; i++) save_inode(o, zb_ovl_peek(fs, i));
}

zb_fs *zb_fs_load(zb_in *in) {
    zb_fs *fs = calloc(1, sizeof *fs);
    size_t count = 0;
    if (!fs || !(fs->trie_refs = calloc(1, sizeof(atomic_int)))) { free(fs); in->err = 1; return NULL; }
    atomic_init(fs->trie_refs, 1);
    fs->root = load_mnode(in, NULL, 0, &count);
    fs->bytes_limit = in_u64(in);
    uint64_t ninodes = in_u64(in);
    if (!fs->root || in->err || ninodes < 1 || ninodes > MAX_INODES || zb_ovl_reserve(fs, ninodes) < 0) {
        in->err = 1;
        zb_fs_free(fs);
        return NULL;
    }
    fs->ninodes = ninodes;
    for (size_t i = 1; i < ninodes && !in->err; i++) load_inode(in, fs, zb_ovl_slot(fs, i));
    for (size_t i = 1; i < ninodes && !in->err; i++) { /* every reference must name a live inode */
        const zb_inode *n = zb_ovl_peek(fs, i);
        for (size_t k = 0; k < n->nents; k++)
            if (!zb_ovl_inode(fs, n->ents[k].ino)) in->err = 1;
    }
    if (in->err) { zb_fs_free(fs); return NULL; }
    return fs;
}

/* ---- the fd table ---- */

static uint32_t pipe_index(const zb_pipe *const *pipes, uint32_t n, const zb_pipe *p) {
    for (uint32_t k = 0; p && k < n; k++) if (pipes[k] == p) return k;
    return UINT32_MAX;
}

void zb_fds_save(const zb_fdtable *t, zb_out *o) {
    const zb_file *files[ZB_MAX_FDS];
    const zb_pipe *pipes[2 * ZB_MAX_FDS];
    uint32_t nfiles = 0, npipes = 0;
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        const zb_file *f = t->fd[i];
        if (!f) continue;
        uint32_t k = 0;
        while (k < nfiles && files[k] != f) k++;
        if (k == nfiles) files[nfiles++] = f;
        if (f->rx && pipe_index(pipes, npipes, f->rx) == UINT32_MAX) pipes[npipes++] = f->rx;
        if (f->tx && pipe_index(pipes, npipes, f->tx) == UINT32_MAX) pipes[npipes++] = f->tx;
    }
    out_u64(o, t->next_file_id);
    out_u32(o, npipes);
    for (uint32_t p = 0; p < npipes; p++) {
        out_u64(o, pipes[p]->cap);
        out_u64(o, pipes[p]->len);
        out_bytes(o, zb_pipe_bytes(pipes[p]), pipes[p]->len);
        const zb_tty *tt = pipes[p]->tty; /* a pty's state, on its input stream (file_pty.c) */
        out_u32(o, tt != NULL);
        if (!tt) continue;
        out_u32(o, tt->iflag);
        out_u32(o, tt->oflag);
        out_u32(o, tt->cflag);
        out_u32(o, tt->lflag);
        out_u32(o, tt->line);
        out_bytes(o, tt->cc, sizeof tt->cc);
        out_u32(o, (uint32_t)tt->rows << 16 | tt->cols);
        out_u32(o, (uint32_t)tt->xpixel << 16 | tt->ypixel);
        out_u32(o, tt->index);
        out_u32(o, tt->locked);
        out_u32(o, (uint32_t)tt->pgrp);
        out_u32(o, (uint32_t)tt->sid);
    }
    out_u32(o, nfiles);
    for (uint32_t k = 0; k < nfiles; k++) {
        const zb_file *f = files[k];
        out_u32(o, (uint32_t)f->kind);
        out_u32(o, (uint32_t)f->flags);
        out_u64(o, f->offset);
        out_u32(o, f->ino);
        out_u32(o, (uint32_t)f->dev);
        out_u32(o, (uint32_t)f->stream);
        out_u64(o, f->id);
        out_u32(o, pipe_index(pipes, npipes, f->rx));
        out_u32(o, pipe_index(pipes, npipes, f->tx));
        /* the kind's own state (an epoll's items, an eventfd's counter): a count of records, then
         * the records; 0 for a kind without state */
        if (f->ops->save) f->ops->save(f, o);
        else out_u32(o, 0);
        out_str(o, f->where ? f->where->path : NULL);
    }
    uint32_t nfds = 0;
    for (int i = 0; i < ZB_MAX_FDS; i++) nfds += t->fd[i] != NULL;
    out_u32(o, nfds);
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        if (!t->fd[i]) continue;
        uint32_t k = 0;
        while (files[k] != t->fd[i]) k++;
        out_u32(o, (uint32_t)i);
        out_u32(o, k);
        out_u32(o, t->cloexec[i]);
    }
}

/* What save wrote for the kind's own state (see zb_fds_save). */
static int load_kind_state(zb_in *in, zb_file *f) {
    if (f->ops->load) return f->ops->load(f, in);
    uint32_t n = in_u32(in);
    return in->err || n ? -1 : 0;
}

/* Rebuild what an open file pointed at: resolve its path again (the namespace is the loaded one)
 * and open host files again. */
static int reopen(zb_sandbox *ctx, zb_file *f, const char *path, char *err) {
    zb_resolved r;
    if (zb_fs_resolve(ctx, "/", path, ZB_RESOLVE_NOFOLLOW, &r) < 0 || !r.exists) {
        zb_seterr(err, "the template had %s open, which no longer resolves", path);
        return -1;
    }
    if (!(f->where = zb_where_new())) { zb_seterr(err, "out of memory"); return -1; }
    *f->where = r;
    return f->ops->reopen ? f->ops->reopen(f, &r, err) : 0;
}

zb_fdtable *zb_fds_load(zb_in *in, zb_fs *fs, const char *exe, char *err) {
    zb_sandbox ctx; /* resolution only looks at the namespace and the program path */
    memset(&ctx, 0, sizeof ctx);
    ctx.fs = fs;
    snprintf(ctx.proc.exe, sizeof ctx.proc.exe, "%s", exe);
    zb_fdtable *t = zb_fdtable_new();
    zb_pipe **pipes = NULL;
    zb_file **files = NULL;
    uint32_t npipes = 0, nfiles = 0;
    if (!t) goto corrupt;
    t->next_file_id = in_u64(in);
    npipes = in_u32(in);
    if (in->err || npipes > 2 * ZB_MAX_FDS || !(pipes = calloc(npipes + 1, sizeof *pipes))) { npipes = 0; goto corrupt; }
    for (uint32_t p = 0; p < npipes; p++) {
        uint64_t cap = in_u64(in), len = in_u64(in);
        if (in->err || (cap && (cap < ZB_PAGE || cap > ZB_PIPE_MAX_SIZE || (cap & (cap - 1)))) ||
            len > (cap ? cap : ZB_STREAM_CAP) || !(pipes[p] = zb_pipe_new()))
            goto corrupt;
        pipes[p]->cap = (size_t)cap;
        if (len && !(pipes[p]->buf = malloc(sizeof *pipes[p]->buf + len))) goto corrupt;
        if (len) {
            atomic_init(&pipes[p]->buf->refs, 1);
            pipes[p]->buf->cap = len;
            in_bytes(in, pipes[p]->buf->data, len);
        }
        pipes[p]->len = len;
        uint32_t has_tty = in_u32(in);
        if (in->err || has_tty > 1) goto corrupt;
        if (!has_tty) continue;
        zb_tty *tt = pipes[p]->tty = calloc(1, sizeof *tt);
        if (!tt) goto corrupt;
        tt->iflag = in_u32(in);
        tt->oflag = in_u32(in);
        tt->cflag = in_u32(in);
        tt->lflag = in_u32(in);
        uint32_t line = in_u32(in);
        in_bytes(in, tt->cc, sizeof tt->cc);
        uint32_t size = in_u32(in), pixels = in_u32(in);
        tt->index = in_u32(in);
        tt->locked = in_u32(in);
        tt->pgrp = (int32_t)in_u32(in);
        tt->sid = (int32_t)in_u32(in);
        if (in->err || line > 255 || tt->index >= ZB_PTY_MAX || tt->locked > 1 || tt->pgrp < 0 || tt->sid < 0) goto corrupt;
        tt->line = (uint8_t)line;
        tt->rows = (uint16_t)(size >> 16);
        tt->cols = (uint16_t)size;
        tt->xpixel = (uint16_t)(pixels >> 16);
        tt->ypixel = (uint16_t)pixels;
    }
    nfiles = in_u32(in);
    if (in->err || nfiles > MAX_FILES || !(files = calloc(nfiles + 1, sizeof *files))) goto corrupt;
    for (uint32_t k = 0; k < nfiles; k++) {
        zb_file *f = zb_file_new((int)in_u32(in)); /* NULL for a kind number no kind has */
        if (!f) goto corrupt;
        files[k] = f;
        f->refs = 0;
        f->flags = (int)in_u32(in);
        f->offset = in_u64(in);
        f->ino = in_u32(in);
        f->dev = (int)in_u32(in);
        f->stream = (int)in_u32(in);
        f->id = in_u64(in);
        uint32_t rx = in_u32(in), tx = in_u32(in);
        if (in->err || f->id > t->next_file_id) goto corrupt;
        int streams = (f->ops->props & ZB_FOPS_STREAMS) != 0;
        if ((rx != UINT32_MAX && (!streams || rx >= npipes)) || (tx != UINT32_MAX && (!streams || tx >= npipes))) goto corrupt;
        if (rx != UINT32_MAX) zb_file_attach_rx(f, pipes[rx]);
        if (tx != UINT32_MAX) zb_file_attach_tx(f, pipes[tx]);
        if (load_kind_state(in, f) < 0) goto corrupt;
        char *path = in_str(in, PATH_MAX);
        if (in->err) { free(path); goto corrupt; }
        if (f->ino && !zb_ovl_inode(fs, f->ino)) { free(path); goto corrupt; }
        int memfd = f->ino && zb_ovl_inode(fs, f->ino)->memfd; /* named by no directory (sys_memfd.c) */
        int rc = !path || !path[0] ? 0 : memfd ? zb_memfd_where(f, path) : reopen(&ctx, f, path, err);
        if (rc < 0 && memfd) zb_seterr(err, "out of memory");
        free(path);
        if (rc < 0) goto fail;
    }
    uint32_t nfds = in_u32(in);
    if (in->err || nfds > ZB_MAX_FDS) goto corrupt;
    for (uint32_t i = 0; i < nfds; i++) {
        uint32_t fd = in_u32(in), k = in_u32(in), cloexec = in_u32(in);
        if (in->err || fd >= ZB_MAX_FDS || k >= nfiles || t->fd[fd]) goto corrupt;
        t->fd[fd] = files[k];
        files[k]->refs++;
        t->cloexec[fd] = cloexec ? 1 : 0;
    }
    for (uint32_t p = 0; p < npipes; p++) /* listed but unused (only a corrupt file does that) */
        if (!atomic_load(&pipes[p]->refs)) zb_pipe_free(pipes[p]);
    for (uint32_t k = 0; k < nfiles; k++)
        if (!files[k]->refs) { files[k]->refs = 1; zb_file_unref(NULL, files[k]); }
    free(files);
    free(pipes);
    return t;
corrupt:
    zb_seterr(err, "the template's file table is corrupt");
fail:
    /* streams no file holds first: freeing the files below frees the others */
    for (uint32_t p = 0; pipes && p < npipes; p++)
        if (pipes[p] && !atomic_load(&pipes[p]->refs)) zb_pipe_free(pipes[p]);
    for (uint32_t k = 0; files && k < nfiles; k++)
        if (files[k] && !files[k]->refs) { files[k]->refs = 1; files[k]->ino = 0; zb_file_unref(NULL, files[k]); }
    free(files);
    free(pipes);
    zb_fdtable_free(t, NULL);
    return NULL;
}
