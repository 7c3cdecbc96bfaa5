/* sys_memfd.c - memfd_create: an anonymous in-memory file. It is an overlay inode that no directory
 * names (like an O_TMPFILE file), so everything an overlay file does it does too: read/write,
 * ftruncate, lseek, fstat, MAP_SHARED mappings kept coherent and shared across fork
 * (shared_map.c), snapshots, and its bytes are charged to the overlay's limit (ENOSPC past it, as a
 * full tmpfs answers) like every other file of the sandbox. What makes it a memfd is the inode's
 * `memfd` flag (st_nlink stays 0, linkat refuses it) and its seals (file_overlay.c's fcntl).
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define MFD_NAME_MAX 249 /* Linux's MFD_NAME_MAX_LEN: NAME_MAX less "memfd:" */
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020
#endif

static long sys_memfd_create(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t flags = a[1];
    if (flags & ~(uint64_t)(MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | MFD_NOEXEC_SEAL | MFD_EXEC |
                            (flags & MFD_HUGETLB ? 0x3fu << 26 : 0)))
        return -EINVAL;
    if ((flags & MFD_NOEXEC_SEAL) && (flags & MFD_EXEC)) return -EINVAL;
    char name[MFD_NAME_MAX + 1];
    int rc = zb_guest_string(sb, a[0], name, sizeof name);
    if (rc == -ENAMETOOLONG) return -EINVAL;
    if (rc < 0) return rc;
    if (flags & MFD_HUGETLB) {
        /* Huge-page files (hugetlbfs: sizes in huge pages, a pool the host reserves) are not
         * emulated: answered as by a kernel built without hugetlbfs. */
        zb_log(sb, "memfd_create(MFD_HUGETLB) answered ENOSYS: huge-page memfds are not emulated");
        return -ENOSYS;
    }
    unsigned mode = (flags & MFD_NOEXEC_SEAL) ? 0666 : 0777; /* shmem gives 0777, NOEXEC_SEAL takes x */
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_FILE, mode);
    if (!ino) return -ENOSPC; /* the overlay's limit (its inodes are charged) */
    zb_inode *in = zb_ovl_inode(sb->fs, ino);
    in->memfd = 1;
    in->seals = (flags & (MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL)) ? 0 : F_SEAL_SEAL;
    if (flags & MFD_NOEXEC_SEAL) in->seals |= F_SEAL_EXEC;
    zb_ovl_open_ref(sb->fs, ino, 1); /* nlink 0: released with its last open or mapping */
    zb_file *f = zb_file_new(FILE_OVERLAY);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/memfd:%s (deleted)", name); /* Linux's d_path of an unlinked shmem file */
    if (f) f->ino = ino;
    if (!f || zb_memfd_where(f, path) < 0) {
        free(f);
        zb_ovl_open_ref(sb->fs, ino, -1);
        return -ENOMEM;
    }
    f->flags = O_RDWR | O_LARGEFILE;
    return zb_fd_install(sb, f, 0, flags & MFD_CLOEXEC);
}

void zb_sys_memfd_register(zb_syscall_fn *t) { t[SYS_memfd_create] = sys_memfd_create; }
