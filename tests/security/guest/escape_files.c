/* escape_files.c - a guest that tries to read and change host files outside its view.
 *
 * Every attempt prints one line on stdout:
 *     ATTEMPT <name> ok <first bytes read, escaped>    the call succeeded
 *     ATTEMPT <name> err <ERRNO NAME>                  the call failed
 * and the host test decides, per attempt, what is acceptable. The host plants a secret (a file
 * with a random token) outside the view and checks that the token never shows up on stdout.
 *
 *   escape_files read SECRET_PATH VIEW_DIR      reads: absolute, relative, `..`, symlinks made in
 *                                               the overlay, /proc, fd and dirfd tricks, O_PATH,
 *                                               openat2 with odd flags
 *   escape_files write VIEW_DIR                 changing the view: open for writing, create, rename,
 *                                               link, unlink, chmod, truncate, mmap of a view file
 *   escape_files project DIR OUTSIDE MODE       the notebook's folder (mounted by the host) in each
 *                                               files mode: leave it through `..`, host symlinks,
 *                                               symlinks the guest makes, rename and link
 *   escape_files uart                           /dev/ttyS0 abuse that must not end the VM
 *   escape_files uart_garbage                   garbage frames: the VM must end with an error
 *   escape_files mmap_truncate FILE             map a file of a read-write project, shrink it
 *                                               under the mapping, then hand the mapping to the engine
 *   escape_files open_special PATH              open a FIFO/socket the host put in the folder
 *   escape_files copy_calls DIR                 sendfile/copy_file_range into the folder's files
 *                                               (each files mode), bad offset pointers, huge
 *                                               counts, and a FIFO made in the folder
 *   escape_files unix_sockets DIR HOSTSOCK ABSTRACT
 *                                               reach a host socket (HOSTSOCK, listening, in the
 *                                               folder; ABSTRACT, listening on the host's abstract
 *                                               name) and make socket files in the folder DIR
 *   escape_files tcp_loopback PORT4 PORT6        reach the host's listeners on 127.0.0.1:PORT4
 *                                               and [::1]:PORT6, then take those ports itself
 */
#include "check.h"

#include <dirent.h>
#include <stddef.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>

static void report(const char *name, long rc, int err, const char *data, long n) {
    if (rc < 0) {
        printf("ATTEMPT %s err %s\n", name, strerrorname_np(err) ? strerrorname_np(err) : "?");
        return;
    }
    printf("ATTEMPT %s ok ", name);
    for (long i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c >= 0x21 && c < 0x7f && c != '\\') putchar(c);
        else printf("\\x%02x", c);
    }
    putchar('\n');
}

/* Read through an fd just opened (or report the open's failure), then close it. */
static void read_fd(const char *name, long fd, int err) {
    char buf[256];
    if (fd < 0) { report(name, -1, err, NULL, 0); return; }
    long n = read((int)fd, buf, sizeof buf);
    int e = errno;
    if (n < 0) report(name, -1, e, NULL, 0);
    else report(name, 0, 0, buf, n);
    close((int)fd);
}

static void try_openat(const char *name, int dirfd, const char *path, int flags) {
    errno = 0;
    long fd = syscall(SYS_openat, dirfd, path, flags, 0644);
    read_fd(name, fd, errno);
}

static void try_openat2(const char *name, int dirfd, const char *path, uint64_t flags, uint64_t resolve, size_t size) {
    struct { struct open_how how; char pad[64]; } h;
    memset(&h, 0, sizeof h);
    h.how.flags = flags;
    h.how.resolve = resolve;
    errno = 0;
    long fd = syscall(SYS_openat2, dirfd, path, &h, size);
    read_fd(name, fd, errno);
}

/* Any syscall whose result (not data) is the outcome. */
#define TRY(name, call)                                  \
    do {                                                 \
        errno = 0;                                       \
        long r_ = (long)(call);                          \
        report(name, r_ < 0 ? -1 : 0, errno, "", 0);     \
    } while (0)

