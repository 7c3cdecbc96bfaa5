/* fs.h - the guest's file namespace, its in-memory overlay and its file descriptors.
 *
 * The guest sees one namespace, built from:
 *   - a mount trie (immutable once the sandbox runs, shared by forks): synthetic directories that
 *     exist only to lead to visible things, host files and host directory trees visible read-only
 *     at their own path, symlinks mirrored from the host, overlay mount points and devices;
 *   - the overlay (per sandbox, shared copy-on-write with its snapshots: inode chunks, directory
 *     tables, names and file blocks are copied only when changed): writable in-memory directories
 *     and files.
 * A project mount's files mode (zb_proj_policy) is shared by every copy of the trie, so it is the
 * session's, not a snapshot's.
 * Every lookup walks this namespace component by component in the guest's terms, so `..`, symlinks
 * (host or overlay) and absolute paths can never leave it; host files are finally opened with
 * openat2(RESOLVE_NO_SYMLINKS) on their canonical path.
 */
#ifndef ZB_FS_H
#define ZB_FS_H
#include "sandbox_state.h"

#include <sys/stat.h>

#define ZB_MAX_FDS 1024 /* the fd table's size */

/* mount trie node kinds */
enum { MNT_SYNTH = 1, MNT_HOST_DIR, MNT_HOST_FILE, MNT_SYMLINK, MNT_OVERLAY, MNT_DEV, MNT_PROC_EXE, MNT_PROJECT,
       MNT_PTS, /* /dev/pts: its numbered entries are the sandbox's ptys (file_pty.c zb_pty_lookup) */
       /* /proc/<pid>/cwd (a symlink to the process's working directory), /proc/<pid>/fd (its open fds,
        * each a symlink to what the fd is) and /proc/<pid>/fdinfo (each fd's position and flags):
        * made from the process's state at each lookup (fs_proc.c) */
       MNT_PROC_CWD, MNT_PROC_FD, MNT_PROC_FDINFO, MNT_LAST = MNT_PROC_FDINFO };
/* how a project directory (the notebook's folder, fs_project.c) is seen: ZB_PROJECT_* */
enum { PROJ_NONE = 0, PROJ_READONLY = ZB_PROJECT_READONLY, PROJ_OVERLAY = ZB_PROJECT_OVERLAY,
       PROJ_READWRITE = ZB_PROJECT_READWRITE };
/* devices */
enum { DEV_NULL = 1, DEV_ZERO, DEV_URANDOM, DEV_UART, DEV_PTMX,
       DEV_PTS_PTMX, /* /dev/pts/ptmx: mode 0000 and root's, as devpts makes it (EACCES to the guest) */
       /* /proc files synthesised when opened (fs_proc.c): regular read-only files, not devices */
       DEV_PROC_FIRST = 32, DEV_PROC_MAPS = DEV_PROC_FIRST, DEV_PROC_STATUS, DEV_PROC_STAT, DEV_PROC_STATM,
       DEV_PROC_SMAPS_ROLLUP, DEV_PROC_CGROUP, DEV_PROC_MEMINFO, DEV_PROC_CPUINFO, DEV_PROC_UPTIME,
       DEV_PROC_SYSTEM_STAT, DEV_PROC_CMDLINE, DEV_PROC_MOUNTS, DEV_PROC_MOUNTINFO,
       DEV_PROC_FDINFO, /* /proc/<pid>/fdinfo/N: the fd is the location's proc_fd */
       DEV_PROC_LAST = DEV_PROC_FDINFO,
       /* /dev/pts/N, the slave end of pty N (N < ZB_PTY_MAX): opened by file_pty.c zb_pty_open_slave */
       DEV_PTS_FIRST = 64 };
/* st_ino of a device (stat of its path, fstat of what it opened, d_ino of its /dev/pts entry) */
#define ZB_DEV_INO(dev) (100u + (unsigned)(dev))

/* How a mounted project is seen (PROJ_*). One object per mount, shared by every copy of the trie
 * (snapshots, restores, rewinds): the files mode is a property of the session, not of the state a
 * snapshot captured, so a snapshot restored after `%sandbox files readonly` is read-only too. A
 * fork made from a snapshot gets its own (zb_fs_own_policies). */
typedef struct zb_proj_policy {
    atomic_int refs;
    atomic_int mode;
} zb_proj_policy;

typedef struct zb_mnode {
    char *name;
    struct zb_mnode *parent;
    struct zb_mnode **children;
    size_t nchildren;
    int kind;
    char *target;      /* MNT_SYMLINK; MNT_PROJECT: its hidden paths, '\n'-separated (fs_project.c) */
    uint32_t ino;      /* MNT_OVERLAY; MNT_PROJECT: the root of its upper (overlay) layer */
    int dev;           /* MNT_DEV */
    zb_proj_policy *policy; /* MNT_PROJECT: its mode (shared, see zb_proj_policy) */
    int root_fd;       /* MNT_PROJECT: O_PATH fd of the host directory, for confined host writes */
} zb_mnode;

/* overlay inodes */
enum { INO_FREE = 0, INO_DIR, INO_FILE, INO_SYMLINK, INO_WHITEOUT /* hides a project's host entry */,
       INO_SOCKET /* the name an AF_UNIX socket was bound to (sys_socket.c) */,
       INO_FIFO /* a named pipe (mkfifo, mknod S_IFIFO): its opens share one pipe (file_fifo.c) */ };

typedef struct zb_block {      /* refcounted file data, shared by snapshots until written */
    atomic_int refs;
    uint32_t cap;
    uint8_t data[];
} zb_block;
#define ZB_BLOCK_SIZE 65536u
/* st_blksize of regular files: io.open sizes its buffers from it, and every read() is a VM exit
 * (~40 us here), so a large block makes buffered reads (imports, fonts, data files) cheap. */
#define ZB_IO_BLKSIZE (1 << 20)

typedef struct zb_dirent {
    char *name;              /* refcounted (fs_overlay.c): copies of a directory share the strings */
    uint32_t ino;
} zb_dirent;

/* A directory's entries, shared by the snapshots of a sandbox until one of them changes the
 * directory (then that one copies the array; the names stay shared). Large directories have a
 * hash index (entry number + 1 per slot, open addressing, index_cap a power of two), built on
 * demand. */
typedef struct zb_dirtab {
    atomic_int refs;
    zb_dirent *ents;
    size_t n, cap;
    uint32_t *index;
    size_t index_cap;
} zb_dirtab;

typedef struct zb_inode {
    int type;
    uint32_t mode;           /* permission bits */
    uint32_t nlink;
    int readonly;            /* files put by the host (e.g. /etc/passwd) */
    int64_t atime_ns, mtime_ns, ctime_ns; /* atime changes only through utimensat (noatime) */
    zb_dirent *ents;         /* INO_DIR: dir->ents and dir->n, kept equal for readers; only */
    size_t nents;            /* fs_overlay.c changes a directory */
    zb_dirtab *dir;          /* INO_DIR: its entries (NULL while it has none) */
    uint32_t parent;         /* INO_DIR: for `..` listing */
    int opaque;              /* INO_DIR in a project's upper layer: hides the host directory below */
    uint32_t opens;          /* open file descriptions: an unlinked file lives while opened */
    uint64_t size;           /* INO_FILE */
    zb_block **blocks;
    size_t nblocks;
    char *target;            /* INO_SYMLINK */
    uint64_t sock_id;        /* INO_SOCKET: the bound socket's zb_usock.bind_id (saved with it: a
                                loaded listener keeps its name; a name whose socket is gone refuses) */
    int memfd;               /* INO_FILE made by memfd_create (sys_memfd.c): never named, stat says
                                st_nlink 0, it may carry seals */
    uint32_t seals;          /* memfd: its F_SEAL_* (F_SEAL_SEAL from the start unless
                                MFD_ALLOW_SEALING); checked by file_overlay.c and mmap */
} zb_inode;

