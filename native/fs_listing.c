/* fs_listing.c - directory listings (zb_listing: unique names through a hash index, also used by
 * the overlay's directories), and the host side of the view and projects: opening host files
 * symlink-free and listing host directories. Below fs_project.c and fs_namespace.c.
 */
#include "process.h"
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

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

static int hidden(const zb_listing *hide, const char *name) { return zb_listing_has(hide, name); }

/* The guest only ever gets regular files and directories of the host. A FIFO in a view or in the
 * notebook's folder would block the engine in open() or read() (the kick signal is blocked while
 * a syscall is served, so neither an interrupt nor the deadline could end that wait), and a device
 * node would be a way past the sandbox. So anything but a regular file or a directory is closed
 * again at once. */
int zb_host_fd_ordinary(int fd) {
    struct stat st;
    if (ZB_HOSTCALL(fstat(fd, &st)) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return fd;
    ZB_HOSTCALL(close(fd));
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
    if ((zb_walk_stat_get(path, &st) == 0 || ZB_HOSTCALL(lstat(path, &st)) == 0) && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return S_ISLNK(st.st_mode) ? -ELOOP : -EACCES;
    int fd = ZB_HOSTCALL(open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | (dir ? O_DIRECTORY : 0)));
    if (fd < 0) return -errno;
    /* The file could have been swapped since the lstat. A directory's open needs no fstat to tell:
     * with O_DIRECTORY the host kernel itself refuses anything else at the open (ENOTDIR, checked
     * before a FIFO or a device is opened), with O_NOFOLLOW a symlink (ELOOP); one host call less
     * per directory opened (os.walk, os.scandir), and nothing kept across calls. */
    return dir ? fd : zb_host_fd_ordinary(fd);
}

int zb_list_host_dir_for(zb_sandbox *sb, const char *path, zb_listing *out, const zb_listing *hide) {
    int fd = zb_host_open_ro(path, 1);
    if (fd < 0) return fd;
    char buf[16384];
    int ret = 0;
    for (;;) {
        if (sb && zb_should_stop(sb)) { ret = ZB_DEADLINE_PASSED; break; }
        long n = ZB_HOSTCALL(syscall(SYS_getdents64, fd, buf, sizeof buf));
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
    ZB_HOSTCALL(close(fd));
    return ret;
}