static void list_dir(const char *name, const char *path) {
    char out[512] = "";
    DIR *d = opendir(path);
    if (!d) { report(name, -1, errno, NULL, 0); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        strncat(out, e->d_name, sizeof out - strlen(out) - 2);
        strncat(out, ",", sizeof out - strlen(out) - 1);
    }
    closedir(d);
    report(name, 0, 0, out, (long)strlen(out));
}

/* ---- reads ---- */

static void test_read(int argc, char **argv) {
    if (argc < 4) exit(2);
    const char *secret = argv[2], *view = argv[3];
    char p[4096];

    try_openat("secret_abs", AT_FDCWD, secret, O_RDONLY);
    try_openat("shadow", AT_FDCWD, "/etc/shadow", O_RDONLY);
    try_openat("host_hostname_via_dotdot", AT_FDCWD, "/usr/../etc/../etc/hostname", O_RDONLY);
    try_openat("root_bashrc", AT_FDCWD, "/root/.bashrc", O_RDONLY);
    OK(chdir("/tmp"));
    snprintf(p, sizeof p, "../../../../../../../..%s", secret);
    try_openat("secret_rel", AT_FDCWD, p, O_RDONLY);
    snprintf(p, sizeof p, "%s/../../../../../../..%s", view, secret);
    try_openat("secret_via_view_dotdot", AT_FDCWD, p, O_RDONLY);
    snprintf(p, sizeof p, "%s/..", view);
    list_dir("view_parent_listing", p);

    /* symlinks made in the overlay */
    OK(symlink(secret, "/tmp/l_abs"));
    snprintf(p, sizeof p, "../../../../../../..%s", secret);
    OK(symlink(p, "/tmp/l_rel"));
    OK(symlink("/", "/tmp/l_root"));
    OK(symlink("..", "/tmp/l_up"));
    OK(symlink("/tmp/l_loop2", "/tmp/l_loop1"));
    OK(symlink("/tmp/l_loop1", "/tmp/l_loop2"));
    OK(symlink("/proc/self/exe/../../../../..", "/tmp/l_proc"));
    try_openat("overlay_symlink_abs", AT_FDCWD, "/tmp/l_abs", O_RDONLY);
    try_openat("overlay_symlink_rel", AT_FDCWD, "/tmp/l_rel", O_RDONLY);
    snprintf(p, sizeof p, "/tmp/l_root%s", secret);
    try_openat("overlay_symlink_root", AT_FDCWD, p, O_RDONLY);
    snprintf(p, sizeof p, "/tmp/l_up/l_up/l_up/l_up%s", secret);
    try_openat("overlay_symlink_up", AT_FDCWD, p, O_RDONLY);
    try_openat("overlay_symlink_loop", AT_FDCWD, "/tmp/l_loop1", O_RDONLY);
    snprintf(p, sizeof p, "/tmp/l_proc%s", secret);
    try_openat("overlay_symlink_proc", AT_FDCWD, p, O_RDONLY);
    char target[256] = "";
    long n = readlink("/tmp/l_abs", target, sizeof target - 1);
    report("readlink_overlay", n, errno, target, n);
    n = readlink("/proc/self/exe", target, sizeof target - 1);
    report("readlink_proc_exe", n, errno, target, n);

    /* /proc, /sys, /dev */
    const char *procs[] = {"/proc/self/environ", "/proc/self/maps", "/proc/self/mem", "/proc/self/cmdline",
                           "/proc/self/root/etc/shadow", "/proc/1/root/etc/shadow", "/proc/self/cwd/x",
                           "/proc/self/fd/0", "/proc/self/fd/3", "/proc/self/exe/../../../etc/shadow",
                           "/proc/kcore", "/proc/cpuinfo", "/sys/kernel/notes", "/dev/mem", "/dev/kvm",
                           "/dev/sda", "/dev/tty", "/dev/stdin", "/dev/pts/0", "/dev/pts/ptmx",
                           "/dev/pts/../../etc/shadow", "/dev/pts/0/../../etc/shadow", NULL};
    for (int i = 0; procs[i]; i++) try_openat(procs[i], AT_FDCWD, procs[i], O_RDONLY);
    list_dir("dev_listing", "/dev");
    list_dir("pts_listing", "/dev/pts");
    list_dir("proc_self_listing", "/proc/self");

    /* dirfd tricks */
    int tmp = open("/tmp", O_RDONLY | O_DIRECTORY);
    snprintf(p, sizeof p, "../../../../..%s", secret);
    try_openat("dirfd_tmp_dotdot", tmp, p, O_RDONLY);
    int vd = open(view, O_RDONLY | O_DIRECTORY);
    snprintf(p, sizeof p, "../../../../../../../..%s", secret);
    try_openat("dirfd_view_dotdot", vd, p, O_RDONLY);
    try_openat("dirfd_view_abs", vd, secret, O_RDONLY);
    int file = open("/etc/passwd", O_RDONLY);
    try_openat("dirfd_is_a_file", file, "../shadow", O_RDONLY);
    int tty = open("/dev/ttyS0", O_RDWR | O_NONBLOCK);
    try_openat("dirfd_is_the_uart", tty, "x", O_RDONLY);
    int pp[2];
    OK(pipe(pp));
    try_openat("dirfd_is_a_pipe", pp[0], "x", O_RDONLY);
    try_openat("dirfd_closed", 999, "x", O_RDONLY);
    try_openat("dirfd_negative", -5, "x", O_RDONLY);
    try_openat("dirfd_huge", 0x7fffffff, "x", O_RDONLY);
    OK(fchdir(vd));
    snprintf(p, sizeof p, "../../../../../../../..%s", secret);
    try_openat("fchdir_view_dotdot", AT_FDCWD, p, O_RDONLY);
    OK(chdir("/tmp"));
    /* the fd table holds engine objects, never host fds: high numbers and dup tricks */
    for (int fd = 3; fd < 12; fd++) {
        char nm[32];
        snprintf(nm, sizeof nm, "fd_%d", fd);
        char b[64];
        errno = 0;
        long r = pread(fd, b, sizeof b, 0);
        report(nm, r, errno, b, r);
    }
    TRY("dup2_to_1024", dup2(vd, 1024));
    TRY("dup2_to_negative", dup2(vd, -1));
    TRY("fcntl_dupfd_huge", fcntl(vd, F_DUPFD, 100000));

    /* O_PATH */
    int op = (int)syscall(SYS_openat, AT_FDCWD, "/etc", O_PATH | O_DIRECTORY);
    try_openat("opath_etc_shadow", op, "shadow", O_RDONLY);
    char b[64];
    long r = read(op, b, sizeof b);
    report("opath_read", r, errno, b, r);
    int opv = (int)syscall(SYS_openat, AT_FDCWD, view, O_PATH);
    snprintf(p, sizeof p, "../../../../../..%s", secret);
    try_openat("opath_view_dotdot", opv, p, O_RDONLY);
    int ops = (int)syscall(SYS_openat, AT_FDCWD, "/tmp/l_abs", O_PATH | O_NOFOLLOW);
    report("opath_nofollow_symlink", ops, errno, "", 0);
    TRY("linkat_empty_path_symlink", linkat(ops, "", AT_FDCWD, "/tmp/linked", AT_EMPTY_PATH));
    try_openat("open_linked", AT_FDCWD, "/tmp/linked", O_RDONLY);

    /* openat2 with odd flags, resolve bits and sizes */
    try_openat2("openat2_plain", AT_FDCWD, secret, O_RDONLY, 0, sizeof(struct open_how));
    try_openat2("openat2_in_root", tmp, p, O_RDONLY, RESOLVE_IN_ROOT, sizeof(struct open_how));
    try_openat2("openat2_beneath", tmp, p, O_RDONLY, RESOLVE_BENEATH, sizeof(struct open_how));
    try_openat2("openat2_garbage_resolve", AT_FDCWD, secret, O_RDONLY, ~0ull, sizeof(struct open_how));
    try_openat2("openat2_garbage_flags", AT_FDCWD, secret, ~0ull, 0, sizeof(struct open_how));
    try_openat2("openat2_big_size", AT_FDCWD, secret, O_RDONLY, 0, 4096);
    try_openat2("openat2_small_size", AT_FDCWD, secret, O_RDONLY, 0, 8);
    try_openat2("openat2_symlink", AT_FDCWD, "/tmp/l_abs", O_RDONLY, 0, sizeof(struct open_how));
    errno = 0;
    r = syscall(SYS_openat2, AT_FDCWD, secret, (void *)0x1000, sizeof(struct open_how));
    report("openat2_how_in_low_region", r, errno, "", 0);
    errno = 0;
    r = syscall(SYS_openat, AT_FDCWD, (void *)0x8000, O_RDONLY);
    report("open_path_in_low_region", r, errno, "", 0);

    /* names that are too long, or never end */
    char *longp = malloc(3 * 4096);
    memset(longp, 'a', 3 * 4096 - 1);
    longp[3 * 4096 - 1] = 0;
    try_openat("path_too_long", AT_FDCWD, longp, O_RDONLY);
    for (int i = 0; i + 3 < 3 * 4096; i += 3) memcpy(longp + i, "../", 3);
    try_openat("dotdot_flood", AT_FDCWD, longp, O_RDONLY);
    char *edge = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(edge + PAGE, PAGE);
    memset(edge, '/', PAGE); /* no NUL before the end of mapped memory */
    try_openat("path_runs_off_the_end", AT_FDCWD, edge, O_RDONLY);

    /* getdents64 of a view dir into a buffer that ends at the end of mapped memory */
    int dfd = open(view, O_RDONLY | O_DIRECTORY);
    errno = 0;
    r = syscall(SYS_getdents64, dfd, edge + PAGE - 16, 4096);
    report("getdents_past_the_end", r, errno, "", 0);
}