/* The overlay's inodes, in chunks of ZB_INODE_CHUNK that the clones of an fs share until one of
 * them touches an inode of the chunk (copy-on-write per chunk): a snapshot costs a pointer per
 * chunk, not a copy of every inode and name (a guest with a million files made every checkpoint
 * copy ~250 MB of them). */
#define ZB_INODE_CHUNK 256
typedef struct zb_inode_chunk {
    atomic_int refs;
    zb_inode in[ZB_INODE_CHUNK];
} zb_inode_chunk;

struct zb_scm;
struct zb_fifo_wait;
struct zb_fs {
    zb_mnode *root;          /* shared by clones: see trie_refs */
    atomic_int *trie_refs;
    zb_inode_chunk **chunks; /* overlay inode i is chunks[i / ZB_INODE_CHUNK]->in[i % ZB_INODE_CHUNK] */
    size_t nchunks;
    size_t ninodes;          /* inode numbers in use are below this (0 is never used) */
    size_t free_hint;        /* no free inode below this number (so a new inode is found in O(1)) */
    uint64_t bytes_used, bytes_limit;
    /* Files in flight on the AF_UNIX streams of the processes using this file system (its
     * family): every zb_scm, and the references they hold (ZB_SCM_INFLIGHT_MAX). A clone has
     * none (a snapshot refuses them); freeing the file system frees them (file_stream.c). */
    struct zb_scm *scm_all;
    int scm_inflight;
    /* Threads of its family blocked in open(2) of a FIFO, each with the end it is opening (counted
     * on the pipe as Linux counts a blocked opener): file_fifo.c. A clone has none (the thread
     * starts its open over), freeing the file system closes them. */
    struct zb_fifo_wait *fifo_waits;
    uint64_t fifo_wait_ids;
    /* Advisory locks of the family's processes (flock, fcntl record and OFD locks): file_lock.c.
     * A clone has none (locks are not part of snapshots). */
    struct zb_lock *locks;
    size_t nlocks, locks_cap;
};

/* Where a resolved path lives. */
enum { LOC_SYNTH = 1, LOC_HOST, LOC_OVERLAY, LOC_DEV, LOC_SYMLINK /* trie symlink or /proc/self/exe */ };
typedef struct zb_loc {
    int kind;
    zb_mnode *mnode;         /* trie node at this exact path, if any */
    uint32_t ino;            /* LOC_OVERLAY */
    int dev;                 /* LOC_DEV */
    int is_dir;
    int host_is_dir;         /* LOC_HOST: lstat said directory */
    int proj;                /* inside a project directory: its PROJ_* mode, else 0 */
    zb_mnode *proj_root;     /* that project's trie node */
    int lower;               /* project: the host has this object too (not hidden) */
    uint32_t upper;          /* project, overlay mode: the upper-layer inode here, or 0 */
    int32_t pid;             /* /proc/<pid> and what is below it: the process of the family it names
                                (fs_proc.c zb_proc_target); 0: the caller's own (/proc/self) */
    int32_t proc_fd;         /* /proc/<pid>/fd/N and fdinfo/N: N + 1; 0 elsewhere */
} zb_loc;

typedef struct zb_resolved {
    int exists;
    zb_loc loc;              /* when exists */
    zb_loc parent;           /* the containing directory (also when !exists, for creation) */
    char path[PATH_MAX];     /* canonical absolute guest path (== host path for LOC_HOST) */
    char name[NAME_MAX + 1]; /* last component */
    int opaque;              /* project overlay: a new directory here must hide the host's */
} zb_resolved;

#define ZB_DEV_ID 0x7a62 /* st_dev of synthetic and overlay files: one filesystem, so stat and
                           fstat of one file agree (os.path.samestat, shutil.rmtree) */

#define ZB_RESOLVE_NOFOLLOW 1 /* do not follow a symlink in the last component */

/* fs_namespace.c */
zb_fs *zb_fs_new(char *err);
zb_fs *zb_fs_clone(const zb_fs *fs);
/* Give fs a trie of its own (it is shared by clones until changed). map receives (old, new)
 * node pairs, 2*n entries (free it); nothing happens if the trie is already private. */
int zb_fs_privatize_trie(zb_fs *fs, zb_mnode ***map, size_t *nmap, char *err);
void zb_fs_free(zb_fs *fs);
int zb_fs_view_add(zb_fs *fs, const char *host_path, char *err);
int zb_fs_overlay_dir(zb_fs *fs, const char *guest_path, char *err);
int zb_fs_put_file(zb_fs *fs, const char *guest_path, const void *data, size_t len, char *err);
/* Resolve `path` relative to the directory `base` (a canonical guest path). 0 or -errno;
 * a missing last component is not an error (out->exists == 0) but a missing parent is. */
int zb_fs_resolve(zb_sandbox *sb, const char *base, const char *path, int flags, zb_resolved *out);
int zb_fs_stat(zb_sandbox *sb, const zb_resolved *r, struct stat *st);
/* The path walk's last host lstat, reused by the stat or open that follows it in the same syscall
 * (os.stat costs one host lstat, not two): valid only while the same guest syscall is being served
 * (util.h zb_syscall_serial) and no host call has been made since (so never after a change the
 * syscall itself made). get: 0 and *st if host_path is the one lstat'ed, else -1. */
void zb_walk_stat_put(const char *host_path, const struct stat *st);
int zb_walk_stat_get(const char *host_path, struct stat *st);
void zb_dev_stat(int dev, struct stat *st);
/* Directory listing as name/type/ino triples, for getdents64. Names are unique: a hash index
 * (index, index_cap slots holding entry number + 1) finds duplicates in O(1), so a listing of
 * 100,000 entries costs milliseconds, not the seconds a scan per entry took. An open directory's
 * listing is immutable once taken and shared by the clones of its fd table (refs), so a snapshot
 * never copies it; `bytes` is what it holds, charged to the sandbox's ZB_LISTING_BUDGET. */
typedef struct zb_listing {
    size_t n, cap;
    struct zb_listing_ent { char *name; unsigned char type; uint64_t ino; } *ents;
    uint32_t *index;
    size_t index_cap;
    size_t bytes;
    atomic_int refs;         /* cached listings of open directories (fdtable.c); 0 elsewhere */
} zb_listing;
/* Host memory the cached listings of one sandbox's open directories may hold together (ENOMEM
 * to getdents64 beyond): 1,018 fds on a directory of 2,000 long names once took 550 MB. */
#define ZB_LISTING_BUDGET (32ull << 20)
/* The hash of a file name for the listings' and overlay directories' indexes (FNV-1a). */
uint64_t zb_name_hash(const char *name);
/* Name indexes of zb_listing and zb_dirtab (fs_listing.c): open addressing over an array of
 * entries whose first member is `char *name`, `stride` bytes apart; each slot holds an entry
 * number + 1 (0 = empty); cap is a power of two. zb_name_slot finds `name`'s slot (or the empty
 * one where it would go); zb_name_index_build replaces *index by one for the first n entries,
 * sized for `want` (-ENOMEM leaves the old one). */
