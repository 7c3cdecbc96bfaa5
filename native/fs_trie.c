/* fs_trie.c - the mount trie's nodes: finding, adding, copying (a private trie for a sandbox that
 * changes it) and freeing them, the synthetic directories leading to a new entry, a node's path,
 * and the project policies nodes share. The bottom layer of the namespace: fs_project.c and
 * fs_namespace.c build on it, it uses neither.
 */
#include "util.h"
#include "fs.h"

#include <fcntl.h>
#include <unistd.h>

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

void zb_mnode_free(zb_mnode *n) {
    if (!n) return;
    if (n->kind == MNT_PROJECT && n->root_fd >= 0) close(n->root_fd);
    zb_proj_policy_unref(n->policy);
    for (size_t i = 0; i < n->nchildren; i++) zb_mnode_free(n->children[i]);
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
    if (!c->name || (n->target && !c->target) || !c->children || *nmap + 2 > *cap) { zb_mnode_free(c); return NULL; }
    (*map)[(*nmap)++] = (zb_mnode *)n;
    (*map)[(*nmap)++] = c;
    for (size_t i = 0; i < n->nchildren; i++) {
        if (!(c->children[i] = mnode_copy(n->children[i], c, map, nmap, cap))) { zb_mnode_free(c); return NULL; }
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

/* Split an absolute path into the next component; returns 0 at the end. */
int zb_path_component(const char **p, char *comp) {
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

/* Walk/create synthetic directories down to the parent of guest_path; returns the parent node
 * and the last component in `name`. */
zb_mnode *zb_trie_parent(zb_fs *fs, const char *guest_path, char *name, char *err) {
    if (!guest_path || guest_path[0] != '/') { zb_seterr(err, "guest paths must be absolute: %s", guest_path ? guest_path : "(null)"); return NULL; }
    zb_mnode *node = fs->root;
    const char *p = guest_path;
    char comp[NAME_MAX + 1];
    name[0] = 0;
    int r;
    while ((r = zb_path_component(&p, comp)) > 0) {
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

/* The guest (== host) path of a trie node. */
int zb_mnode_path(const zb_mnode *m, char *buf, size_t cap) {
    if (!m->parent) { snprintf(buf, cap, "/"); return 0; }
    char parent[PATH_MAX];
    if (zb_mnode_path(m->parent, parent, sizeof parent) < 0) return -1;
    int n = snprintf(buf, cap, "%s%s%s", parent, strcmp(parent, "/") ? "/" : "", m->name);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}