/* ---- writes to the view ---- */

static void test_write(int argc, char **argv) {
    if (argc < 3) exit(2);
    const char *view = argv[2];
    char file[4096], p[4096];
    snprintf(file, sizeof file, "%s/data.txt", view);

    TRY("open_wronly", open(file, O_WRONLY));
    TRY("open_rdwr", open(file, O_RDWR));
    TRY("open_trunc", open(file, O_RDONLY | O_TRUNC));
    TRY("open_append", open(file, O_WRONLY | O_APPEND));
    snprintf(p, sizeof p, "%s/new.txt", view);
    TRY("creat_in_view", open(p, O_WRONLY | O_CREAT, 0644));
    TRY("tmpfile_in_view", open(view, O_TMPFILE | O_RDWR, 0644));
    TRY("mkdir_in_view", mkdir(p, 0755));
    TRY("symlink_in_view", symlink("/tmp", p));
    TRY("link_in_view", link("/etc/passwd", p));
    TRY("unlink_view_file", unlink(file));
    TRY("rmdir_view", rmdir(view));
    TRY("rename_out", rename(file, "/tmp/moved"));
    OK(close(open("/tmp/planted", O_WRONLY | O_CREAT, 0644)));
    TRY("rename_in", rename("/tmp/planted", p));
    TRY("rename_over", rename("/tmp/planted", file));
    TRY("link_out", link(file, "/tmp/hardlink"));
    TRY("chmod", chmod(file, 0777));
    TRY("chown", chown(file, 0, 0));
    TRY("truncate", truncate(file, 0));
    TRY("utimes", utimensat(AT_FDCWD, file, NULL, 0));
    TRY("setxattr", syscall(SYS_setxattr, file, "user.x", "1", 1, 0));
    int ro = open(file, O_RDONLY);
    TRY("write_readonly_fd", write(ro, "x", 1));
    TRY("pwrite_readonly_fd", pwrite(ro, "x", 1, 0));
    TRY("ftruncate_readonly_fd", ftruncate(ro, 0));
    TRY("fchmod_view", fchmod(ro, 0777));
    TRY("fallocate_view", fallocate(ro, 0, 0, 4096));
    TRY("fcntl_setfl_rdwr", fcntl(ro, F_SETFL, O_RDWR));
    TRY("write_after_setfl", write(ro, "x", 1));
    TRY("mmap_shared_write", (long)mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0));
    /* a private writable mapping: the guest's writes stay in its copy */
    char *m = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, ro, 0);
    report("mmap_private", m == MAP_FAILED ? -1 : 0, errno, m == MAP_FAILED ? "" : m, m == MAP_FAILED ? 0 : 12);
    if (m != MAP_FAILED) {
        memcpy(m, "GUEST-WROTE", 11);
        TRY("msync_private", msync(m, PAGE, MS_SYNC));
        TRY("munmap_private", munmap(m, PAGE));
    }
    char back[64] = "";
    long n = pread(ro, back, sizeof back, 0);
    report("readback", n, errno, back, n);
}