size_t zb_name_slot(const uint32_t *index, size_t cap, const void *ents, size_t stride, const char *name);
int zb_name_index_build(uint32_t **index, size_t *cap, const void *ents, size_t stride, size_t n, size_t want);
/* 1 if the listing has an entry of that name. */
int zb_listing_has(const zb_listing *l, const char *name);
/* A cached listing is dropped by its last open directory. */
void zb_listing_unref(zb_listing *l);
int zb_fs_list(zb_sandbox *sb, const zb_resolved *r, zb_listing *out);
void zb_listing_free(zb_listing *l);
/* file_dir.c, for the entry's getdents64 answer (guest_abi.h ZB_ENTRY_READ_BUF): the directory's
 * listing from its offset on as getdents64 records into out (the listing taken if it was not),
 * the bytes written, or -ENOSPC if it does not all fit in len (-errno else); and how many whole
 * records the first len bytes of such records hold (the offset they move the directory by). */
long zb_dir_dirents_all(zb_sandbox *sb, struct zb_file *f, uint8_t *out, size_t len);
uint64_t zb_dir_dirents_count(const uint8_t *p, size_t len);
/* The directory's listing dropped (the next getdents64 takes it again). */
void zb_dir_drop_listing(struct zb_file *f);
/* fs_trie.c: the trie's nodes (the bottom of the namespace's layers: fs_trie.c and fs_listing.c,
 * then fs_project.c, then fs_namespace.c, then fs_export.c; each uses only those before it) */
zb_mnode *zb_mnode_child(const zb_mnode *n, const char *name);
zb_mnode *zb_mnode_add(zb_mnode *parent, const char *name, int kind);
/* Free a node and its subtree (closing a project's directory fd, dropping its policy). */
void zb_mnode_free(zb_mnode *n);
/* The next component of a path at *p (advanced past it) into comp: 1, 0 at the end, or
 * -ENAMETOOLONG for one longer than NAME_MAX. */
int zb_path_component(const char **p, char *comp);
/* The trie node for guest_path's parent, creating synthetic directories on the way; the last
 * component goes to name. The trie must be private (zb_fs_require_private). */
zb_mnode *zb_trie_parent(zb_fs *fs, const char *guest_path, char *name, char *err);
int zb_fs_require_private(zb_fs *fs, char *err);
/* The guest (== host) path of a trie node. */
int zb_mnode_path(const zb_mnode *m, char *buf, size_t cap);

/* A path argument of a syscall: read the guest string at upath and resolve it relative to dirfd
 * (AT_FDCWD = the cwd). With empty_ok, an empty path means dirfd itself (AT_EMPTY_PATH). */
int zb_path_arg(zb_sandbox *sb, int64_t dirfd, uint64_t upath, int resolve_flags, int empty_ok, zb_resolved *r);

/* fs_project.c: a host directory seen read-only, through a private overlay, or read-write */
/* The mode bits a guest may give what it creates on the host (read-write projects): permissions
 * only, never S_ISUID, S_ISGID or S_ISVTX (a setuid file the host's user could be tricked into
 * running). Host chmod is not offered at all (EOPNOTSUPP). */
#define ZB_HOST_MODE_BITS 0777u
int zb_fs_mount_project(zb_fs *fs, const char *host_dir, int mode, char *err);
/* The project node mounted from host_dir, or NULL. */
zb_mnode *zb_fs_find_project(zb_fs *fs, const char *host_dir);
/* Works on a shared trie: only the mount's policy changes. */
int zb_fs_set_project_mode(zb_fs *fs, const char *host_dir, int mode, char *err);
zb_proj_policy *zb_proj_policy_new(int mode);
void zb_proj_policy_unref(zb_proj_policy *p);
static inline int zb_mnode_proj_mode(const zb_mnode *m) { return m && m->policy ? atomic_load(&m->policy->mode) : PROJ_NONE; }
/* Give every project of a private trie a policy of its own, with the same modes (a fork). */
int zb_fs_own_policies(zb_fs *fs);
/* 1 if the trie (shared or not) has a project mount. */
int zb_fs_has_project(const zb_fs *fs);
struct zb_file;
/* May the guest change a file through this open description? -EROFS when it was opened in a
 * project whose files mode has changed since (a stricter mode applies to open fds at once). */
int zb_file_write_check(const struct zb_file *f);
zb_loc zb_proj_root_loc(zb_sandbox *sb, zb_mnode *m);
int zb_proj_lookup(zb_sandbox *sb, const zb_loc *dir, const char *path, const char *name, zb_loc *out, char *link);
int zb_proj_list(zb_sandbox *sb, const zb_resolved *r, zb_listing *out);
/* Overlay mode: before changing r (create = r names something new), bring what it names (or its
 * parent directory) into the upper layer; r is updated to point there. */
int zb_proj_copy_up(zb_sandbox *sb, zb_resolved *r, int create);
/* Overlay mode: unlink or rmdir r, leaving a whiteout where the host has an entry. */
int zb_proj_remove(zb_sandbox *sb, zb_resolved *r, int dir);
/* A project file's host stat as the guest sees it: what the engine's own user owns on the host
 * (the notebook's files) is the guest user's, as under ipykernel, where the user owns them (git
 * refuses a repository its user does not own, pip and ssh check owners); other owners stay. */
void zb_proj_owner(struct stat *st);
/* Read-write mode: the project root fd and r's path relative to it, for *at() host calls. */
int zb_proj_host_path(const zb_resolved *r, char *rel, size_t cap);
/* Read-write mode: an O_PATH fd of r's parent directory (confined) and r's last component. */
int zb_proj_host_parent(const zb_resolved *r, char *name, size_t cap);
/* Read-write mode: open r on the host, confined (for writing, creating, truncating). */
int zb_proj_host_open(const zb_resolved *r, int flags, unsigned mode);
int zb_fs_project_hide(zb_fs *fs, const char *host_dir, const char *paths, char *err);
int zb_proj_hidden(const zb_mnode *root, const char *host_path);
int zb_proj_hidden_children(const zb_mnode *root, const char *dir_path, zb_listing *hide);
int zb_host_lstat(const char *path, struct stat *st);
/* fs_export.c: what the host reads out of the sandbox (binary records, zeroboot.h) */
long zb_project_diff(zb_sandbox *sb, const char *host_dir, char *buf, size_t len, char *err);
long zb_guest_read_file(zb_sandbox *sb, const char *guest_path, uint64_t offset, void *buf, size_t len, char *err);
long zb_guest_list_dir(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err);
long zb_guest_stat(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err);
/* fs_listing.c: listings (see zb_listing above) and host reads for the view and projects */
int zb_listing_add(zb_listing *l, const char *name, unsigned char type, uint64_t ino);
/* A host directory's listing, less the hidden names; while sb runs (sb may be NULL) it gives up
 * with ZB_DEADLINE_PASSED at the run's deadline or a kick. */
int zb_list_host_dir_for(zb_sandbox *sb, const char *path, zb_listing *out, const zb_listing *hide);
/* Open a host file of the view or of a project for reading (dir: a directory), symlink-free.
 * Only regular files and directories are opened: -EACCES for FIFOs, sockets and devices. */