/* ---- the notebook's folder ---- */

static void test_project(int argc, char **argv) {
    if (argc < 5) exit(2);
    const char *dir = argv[2], *outside = argv[3], *mode = argv[4];
    char p[4096], q[4096];
    (void)mode;
    OK(chdir(dir));
    try_openat("read_inside", AT_FDCWD, "inside.txt", O_RDONLY);
    snprintf(p, sizeof p, "../%s/secret.txt", strrchr(outside, '/') + 1);
    try_openat("read_sibling_dotdot", AT_FDCWD, p, O_RDONLY);
    snprintf(p, sizeof p, "%s/secret.txt", outside);
    try_openat("read_outside_abs", AT_FDCWD, p, O_RDONLY);
    try_openat("read_host_link_out", AT_FDCWD, "link_out/secret.txt", O_RDONLY);
    try_openat("read_host_link_etc", AT_FDCWD, "link_etc/shadow", O_RDONLY);
    try_openat("read_host_link_file", AT_FDCWD, "link_file", O_RDONLY);

    /* writes that try to land outside the folder */
    snprintf(p, sizeof p, "../%s/planted.txt", strrchr(outside, '/') + 1);
    TRY("create_sibling_dotdot", open(p, O_WRONLY | O_CREAT, 0644));
    snprintf(p, sizeof p, "%s/planted.txt", outside);
    TRY("create_outside_abs", open(p, O_WRONLY | O_CREAT, 0644));
    TRY("create_via_host_link", open("link_out/planted.txt", O_WRONLY | O_CREAT, 0644));
    TRY("write_via_host_link_file", open("link_file", O_WRONLY | O_TRUNC));
    TRY("mkdir_via_host_link", mkdir("link_out/planted.d", 0755));
    TRY("unlink_via_host_link", unlink("link_out/secret.txt"));
    TRY("rename_into_host_link", rename("inside.txt", "link_out/moved.txt"));
    TRY("rename_out_to_tmp", rename("inside.txt", "/tmp/moved.txt"));
    snprintf(p, sizeof p, "../%s/moved.txt", strrchr(outside, '/') + 1);
    TRY("rename_out_dotdot", rename("inside.txt", p));

    /* symlinks the guest makes in the folder, then follows */
    snprintf(p, sizeof p, "%s", outside);
    TRY("symlink_make_out", symlink(p, "guest_link_out"));
    TRY("create_via_guest_link", open("guest_link_out/planted.txt", O_WRONLY | O_CREAT, 0644));
    try_openat("read_via_guest_link", AT_FDCWD, "guest_link_out/secret.txt", O_RDONLY);
    snprintf(p, sizeof p, "%s/secret.txt", outside);
    TRY("symlink_make_file_out", symlink(p, "guest_link_file"));
    TRY("write_via_guest_link_file", open("guest_link_file", O_WRONLY | O_TRUNC));
    TRY("symlink_make_dotdot", symlink("..", "guest_up"));
    snprintf(p, sizeof p, "guest_up/%s/planted.txt", strrchr(outside, '/') + 1);
    TRY("create_via_guest_up", open(p, O_WRONLY | O_CREAT, 0644));
    /* a dangling link whose target would be created by O_CREAT */
    snprintf(p, sizeof p, "%s/created_through_dangling.txt", outside);
    TRY("symlink_make_dangling", symlink(p, "dangling"));
    TRY("create_via_dangling", open("dangling", O_WRONLY | O_CREAT, 0644));

    /* hard links and renames of directories */
    TRY("link_out", link("inside.txt", "/tmp/hard"));
    TRY("link_in", link("/etc/passwd", "passwd_link"));
    TRY("mkdir_sub", mkdir("sub", 0755));
    snprintf(q, sizeof q, "sub/../../%s/planted.txt", strrchr(outside, '/') + 1);
    TRY("create_via_sub_dotdot", open(q, O_WRONLY | O_CREAT, 0644));
    TRY("rename_dir_into_itself", rename("sub", "sub/inner"));

    /* a dirfd on the folder, then `..` and absolute paths */
    int d = open(".", O_RDONLY | O_DIRECTORY);
    snprintf(p, sizeof p, "../%s/planted.txt", strrchr(outside, '/') + 1);
    TRY("openat_dirfd_dotdot_create", openat(d, p, O_WRONLY | O_CREAT, 0644));
    snprintf(p, sizeof p, "%s/planted.txt", outside);
    TRY("openat_dirfd_abs_create", openat(d, p, O_WRONLY | O_CREAT, 0644));
    try_openat2("openat2_beneath_out", d, "link_out/secret.txt", O_RDONLY, RESOLVE_BENEATH, sizeof(struct open_how));

    /* what the guest did see, for the host's check of the mode */
    list_dir("folder_listing", ".");
}