int zb_host_open_ro(const char *path, int dir);
/* fd if it (a host file just opened) is a regular file or a directory, else -EACCES (closing it). */
int zb_host_fd_ordinary(int fd);
/* The target of symlink location l (LOC_SYMLINK): the trie's own, or what /proc/<pid>/exe, cwd
 * or fd/N say now; its length, or -errno (-ENOENT: the process or the fd is gone). */
int zb_fs_symlink_target(zb_sandbox *sb, const zb_loc *l, char *buf, size_t cap);
/* fs_proc.c */
int zb_proc_add_files(zb_mnode *proc, zb_mnode *self);
int zb_dev_is_proc(int dev);
long zb_proc_snapshot(zb_sandbox *sb, const zb_loc *l); /* a new unnamed inode with the content of the
                                                         /proc file at l (l->dev of process l->pid), or -errno */
/* What /proc/<pid>/fd/N of process t says fd is (Linux's forms: the path it was opened by,
 * pipe:[ino], socket:[ino], anon_inode:[kind]): its length, or -ENOENT if fd is not open there. */
int zb_proc_fd_link(zb_sandbox *t, int fd, char *buf, size_t cap);
/* The entries of /proc/<pid>/fd (DT_LNK) or fdinfo (DT_REG): the open fds of process pid. */
int zb_proc_list_fds(zb_sandbox *sb, int32_t pid, unsigned char dtype, zb_listing *out);
/* The live process of sb's family that /proc/<pid> names (0: sb itself), or NULL: processes outside
 * the family have no /proc entry here, and a zombie's entry has files of its own (zb_proc_exists). */
zb_sandbox *zb_proc_target(zb_sandbox *sb, int32_t pid);
int zb_proc_exists(zb_sandbox *sb, int32_t pid); /* /proc/<pid> exists: a live process or a zombie of the family */
int zb_proc_list_pids(zb_sandbox *sb, zb_listing *out); /* /proc's numeric entries */

/* fs_overlay.c */
uint32_t zb_ovl_new_inode(zb_fs *fs, int type, uint32_t mode);
/* A live inode, writable (its chunk is made this fs's own first), or NULL. */
zb_inode *zb_ovl_inode(zb_fs *fs, uint32_t ino);
/* Slot i (live or free) without copying its chunk: for reading only (saving, accounting). */
const zb_inode *zb_ovl_peek(const zb_fs *fs, size_t i);
/* The d_type a listing gives the inode (DT_DIR, DT_LNK, DT_SOCK, DT_FIFO or DT_REG). */
unsigned char zb_ovl_dtype(const zb_inode *in);
/* Slot i, writable; and room for n slots (loading a snapshot): 0 or -1. */
zb_inode *zb_ovl_slot(zb_fs *fs, size_t i);
int zb_ovl_reserve(zb_fs *fs, size_t n);
/* Loading: append an entry to a directory inode (no charge, no duplicate check): 0 or -ENOMEM. */
int zb_ovl_dir_append(zb_inode *d, const char *name, uint32_t ino);
uint32_t zb_ovl_lookup(zb_fs *fs, uint32_t dir, const char *name);
int zb_ovl_link(zb_fs *fs, uint32_t dir, const char *name, uint32_t ino);
int zb_ovl_unlink(zb_fs *fs, uint32_t dir, const char *name);
long zb_ovl_read(zb_fs *fs, uint32_t ino, void *buf, size_t len, uint64_t off);
long zb_ovl_write(zb_fs *fs, uint32_t ino, const void *buf, size_t len, uint64_t off);
int zb_ovl_truncate(zb_fs *fs, uint32_t ino, uint64_t size);
int zb_ovl_clone(zb_fs *dst, const zb_fs *src);
void zb_ovl_free_all(zb_fs *fs);
void zb_ovl_stat(zb_fs *fs, uint32_t ino, struct stat *st);
/* Host memory the overlay's metadata holds that no clone shares (inode chunks, directory tables,
 * block tables and symlink targets of those chunks; data blocks and names are not counted). */
uint64_t zb_ovl_private_bytes(const zb_fs *fs);
/* A symlink inode's target, charged to the overlay's limit: 0, -ENOSPC or -ENOMEM. */
int zb_ovl_set_target(zb_fs *fs, uint32_t ino, const char *target);
/* Release an inode that was never linked or opened (a creation that failed half way). */
void zb_ovl_discard(zb_fs *fs, uint32_t ino);
/* What an inode's metadata (inode, entry names, symlink target) is charged to the limit. */
uint64_t zb_ovl_meta_cost(const zb_inode *in);
void zb_block_unref(zb_block *b);
/* Count open file descriptions of an inode; an unlinked, no longer open file is released. */
void zb_ovl_open_ref(zb_fs *fs, uint32_t ino, int delta);

/* fdtable.c: open file descriptions (shared by dup'ed fds) and the fd table.
 * The kinds of open files, one line each in file_kinds.h (their numbers are saved in snapshots). */
enum {
#define ZB_FILE_KIND(kind, number, ops) kind = number,
#include "file_kinds.h"
#undef ZB_FILE_KIND
    FILE_KIND_END
};
/* Bytes a pipe or a socket direction holds: what Linux's pipes hold by default (16 pages). Stream
 * buffers are engine memory and every snapshot copies them: with 1 MiB per pipe, a guest filling
 * ~500 pipes held 0.5 GiB of the engine's memory per snapshot. */
#define ZB_STREAM_CAP 65536u
/* The most F_SETPIPE_SZ gives a pipe: Linux's default /proc/sys/fs/pipe-max-size (1 MiB), also for
 * the guest (root could go beyond on Linux; here it is EPERM like for an unprivileged user). */
#define ZB_PIPE_MAX_SIZE (1u << 20)
/* What the enlarged pipes of one family may hold together (F_SETPIPE_SZ is EPERM past it, as
 * Linux's pipe-user-pages-soft, 16384 pages, refuses an unprivileged user): the stream bytes are
 * engine memory, so ~500 pipes of 1 MiB would again be 0.5 GiB (SECURITY.md, pipe buffers). */
#define ZB_PIPE_ENLARGED_BUDGET (64u << 20)

typedef struct zb_hostfd {    /* a host fd shared by clones: we always use pread with our offset */
    atomic_int refs;
    int fd;
} zb_hostfd;

/* Bytes a stream holds, shared by the snapshots of a sandbox until one of them writes. */
typedef struct zb_bytes {
    atomic_int refs;
    size_t cap;
    uint8_t data[];
} zb_bytes;

/* A byte stream in one direction: a pipe, or one direction of a socketpair. Its unread bytes are
 * buf->data[start, start + len): a read only moves `start`, a write appends (copying the bytes
 * first if a snapshot shares them), so a snapshot copies no stream buffer. */
/* A pseudo-terminal's state (file_pty.c), held by its input stream (master -> slave), which both
 * ends reach: the master as its tx, the slave as its rx. termios is the kernel's struct termios
 * (TCGETS), shared by both ends as in Linux (termios ioctls on the master act on the slave). */
#define ZB_PTY_MAX 64            /* ptys per sandbox (its process family): ENOSPC past it */
#define ZB_TTY_NCCS 19
typedef struct zb_tty {
    uint32_t iflag, oflag, cflag, lflag;
    uint8_t line, cc[ZB_TTY_NCCS];
    uint16_t rows, cols, xpixel, ypixel;
    uint32_t index;          /* N of /dev/pts/N, < ZB_PTY_MAX */
    uint32_t locked;         /* TIOCSPTLCK: the slave cannot be opened yet */
    int32_t pgrp, sid;       /* foreground process group and controlling session (0: none) */
} zb_tty;