/* ---- the UART as a file ---- */

static void put_header(uint8_t *h, uint32_t magic, uint16_t version, uint16_t type, uint32_t len) {
    memcpy(h, &magic, 4);
    memcpy(h + 4, &version, 2);
    memcpy(h + 6, &type, 2);
    memcpy(h + 8, &len, 4);
}

static void test_uart(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int a = open("/dev/ttyS0", O_RDWR | O_NONBLOCK), b = open("/dev/ttyS0", O_RDWR | O_NONBLOCK);
    char buf[64];
    TRY("read_empty_nonblock", read(a, buf, sizeof buf));
    TRY("ioctl_tcgets", ioctl(a, 0x5401, buf));
    TRY("ioctl_tiocsti", ioctl(a, 0x5412, "x"));
    TRY("ioctl_garbage", ioctl(a, 0xdeadbeef, 0));
    TRY("lseek", lseek(a, 100, SEEK_SET));
    TRY("pread", pread(a, buf, 1, 0));
    TRY("mmap", (long)mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, a, 0));
    TRY("ftruncate", ftruncate(a, 0));
    TRY("write_bad_pointer", write(a, (void *)0x1000, 12));
    TRY("write_past_the_end", write(a, (void *)0x7ffffffff000, 12));
    /* one valid frame split over two fds and three writes (one frame assembler per VM) */
    uint8_t frame[12 + 2];
    put_header(frame, 0x5a42464d, 1, 101, 2);
    memcpy(frame + 12, "{}", 2);
    TRY("write_frame_part1", write(a, frame, 5));
    TRY("write_frame_part2", write(b, frame + 5, 5));
    TRY("write_frame_part3", write(a, frame + 10, 4));
    TRY("write_empty", write(a, frame, 0));
    TRY("close", close(a));
    TRY("read_after_close", read(a, buf, 1));
    TRY("dup_uart", dup2(b, 0));
}