/* Files passed with SCM_RIGHTS (sys_socket.c), in flight on a socket's stream: attached to the
 * bytes [pos, end) of the message they came with (positions count every byte the stream ever
 * carried, zb_pipe.consumed). A read never goes past `end` once it reached `pos` (Linux's skb
 * boundary) and takes them: recvmsg installs them as fds, any other read closes them. Each holds
 * one reference to each file. They are on their stream's list (oldest first) and on their file
 * system's (fs->scm_all); a stream nobody reads any more, or that ends, drops its own. */
#define ZB_SCM_MAX_FD 253          /* files per message: Linux's SCM_MAX_FD (EINVAL past it) */
#define ZB_SCM_INFLIGHT_MAX 1024   /* references in flight per file system (a family): ETOOMANYREFS
                                      past it (Linux: the sender's RLIMIT_NOFILE, per user) */
typedef struct zb_scm {
    struct zb_scm *next, *prev;    /* on its stream */
    struct zb_scm *all_next, *all_prev; /* on fs->scm_all */
    struct zb_pipe *pipe;
    zb_fs *fs;
    uint64_t pos, end;
    int n;
    struct zb_file *files[];
} zb_scm;

typedef struct zb_pipe {
    atomic_int refs;
    zb_bytes *buf;
    size_t start, len;
    uint64_t consumed;       /* bytes ever read from it: the position of buf->data[start] */
    zb_scm *scm_head, *scm_tail; /* files in flight on it (sockets; never copied by a clone) */
    int readers, writers;    /* open file descriptions reading / writing it */
    zb_tty *tty;             /* a pty's input stream: the pty's state (owned; NULL for others) */
    int reset;               /* a socket's incoming stream whose server end was closed before its
                                accept: the next read of it, once empty, is ECONNRESET (Linux's
                                sk_err); copied by clones, not saved */
    size_t cap;              /* bytes it may hold, set by F_SETPIPE_SZ (a power of two, one page to
                                ZB_PIPE_MAX_SIZE); 0: ZB_STREAM_CAP */
    uint64_t r_opens, w_opens; /* a FIFO's pipe: opens for reading / writing so far (Linux's r_counter,
                                w_counter: a blocked opener goes on once the other side's changed);
                                copied by clones, not saved */
} zb_pipe;
static inline size_t zb_stream_cap(const zb_pipe *p) { return p->cap ? p->cap : ZB_STREAM_CAP; }

/* An epoll instance's interest list (sys_epoll.c). An item names a guest fd and the id of the
 * open file description it had when added: closing that description silently ends the item, as in
 * Linux, because the fd then holds another description (or none). */
typedef struct zb_epoll_item {
    int fd;
    uint64_t file_id;
    uint32_t events;         /* EPOLLIN, EPOLLOUT, ..., EPOLLONESHOT */
    uint64_t data;
    int disarmed;            /* EPOLLONESHOT after it fired */
} zb_epoll_item;

typedef struct zb_epoll {
    zb_epoll_item *items;
    int n, cap;
} zb_epoll;

struct zb_file_ops;
struct zb_out; /* serial.h: the snapshot writer and reader */
struct zb_in;

typedef struct zb_file {
    int refs;
    int kind;                /* FILE_*: which entry of file_kinds.h made it */
    const struct zb_file_ops *ops; /* that kind's operations (never NULL) */
    int flags;               /* open flags: access mode, O_APPEND, O_NONBLOCK, ... */
    uint64_t offset;
    zb_hostfd *host;         /* FILE_HOST and host directories */
    uint32_t ino;            /* FILE_OVERLAY, overlay directories */
    int dev;                 /* FILE_DEV */
    int stream;              /* FILE_CONSOLE: 1 stdout, 2 stderr */
    zb_pipe *rx, *tx;        /* FILE_PIPE: rx (read end) or tx (write end); FILE_SOCKET: both, the
                                peer's tx is this end's rx; NULL after shutdown() */
    zb_epoll *epoll;         /* FILE_EPOLL */
    uint64_t id;             /* unique in its fd table's lineage, given when first installed */
    zb_resolved *where;      /* what was opened (NULL for consoles, pipes, sockets, epolls): from
                                zb_where_new, shared by the table's clones (copy before changing) */
    zb_listing *listing;     /* FILE_DIR: taken at the first getdents64 */
    void *priv;              /* a kind's own state (FILE_EVENTFD: its counter), owned by its ops */
    /* the timed answers (guest_abi.h): a read in syscall eof_seq (zb_syscall_seq), at host time
     * eof_ns, ended at the end of this regular file; never saved */
    uint64_t eof_seq;
    int64_t eof_ns;
} zb_file;

struct zb_fdtable {
    zb_file *fd[ZB_MAX_FDS];
    uint8_t cloexec[ZB_MAX_FDS];
    uint64_t next_file_id;
};


/* Advisory file locks (file_lock.c): flock(2) and fcntl's F_GETLK/F_SETLK(W)/F_OFD_* on f, and
 * the releases Linux makes: a process closing a descriptor of the file (its record locks), a
 * description's last reference going (its flock and OFD locks), a process ending. */
long zb_lock_flock(zb_sandbox *sb, zb_file *f, unsigned op);
long zb_lock_fcntl(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t uflock);
void zb_lock_closed_fd(zb_sandbox *sb, zb_file *f);
void zb_lock_file_gone(zb_fs *fs, const zb_file *f);
void zb_lock_process_gone(zb_fs *fs, int32_t pid);
void zb_lock_free_all(zb_fs *fs);

/* What a kind of open file does (Linux's struct file_operations). The syscall handlers decode and
 * validate their arguments, then call these; a NULL entry means the kind does not support the
 * operation, and the handler answers what Linux answers then (noted per entry). A kind's ops live
 * in its own file (file_host.c, file_pipe.c, ...) and are registered by one line in file_kinds.h. */
typedef struct zb_file_ops {
    const char *name;
    unsigned props;          /* ZB_FOPS_* */
    int status_flags;        /* added to F_GETFL's answer (a directory's O_DIRECTORY) */
    /* Read into p or write from p (host memory the handler validated): at the file offset, which
     * advances, when off < 0, else at off (only called with off >= 0 if positional says so).
     * NULL: EBADF. */
    long (*read)(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off);
    long (*write)(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off);
    /* Whether pread/pwrite/preadv/pwritev apply (NULL: no, ESPIPE). */
    int (*positional)(const zb_file *f);
    /* lseek (whence not yet checked; NULL: ESPIPE). */
    long (*seek)(zb_sandbox *sb, zb_file *f, int64_t off, int whence);
    /* ftruncate to size (access mode and project mode checked; NULL: EINVAL). */
    long (*truncate)(zb_sandbox *sb, zb_file *f, uint64_t size);
    /* fallocate mode 0 up to end (arguments checked; NULL: EOPNOTSUPP). */
    long (*fallocate)(zb_sandbox *sb, zb_file *f, uint64_t end);
    /* getdents64 into the guest's buffer (NULL: ENOTDIR). */
    long (*getdents)(zb_sandbox *sb, zb_file *f, uint64_t addr, uint64_t len);
    /* mmap: fill [addr, addr + len) of guest memory from offset off (NULL: ENODEV). */
    long (*mmap_fill)(zb_sandbox *sb, zb_file *f, uint64_t addr, uint64_t len, uint64_t off);
    /* fstat (NULL: the resolved location's stat, zb_fs_stat). */
    long (*stat)(zb_sandbox *sb, zb_file *f, struct stat *st);
    /* fchown to ids the caller leaves unchecked (NULL: the guest's own file, zb_own_ids). */
    long (*chown)(zb_sandbox *sb, zb_file *f, uint64_t uid, uint64_t gid);
    /* The overlay inode whose metadata fchmod/futimens change, or 0 (NULL: none, EROFS). */
    uint32_t (*overlay_ino)(const zb_file *f);
    /* poll events it has now, among `want` (the caller adds POLLERR/POLLHUP/POLLNVAL to the mask);
     * sets *waits_uart when only UART input could make it ready (NULL: always readable and
     * writable, as regular files are). */
    short (*ready)(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart);
    /* Bytes a read would get now, for FIONREAD (NULL: 0). */
    int (*unread)(zb_sandbox *sb, const zb_file *f);
    /* fcntl commands of this kind only (F_GETPIPE_SZ); NULL: F_GETPIPE_SZ is EBADF, others EINVAL. */
    long (*fcntl)(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t arg);
    /* ioctl commands of this kind (FIONBIO/FIOCLEX/FIONREAD are generic); NULL: ENOTTY. The kind
     * validates arg (a guest pointer for most commands). */
    long (*ioctl)(zb_sandbox *sb, zb_file *f, uint64_t cmd, uint64_t arg);
    /* Lifetime. What any kind may hold (host fd, overlay inode, rx/tx streams, the location) is
     * fdtable.c's to release and clone; these handle what only the kind holds (listing, epoll,
     * priv). release: before the generic parts go (fs may be NULL: a table that never ran).
     * clone: into dst, a copy of src sharing its host fd, inode and location, whose listing,
     * epoll and priv are NULL (a failure releases dst). save/load: the kind's state in a snapshot,
     * a u32 count of records then the records (NULL: writes 0 / requires 0); load gets the file
     * with its generic fields read and must check what it reads. reopen: what a loaded file had
     * open on the host (NULL: nothing). */
    void (*release)(zb_fs *fs, zb_file *f);
    int (*clone)(zb_file *dst, const zb_file *src);
    void (*save)(const zb_file *f, struct zb_out *o);
    int (*load)(zb_file *f, struct zb_in *in);
    int (*reopen)(zb_file *f, const zb_resolved *r, char *err);
    /* Host memory a clone of it takes beyond the zb_file (zb_fdtable_copy_bytes; NULL: none). */
    uint64_t (*copy_bytes)(const zb_file *f);
} zb_file_ops;

/* zb_file_ops.props */
#define ZB_FOPS_WRITE_ANY_MODE 1 /* writes ignore the O_RDONLY access mode (the kind checks: pipes) */
#define ZB_FOPS_NO_EPOLL 2       /* epoll_ctl refuses it with EPERM (regular files and directories) */
#define ZB_FOPS_STREAMS 4        /* has rx/tx streams (pipes, sockets): a snapshot may attach them */
#define ZB_FOPS_BLOCKS 64        /* EAGAIN from read/write means "would block": on a blocking fd the
                                    syscall waits (zb_io_would_block) for another thread or process */
#define ZB_FOPS_MMAP_COPIES 8    /* a mapping is a copy: shared writable mappings would lose writes (ENODEV) */
#define ZB_FOPS_SHARED_MAP 16    /* ... unless this is set too: shared mappings of its overlay inode
                                    (overlay_ino) are kept coherent with it (shared_map.c) */
#define ZB_FOPS_WHOLE_WRITES 128 /* a blocking write(2) returns once all its bytes are in, waiting for
                                    room as often as needed (Linux's pipe_write, unix_stream_sendmsg):
                                    pipes and AF_UNIX stream sockets */

#define ZB_FILE_KIND(kind, number, ops) extern const zb_file_ops ops;
#include "file_kinds.h"
#undef ZB_FILE_KIND
/* The operations of kind, or NULL for a number no kind has (a corrupt snapshot). */
const zb_file_ops *zb_file_kind_ops(int kind);
static inline int zb_always(const zb_file *f) { (void)f; return 1; }
/* The ids chown may give what the guest owns: its own (1000) or unchanged (-1); else EPERM. */
static inline long zb_own_ids(uint64_t uid, uint64_t gid) {
    return ((uint32_t)uid == 1000 || (uint32_t)uid == (uint32_t)-1) && ((uint32_t)gid == 1000 || (uint32_t)gid == (uint32_t)-1)
               ? 0 : -EPERM;
}
/* lseek of a file with a size: SEEK_SET/CUR/END/DATA/HOLE within [0, INT64_MAX]. */
long zb_file_seek_sized(zb_file *f, int64_t off, int whence, int64_t size);
/* fstat of a file with no name (pipes, sockets, the console, epoll and eventfd files). */
void zb_file_stat_anon(struct stat *st, unsigned mode);

/* The resolved location an open file keeps: refcounted, shared by the clones of an fd table (a
 * snapshot copies none of the 4 KiB paths). zb_where_own makes f's its own before a change. */
zb_resolved *zb_where_new(void);
void zb_where_unref(zb_resolved *w);
int zb_where_own(struct zb_file *f);
zb_fdtable *zb_fdtable_new(void);
/* The clone's overlay inodes are the source's (same numbers, opens already counted). */
zb_fdtable *zb_fdtable_clone(const zb_fdtable *t);
/* After a fork: the fds of dst (a clone of src, its copies counted in dst_fs) become src's own open
 * file descriptions, shared as Linux shares them across fork() (offsets, stream ends, overlay
 * inodes, directory positions), but for epolls and internet sockets, which stay dst's copies. The
 * child then uses src's file system (zb_family_fork_sandbox). */
void zb_fdtable_share(zb_fdtable *dst, zb_fs *dst_fs, const zb_fdtable *src);
/* The result of a read or write of f that transferred nothing: on a blocking fd of a ZB_FOPS_BLOCKS
 * kind, -EAGAIN becomes a wait (ZB_SYSCALL_BLOCK / ZB_SYSCALL_STOP, the syscall served again, or
 * -EINTR); a write's -EPIPE raises SIGPIPE unless no_sigpipe. Other results pass through. */
long zb_io_would_block(zb_sandbox *sb, const struct zb_file *f, long r, int is_write, int nonblock, int no_sigpipe);
void zb_fdtable_free(zb_fdtable *t, zb_fs *fs);
zb_file *zb_file_new(int kind);
void zb_file_unref(zb_fs *fs, zb_file *f);
zb_file *zb_fd_get(zb_sandbox *sb, uint64_t fd);
/* fstat of an open file: what newfstatat(fd, "", buf, AT_EMPTY_PATH) gives (sys_fsmeta.c). */
long zb_file_stat(zb_sandbox *sb, zb_file *f, struct stat *st);
/* Install f at the lowest free fd >= min; returns the fd or -EMFILE. Takes the reference. */
int zb_fd_install(zb_sandbox *sb, zb_file *f, int min, int cloexec);
/* The fds the process may use: below its RLIMIT_NOFILE soft limit and the table's ZB_MAX_FDS
 * (fds already open above a lowered limit stay usable, as on Linux). */
int zb_fd_limit(const zb_sandbox *sb);
int zb_fd_close(zb_sandbox *sb, int fd);
/* Host memory a clone of the table takes on its own (descriptions, resolved paths, stream buffers,
 * epoll items; listings and host fds are shared, not counted). */
uint64_t zb_fdtable_copy_bytes(const zb_fdtable *t);
/* Bytes the distinct cached listings of the table's open directories hold (ZB_LISTING_BUDGET). */
size_t zb_fdtable_listing_bytes(const zb_fdtable *t);
/* Host fds the engine keeps for itself (snapshot stores, KVM, the kernel's sockets, transient
 * opens): guests together hold at most RLIMIT_NOFILE minus this many (EMFILE to the guest first),
 * so that a cell opening ~1,000 files under `ulimit -n 1024` cannot starve the engine. */
#define ZB_HOST_FD_HEADROOM 128
/* 0 if a guest may take one more host fd, else -EMFILE. */
int zb_host_fd_room(void);
zb_hostfd *zb_hostfd_new(int fd);
void zb_hostfd_unref(zb_hostfd *h);
/* file_stream.c: a new stream (no file holds it yet) */
zb_pipe *zb_pipe_new(void);
/* Free a stream no file holds (loading); its unread bytes. */
void zb_pipe_free(zb_pipe *p);
static inline const uint8_t *zb_pipe_bytes(const zb_pipe *p) { return p->buf ? p->buf->data + p->start : NULL; }
/* Attach a stream to f as its rx or tx (counting f as a reader or writer); takes a reference. */
void zb_file_attach_rx(zb_file *f, zb_pipe *p);
void zb_file_attach_tx(zb_file *f, zb_pipe *p);
/* Detach them again (shutdown, close). The last reader of a stream going drops the files in
 * flight on it (nobody can receive them): Linux purges a closed socket's queue. */
void zb_file_detach_rx(zb_file *f);
void zb_file_detach_tx(zb_file *f);
/* SCM_RIGHTS (file_stream.c). A record for n files (1..ZB_SCM_MAX_FD; NULL: out of memory),
 * made before anything is sent; the caller fills r->files (a reference each) and links it to pp
 * at the bytes [pos, end) it sent, or frees it (free()) with none taken. */
zb_scm *zb_scm_new(int n);
void zb_scm_link(zb_fs *fs, zb_pipe *pp, zb_scm *r, uint64_t pos, uint64_t end);
/* Take a record off its stream and file system (a read reached it): the caller owns it. */
void zb_scm_unlink(zb_scm *r);
/* Drop a record taken off its lists: its references closed, iteratively (a file it closes can end
 * a stream whose records go the same way, never by recursion). */
void zb_scm_drop(zb_scm *r);
/* The file system ends (its family's end, a restore): every file in flight on it goes. */
void zb_scm_free_all(zb_fs *fs);
/* Read from a stream that may carry files: as zb_stream_read, but stopping at the end of the
 * first record it reaches; that record is taken into *taken (its caller's), or dropped when taken
 * is NULL. peek: copy from `skip` on without consuming; *taken is then the record seen (still on
 * the stream, not the caller's). */
long zb_stream_read_scm(zb_pipe *pp, uint8_t *p, size_t n, zb_scm **taken);
long zb_stream_peek_scm(const zb_pipe *pp, uint8_t *p, size_t n, size_t skip, zb_scm **seen);
/* file_epoll.c */
void zb_epoll_free(zb_epoll *e);
zb_epoll *zb_epoll_copy(const zb_epoll *e);

/* file_stream.c: streams (pipes and socket directions). Reading an empty stream says EAGAIN while a
 * writer exists (never blocks: see file_pipe.c), EOF (0) without; writing one nobody reads, EPIPE. */
long zb_stream_read(zb_pipe *pp, uint8_t *p, size_t n);
long zb_stream_write(zb_pipe *pp, const uint8_t *p, size_t n);
/* Append up to n bytes whether or not anything reads it (ptys): the count taken, -EAGAIN if full. */
long zb_stream_append(zb_pipe *pp, const uint8_t *p, size_t n);
/* file_pty.c: open /dev/ptmx (a new pty's master end). */
long zb_pty_open_master(zb_sandbox *sb, zb_file **out);
/* file_pty.c, /dev/pts: the device (DEV_PTS_FIRST + N) of the entry `name` (a guest string) of the
 * directory, or -ENOENT: an entry exists while pty N's master is open in the sandbox's processes. */
int zb_pty_lookup(zb_sandbox *sb, const char *name);
/* Add the entries of the open ptys to a listing of /dev/pts: 0 or -errno. */
int zb_pty_list(zb_sandbox *sb, zb_listing *out);
/* Open /dev/pts/N (dev DEV_PTS_FIRST + N): another slave end of pty N, as TIOCGPTPEER opens one. */
long zb_pty_open_slave(zb_sandbox *sb, int dev, uint64_t flags, zb_file **out);
/* A copy of a stream for a cloned fd table: its unread bytes shared until either side writes. */
zb_pipe *zb_pipe_copy(const zb_pipe *s);
/* FIONREAD of a stream end: the bytes its rx holds. */
int zb_stream_unread(zb_sandbox *sb, const zb_file *f);
/* An in-memory stream socket made by socket(2) or accept(2): FILE_SOCKET's priv (file_socket.c owns
 * it; sys_socket.c has the calls): AF_UNIX, or AF_INET/AF_INET6 on the sandbox's own loopback
 * (sock_loopback.c). A socketpair end has none until it is bound: it is connected and unnamed.
 * Addresses are kept as Linux returns them, the family first: for AF_UNIX sun_path's bytes (a path
 * with its NUL, or an abstract name starting with NUL; len 2 is unnamed), else a sockaddr_in or
 * sockaddr_in6 (port 0: unbound). */
#define ZB_USOCK_BACKLOG_MAX 128 /* pending connections per listener (listen's backlog is capped) */
#define ZB_USOCK_NAME_MAX 111    /* an address: family, 108 bytes of sun_path and the NUL Linux adds
                                    after a path that fills them */
enum { ZB_USOCK_UNCONNECTED = 0, ZB_USOCK_LISTENING, ZB_USOCK_CONNECTED };
typedef struct zb_usock {
    int state;
    uint64_t bind_id;        /* a path name's id (its INO_SOCKET inode holds it); 0: not a path */
    uint32_t name_len, peer_len;
    uint8_t name[ZB_USOCK_NAME_MAX], peer[ZB_USOCK_NAME_MAX]; /* struct sockaddr_un's bytes (and that NUL) */
    int backlog, npending;
    struct zb_file *pending[ZB_USOCK_BACKLOG_MAX + 1]; /* LISTENING: connected server ends, oldest first */
    int v6only;              /* AF_INET6: IPV6_V6ONLY (a wildcard name then takes no AF_INET port) */
} zb_usock;
/* The socket state of a FILE_SOCKET (NULL for an unbound socketpair end). */
static inline zb_usock *zb_usock_of(const struct zb_file *f) { return (zb_usock *)f->priv; }
/* A FILE_SOCKET that is connected (a socketpair end, or connected by connect/accept). */
static inline int zb_usock_connected(const struct zb_file *f) {
    return !zb_usock_of(f) || zb_usock_of(f)->state == ZB_USOCK_CONNECTED;
}
/* Any open file that is a listening AF_UNIX socket. */
static inline int zb_usock_listening(const struct zb_file *f) {
    return f && f->kind == FILE_SOCKET && zb_usock_of(f) && zb_usock_of(f)->state == ZB_USOCK_LISTENING;
}
/* sock_loopback.c: the names of AF_INET/AF_INET6 sockets on the sandbox's loopback. The family of
 * a socket (its name's; AF_UNIX for every AF_UNIX one). */
int zb_lo_family(const zb_usock *u);
/* u's names unbound: the family's wildcard address, port 0. */
void zb_lo_unbound(zb_usock *u, int family);
/* u has a port (bind, listen or connect gave it one). */
int zb_lo_bound(const zb_usock *u);
/* A guest sockaddr of `family` (EINVAL: too short, EAFNOSUPPORT: another family, EFAULT) as a name. */
long zb_lo_read_addr(zb_sandbox *sb, int family, uint64_t addr, uint64_t len, uint8_t out[ZB_USOCK_NAME_MAX],
                     uint32_t *out_len);
/* bind u to a name read by zb_lo_read_addr: EADDRNOTAVAIL off the loopback, EADDRINUSE for a port
 * another socket of the family holds; port 0 takes a free ephemeral one. */
long zb_lo_bind(zb_sandbox *sb, zb_usock *u, const uint8_t *name);
/* The names a connection gives its two ends: the client's own and its peer's, the server end's own
 * and its peer's (each as zb_usock keeps one). sys_connect sets them once the connection is made. */
typedef struct zb_conn_names {
    uint8_t own[ZB_USOCK_NAME_MAX], peer[ZB_USOCK_NAME_MAX], server[ZB_USOCK_NAME_MAX], server_peer[ZB_USOCK_NAME_MAX];
    uint32_t own_len, peer_len, server_len, server_peer_len;
} zb_conn_names;
/* connect of u (left unchanged) to a name read by zb_lo_read_addr: the listener of the family the
 * target names (ECONNREFUSED: none; ENETUNREACH: not the loopback) and the connection's names (the
 * client's with an ephemeral port if it had none; the server end's in the listener's family). */
long zb_lo_connect(zb_sandbox *sb, const zb_usock *u, const uint8_t *target_name, struct zb_file **listener,
                   zb_conn_names *names);
/* sys_socket.c: the first stream socket of sb's family (every process's fd table) that fn takes. */
struct zb_file *zb_usock_find(zb_sandbox *sb, int (*fn)(const zb_usock *, const void *), const void *arg);
/* sys_fsmeta.c: make path (a host string, relative to the cwd) an INO_SOCKET naming bind_id, as
 * bind(2) does: -EADDRINUSE if it exists, -EACCES in a host folder (a socket file is never made
 * on the host), the path errors of mknod otherwise. */
long zb_fs_mksock(zb_sandbox *sb, const char *path, uint64_t bind_id);
/* sys_socket.c: the listening sockets of sb's fd table; of them, those with connections waiting in
 * their accept queue (a snapshot cannot hold those: a queued server end's client is elsewhere). */
int zb_usock_listeners(const zb_sandbox *sb);
int zb_usock_listeners_waiting(const zb_sandbox *sb);
/* file_socket.c: a new path name's bind id (engine-wide, never reused: a name whose socket ended
 * stays dead), and an id a loaded snapshot holds, which new ones must stay above. */
#define ZB_USOCK_BIND_ID_MAX (1ull << 62) /* a loaded id above it is refused: the counter must never wrap */
uint64_t zb_usock_new_bind_id(void);
void zb_usock_bind_id_loaded(uint64_t id);
/* file_socket.c: read from a connected socket, stopping at a record of passed files as
 * zb_stream_read_scm does (taken NULL: the files are closed, as a plain read does in Linux). */
long zb_usock_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, zb_scm **taken);

/* sys_files.c: install two new files at the lowest free fds and write the pair to the guest's
 * int[2] at fds_addr (validated by the caller); takes both references, also on failure. */
int zb_fd_install_pair(zb_sandbox *sb, zb_file *first, zb_file *second, int cloexec, uint64_t fds_addr);

/* Opening a location, per location kind (the table in sys_files.c's do_open): r exists and passed
 * the generic checks; *out is the new file (r may change to what was opened, e.g. a /proc
 * file's private copy). file_host.c, file_overlay.c, file_dir.c, file_dev.c. */
long zb_host_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out);
long zb_overlay_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out);
long zb_synth_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out);
long zb_dev_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out);
/* file_fifo.c: open the FIFO r names (an INO_FIFO overlay inode): an end of its current pipe; a
 * blocking open waits for the other side (ZB_SYSCALL_BLOCK / ZB_SYSCALL_STOP: served again). */