static void test_uart_garbage(int argc, char **argv) {
    int a = open("/dev/ttyS0", O_RDWR);
    uint8_t h[12];
    const char *how = argc > 2 ? argv[2] : "magic";
    if (!strcmp(how, "magic")) put_header(h, 0x41414141, 1, 101, 0);
    else if (!strcmp(how, "version")) put_header(h, 0x5a42464d, 7, 101, 0);
    else put_header(h, 0x5a42464d, 1, 101, 0xffffffff); /* "huge" */
    fprintf(stderr, "about to write a bad frame header (%s)\n", how);
    write(a, h, sizeof h);
    printf("SURVIVED uart_garbage\n");
}

/* ---- host files changing under the guest's mapping ---- */

static void test_mmap_truncate(int argc, char **argv) {
    if (argc < 3) exit(2);
    int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { report("open", -1, errno, NULL, 0); return; }
    static char block[64 * 1024];
    memset(block, 'M', sizeof block);
    TRY("fill", write(fd, block, sizeof block));
    char *m = mmap(NULL, sizeof block, PROT_READ, MAP_PRIVATE, fd, 0);
    report("mmap", m == MAP_FAILED ? -1 : 0, errno, "", 0);
    if (m == MAP_FAILED) return;
    report("first_touch", 0, 0, m, 4); /* pages that are already present, too */
    TRY("shrink", ftruncate(fd, 0));
    fprintf(stderr, "about to hand the engine a mapping whose file shrank\n");
    /* the engine reads the mapped pages to write them to stdout: it must not die of SIGBUS */
    errno = 0;
    long w = write(1, m + 8192, 4096);
    printf("\n");
    report("write_mapping", w, errno, "", 0);
    TRY("pipe_mapping", ({ int pp[2]; pipe(pp) == 0 ? write(pp[1], m + 16384, 4096) : -1; }));
    volatile char c = m[32768]; /* the guest itself touches a page past the new end */
    (void)c;
    printf("SURVIVED mmap_truncate\n");
}

/* ---- special files the host left in the folder ---- */

static void test_open_special(int argc, char **argv) {
    if (argc < 3) exit(2);
    for (int i = 2; i < argc; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "open_%d", i - 2);
        try_openat(nm, AT_FDCWD, argv[i], O_RDONLY);
        snprintf(nm, sizeof nm, "open_nonblock_%d", i - 2);
        try_openat(nm, AT_FDCWD, argv[i], O_RDONLY | O_NONBLOCK);
    }
}

static void try_unix(const char *name, int bind_not_connect, const char *path, int abstract) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path + (abstract ? 1 : 0), sizeof a.sun_path - 1, "%s", path);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) { report(name, -1, errno, NULL, 0); return; }
    errno = 0;
    long rc = bind_not_connect ? bind(fd, (struct sockaddr *)&a, len) : connect(fd, (struct sockaddr *)&a, len);
    report(name, rc, errno, "", 0);
    if (rc == 0 && !bind_not_connect) {
        char buf[64];
        long n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        report("recv_after_connect", n, errno, buf, n);
    }
    close(fd);
}

static void test_unix_sockets(int argc, char **argv) {
    if (argc < 5) exit(2);
    char p[PATH_MAX];
    try_unix("connect_host_socket", 0, argv[3], 0);
    if (symlink(argv[3], "/tmp/link_to_host_socket") == 0) try_unix("connect_via_symlink", 0, "/tmp/link_to_host_socket", 0);
    try_unix("connect_host_abstract", 0, argv[4], 1);
    snprintf(p, sizeof p, "%s/made_by_guest.sock", argv[2]);
    try_unix("bind_in_folder", 1, p, 0);
    snprintf(p, sizeof p, "%s/../beside_folder.sock", argv[2]);
    try_unix("bind_beside_folder", 1, p, 0);
    try_unix("bind_over_host_socket", 1, argv[3], 0);
}

/* connect to (or bind) a loopback port: the sandbox's loopback is its own, never the host's. */
static void try_tcp(const char *name, int bind_not_connect, int family, const char *ip, int port) {
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(family, ip, family == AF_INET ? (void *)&a4.sin_addr : (void *)&a6.sin6_addr);
    const struct sockaddr *a = family == AF_INET ? (struct sockaddr *)&a4 : (struct sockaddr *)&a6;
    socklen_t len = family == AF_INET ? sizeof a4 : sizeof a6;
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0) { report(name, -1, errno, NULL, 0); return; }
    errno = 0;
    long rc = bind_not_connect ? bind(fd, a, len) : connect(fd, a, len);
    report(name, rc, errno, "", 0);
    close(fd);
}

static void test_tcp_loopback(int argc, char **argv) {
    if (argc < 4) exit(2);
    int p4 = atoi(argv[2]), p6 = atoi(argv[3]);
    try_tcp("connect_host_v4", 0, AF_INET, "127.0.0.1", p4);
    try_tcp("connect_host_v4_any", 0, AF_INET, "0.0.0.0", p4);
    try_tcp("connect_host_v6", 0, AF_INET6, "::1", p6);
    try_tcp("connect_host_v4_mapped", 0, AF_INET6, "::ffff:127.0.0.1", p4);
    try_tcp("bind_host_port_v4", 1, AF_INET, "127.0.0.1", p4);
    try_tcp("bind_host_port_v6", 1, AF_INET6, "::1", p6);
    try_tcp("bind_host_address", 1, AF_INET, "10.0.0.1", 0);
}