long zb_fifo_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out);
/* The file system ends: the ends of blocked FIFO opens are closed. */
void zb_fifo_free_all(zb_fs *fs);
/* A read-write project's file opened on the host for writing or creating (r becomes it). */
long zb_host_open_project(zb_sandbox *sb, zb_resolved *r, uint64_t flags, uint64_t mode, zb_file **out);
/* O_TMPFILE in the overlay directory dir: installs the new fd (or -errno). */
long zb_overlay_open_tmpfile(zb_sandbox *sb, const zb_resolved *dir, uint64_t flags, uint64_t mode);
/* A memfd's file (f->ino set) gets its location: no directory names it; path is what Linux's
 * /proc/self/fd/N says, "/memfd:NAME (deleted)" (sys_memfd.c; a loaded snapshot's memfds). */
int zb_memfd_where(zb_file *f, const char *path);
/* A loaded snapshot's host file or directory opened again (the reopen op of both kinds). */
int zb_host_reopen(zb_file *f, const zb_resolved *r, char *err);

/* file_ready.c: readiness (poll events) of an open file, and waiting when nothing is ready */
short zb_file_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart);
long zb_poll_wait(zb_sandbox *sb, int waits_uart, int64_t timeout_ns);
/* zb_poll_wait's answer when a watched host socket has an event: the caller scans its files
 * again (the timeout stays what it was). Callers of zb_poll_wait start each scan with
 * zb_ready_begin; a kind whose readiness is a host fd's calls zb_ready_watch when not ready. */