/* The copy calls write through the file's own write, so the folder's mode holds as for write(2).
 * inside.txt is the host's ("inside"); the memfd holds PLANTED bytes. */
static void test_copy_calls(int argc, char **argv) {
    if (argc < 3) exit(2);
    OK(chdir(argv[2]));
    int src = (int)syscall(SYS_memfd_create, "planted", 0);
    CHECK(src >= 0, "memfd_create: %s", strerror(errno));
    CHECK_EQ(write(src, "PLANTED", 7), 7);
    int ro = (int)OK(open("inside.txt", O_RDONLY));
    TRY("sendfile_into_readonly_fd", sendfile(ro, src, &(off_t){0}, 7));
    TRY("copy_range_into_readonly_fd", copy_file_range(src, &(loff_t){0}, ro, &(loff_t){0}, 7, 0));
    errno = 0;
    int wr = open("inside.txt", O_WRONLY);
    report("open_for_writing", wr, errno, "", 0);
    if (wr >= 0) {
        TRY("sendfile_into_folder_file", sendfile(wr, src, &(off_t){0}, 7));
        TRY("copy_range_into_folder_file", copy_file_range(src, &(loff_t){0}, wr, &(loff_t){0}, 7, 0));
        char buf[16] = {0};
        int again = open("inside.txt", O_RDONLY); /* (ro still reads the lower file in overlay mode) */
        long n = again < 0 ? -1 : pread(again, buf, sizeof buf, 0); /* what the guest now sees */
        report("guest_view_after", n, errno, buf, n);
        if (again >= 0) close(again);
        close(wr);
    }
    /* hostile arguments */
    int tmp = (int)OK(open("/tmp/copy_target", O_RDWR | O_CREAT, 0600));
    TRY("sendfile_offset_null_page", sendfile(tmp, src, (off_t *)16, 7));
    TRY("sendfile_offset_low_region", sendfile(tmp, src, (off_t *)0x100000, 7));
    TRY("sendfile_offset_kernel", sendfile(tmp, src, (off_t *)0xffff880000000000ul, 7));
    TRY("copy_range_in_offset_bad", copy_file_range(src, (loff_t *)0x9000, tmp, NULL, 7, 0));
    TRY("copy_range_out_offset_bad", copy_file_range(src, NULL, tmp, (loff_t *)~0ul, 7, 0));
    TRY("copy_range_same_overlap", copy_file_range(src, &(loff_t){0}, src, &(loff_t){3}, 7, 0));
    errno = 0;
    long big = sendfile(tmp, src, &(off_t){0}, (size_t)INT64_MAX);
    char num[32];
    snprintf(num, sizeof num, "%ld", big);
    report("sendfile_huge_count", big, errno, num, (long)strlen(num));
    OK(ftruncate(src, 1l << 40)); /* a sparse terabyte: a huge copy stops at COPY_MAX per call */
    errno = 0;
    big = copy_file_range(src, &(loff_t){0}, tmp, &(loff_t){0}, 1ul << 40, 0);
    snprintf(num, sizeof num, "%ld", big);
    report("copy_range_huge", big, errno, num, (long)strlen(num));
    TRY("mkfifo_in_folder", mknod("fifo_in_folder", S_IFIFO | 0600, 0));
    TRY("mknod_device_in_folder", mknod("dev_in_folder", S_IFCHR | 0600, makedev(1, 3)));
    close(tmp);
    close(ro);
    close(src);
}

static const zb_test tests[] = {
    {"read", test_read},
    {"write", test_write},
    {"project", test_project},
    {"uart", test_uart},
    {"uart_garbage", test_uart_garbage},
    {"mmap_truncate", test_mmap_truncate},
    {"unix_sockets", test_unix_sockets},
    {"tcp_loopback", test_tcp_loopback},
    {"open_special", test_open_special},
    {"copy_calls", test_copy_calls},
    {NULL, NULL},
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    setvbuf(stderr, NULL, _IONBF, 0);
    return zb_run(tests, argc, argv);
}