#define ZB_POLL_AGAIN 1
void zb_ready_begin(void);
void zb_ready_watch(int host_fd, short events);
/* A guest struct timespec timeout in ns: -1 for a NULL pointer (wait forever); *err on a bad one. */
int64_t zb_poll_timeout_ns(zb_sandbox *sb, uint64_t addr, int *err);

/* file_epoll.c: the epoll kind's interest lists */
/* Linux's EP_MAX_NESTS: at most this many epoll files nested below the outermost one (so 5 in a
 * chain, "a nesting depth of epoll instances greater than 5" in epoll_ctl(2)). */
#define ZB_EPOLL_MAX_NESTS 4
/* The item's file, or NULL once its description was closed (the fd is empty or holds another). */
const zb_file *zb_epoll_item_file(zb_sandbox *sb, const zb_epoll_item *it);
/* The events of an item that are ready (0 for a closed or disarmed one). */
uint32_t zb_epoll_item_ready(zb_sandbox *sb, const zb_epoll_item *it, int *waits_uart);

/* fs_snapshot.c: the namespace, overlay and fd table in a saved snapshot */
struct zb_out;
struct zb_in;
void zb_fs_save(const zb_fs *fs, struct zb_out *o);
zb_fs *zb_fs_load(struct zb_in *in);
void zb_fds_save(const zb_fdtable *t, struct zb_out *o);
zb_fdtable *zb_fds_load(struct zb_in *in, zb_fs *fs, const char *exe, char *err);

#endif
