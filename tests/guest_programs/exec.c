/* exec.c - execve and execveat in one process (no fork): programs of the system view, #! scripts,
 * Linux's errors (the caller goes on after each), close-on-exec, signal dispositions, threads,
 * and hostile inputs (malformed ELF files, huge argument vectors, strings that run off memory).
 *
 * A test that execs itself continues in a "<test>_child" test of the new image, which prints
 * "PASS <test>_child" (so "PASS <test>" appears too). Scratch files go to $TMPDIR or /tmp, so the
 * same binary runs on the host (tests/test_guest_exec.py compares).
 */
#include "check.h"

#include <elf.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char self[PATH_MAX];
static char tmpdir[PATH_MAX - 64];

static void setup(void) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) { perror("readlink /proc/self/exe"); exit(1); }
    self[n] = 0;
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/zb-exec-%d", t && t[0] ? t : "/tmp", (int)getpid());
    mkdir(tmpdir, 0700);
}

static void tmp_path(char *out, const char *name) { snprintf(out, PATH_MAX, "%s/%s", tmpdir, name); }

static void write_file(const char *path, const void *data, size_t len, int mode) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len || close(fd) < 0) { perror(path); exit(1); }
    chmod(path, mode);
}

extern char **environ;
#define no_env environ /* the environment goes along (TMPDIR) */

/* Replace this process by one of its own tests; only returns (with a failure) if execve does. */
static void exec_self(const char *test, char *const *extra) {
    if (zb_failures) exit(1); /* the new image could not report them */
    char *argv[16] = {self, (char *)test};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 15; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    syscall(SYS_execve, self, argv, no_env);
    FAIL("execve %s: %s", self, strerror(errno));
    exit(1);
}

/* ---- programs of the system view ---- */

static void t_echo(int argc, char **argv) {
    (void)argc; (void)argv;
    char *args[] = {"echo", "hello", "from", "execve", NULL};
    fflush(stdout);
    syscall(SYS_execve, "/bin/echo", args, no_env);
    FAIL("execve /bin/echo: %s", strerror(errno));
}

static void t_true(int argc, char **argv) {
    (void)argc;
    char *args[] = {argv[2], NULL};
    fflush(stdout);
    syscall(SYS_execve, argv[2], args, no_env);
    FAIL("execve %s: %s", argv[2], strerror(errno));
}

/* exec argv[2..] as given (the programs of the system view). */
static void t_run(int argc, char **argv) {
    if (argc < 3) { FAIL("usage: run PROGRAM [ARGS...]"); return; }
    fflush(stdout);
    syscall(SYS_execve, argv[2], argv + 2, no_env);
    FAIL("execve %s: %s", argv[2], strerror(errno));
}

/* A shell script running builtins only (no fork): its output and exit status. */
static void t_script(int argc, char **argv) {
    (void)argc; (void)argv;
    char path[PATH_MAX];
    tmp_path(path, "script.sh");
    const char text[] = "#!/bin/sh\necho \"script $0 $1 $(( 6 * 7 ))\"\nexit 3\n";
    write_file(path, text, sizeof text - 1, 0755);
    char *args[] = {"ignored-argv0", "first", NULL};
    fflush(stdout);
    syscall(SYS_execve, path, args, no_env);
    FAIL("execve %s: %s", path, strerror(errno));
}

/* `#!INTERP ONE ARGUMENT` gives INTERP exactly one argument (the whole rest of the line), then the
 * script's path, then argv[1..]; argv[0] is dropped. Nested scripts chain. */
static void t_script_args(int argc, char **argv) {
    (void)argc; (void)argv;
    char inner[PATH_MAX], outer[PATH_MAX], text[PATH_MAX + 64];
    tmp_path(inner, "inner");
    tmp_path(outer, "outer");
    int n = snprintf(text, sizeof text, "#! %s script_args_child  one  two \t\nbody\n", self);
    write_file(inner, text, (size_t)n, 0755);
    n = snprintf(text, sizeof text, "#!%s\n", inner);
    write_file(outer, text, (size_t)n, 0755);
    char *args[] = {"argv0-dropped", "x", "y", NULL};
    if (zb_failures) exit(1);
    fflush(stdout);
    syscall(SYS_execve, outer, args, no_env);
    FAIL("execve %s: %s", outer, strerror(errno));
}

static void t_script_args_child(int argc, char **argv) {
    /* self "script_args_child  one  two" inner outer x y */
    char inner[PATH_MAX], outer[PATH_MAX];
    tmp_path(inner, "inner");
    tmp_path(outer, "outer");
    CHECK_EQ(argc, 6);
    if (argc != 6) return;
    CHECK_STR(argv[1], "script_args_child  one  two");
    CHECK_STR(argv[2], inner);
    CHECK_STR(argv[3], outer);
    CHECK_STR(argv[4], "x");
    CHECK_STR(argv[5], "y");
    char comm[17] = {0};
    OK(prctl(PR_GET_NAME, comm));
    CHECK_STR(comm, "outer"); /* the name the program was run by, not the interpreter's */
}

/* `sh -c` runs with builtins only: arithmetic expansion. */
static void t_sh_c(int argc, char **argv) {
    (void)argc; (void)argv;
    char *args[] = {"sh", "-c", "echo $((6*7))", NULL};
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    fflush(stdout);
    syscall(SYS_execve, "/bin/sh", args, env);
    FAIL("execve /bin/sh: %s", strerror(errno));
}

/* ---- errors: the caller goes on ---- */

static void t_errors(int argc, char **argv) {
    (void)argc; (void)argv;
    char *args[] = {"x", NULL};
    char path[PATH_MAX];
    CHECK_ERR(syscall(SYS_execve, "/nonexistent/program", args, no_env), ENOENT);
    CHECK_ERR(syscall(SYS_execve, "", args, no_env), ENOENT);
    CHECK_ERR(syscall(SYS_execve, tmpdir, args, no_env), EACCES); /* a directory */
    tmp_path(path, "not-executable");
    write_file(path, "#!/bin/sh\n", 10, 0644);
    CHECK_ERR(syscall(SYS_execve, path, args, no_env), EACCES);
    tmp_path(path, "garbage");
    write_file(path, "this is no program\n", 19, 0755);
    CHECK_ERR(syscall(SYS_execve, path, args, no_env), ENOEXEC);
    tmp_path(path, "empty");
    write_file(path, "", 0, 0755);
    CHECK_ERR(syscall(SYS_execve, path, args, no_env), ENOEXEC);
    tmp_path(path, "no-interpreter");
    write_file(path, "#!\n", 3, 0755);
    CHECK_ERR(syscall(SYS_execve, path, args, no_env), ENOEXEC);
    tmp_path(path, "missing-interpreter");
    write_file(path, "#!/nonexistent/sh\n", 18, 0755);
    CHECK_ERR(syscall(SYS_execve, path, args, no_env), ENOENT);
    /* symlink loops and scripts nested too deep */
    char a[PATH_MAX], b[PATH_MAX];
    tmp_path(a, "loop-a");
    tmp_path(b, "loop-b");
    unlink(a);
    unlink(b);
    OK(symlink(a, b));
    OK(symlink(b, a));
    CHECK_ERR(syscall(SYS_execve, a, args, no_env), ELOOP);
    char prev[PATH_MAX], text[PATH_MAX + 16];
    snprintf(prev, sizeof prev, "/bin/true");
    for (int i = 0; i < 8; i++) {
        char name[32];
        snprintf(name, sizeof name, "nest%d", i);
        tmp_path(path, name);
        int n = snprintf(text, sizeof text, "#!%s\n", prev);
        write_file(path, text, (size_t)n, 0755);
        snprintf(prev, sizeof prev, "%s", path);
    }
    CHECK_ERR(syscall(SYS_execve, path, args, no_env), ELOOP);
    /* execveat: a bad fd, a bad flag, AT_SYMLINK_NOFOLLOW on a symlink */
    CHECK_ERR(syscall(SYS_execveat, 999, "x", args, no_env, 0), EBADF);
    CHECK_ERR(syscall(SYS_execveat, AT_FDCWD, "/bin/true", args, no_env, 0x12345), EINVAL);
    CHECK_ERR(syscall(SYS_execveat, AT_FDCWD, b, args, no_env, AT_SYMLINK_NOFOLLOW), ELOOP);
    /* the process is still itself */
    char again[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", again, sizeof again - 1);
    CHECK(n > 0 && (again[n] = 0, !strcmp(again, self)), "still %s", self);
}

static void t_e2big(int argc, char **argv) {
    (void)argc; (void)argv;
    size_t big = 200 << 10; /* one string over MAX_ARG_STRLEN (128 KiB) */
    char *s = malloc(big + 1);
    memset(s, 'a', big);
    s[big] = 0;
    char *one[] = {"x", s, NULL};
    CHECK_ERR(syscall(SYS_execve, "/bin/true", one, no_env), E2BIG);
    char *env1[] = {s, NULL};
    char *argv1[] = {"x", NULL};
    CHECK_ERR(syscall(SYS_execve, "/bin/true", argv1, env1), E2BIG);
    /* many strings under the per-string limit, over the total (2 MiB here, a quarter of an
     * 8 MiB stack limit on Linux) */
    s[100 << 10] = 0;
    char *many[72]; /* 7 MB: over Linux's limit also with an unlimited stack (6 MiB then) */
    many[0] = "x";
    for (int i = 1; i < 71; i++) many[i] = s;
    many[71] = NULL;
    CHECK_ERR(syscall(SYS_execve, "/bin/true", many, no_env), E2BIG);
    free(s);
}

static void t_efault(int argc, char **argv) {
    (void)argc; (void)argv;
    char *args[] = {"x", NULL};
    CHECK_ERR(syscall(SYS_execve, (char *)8, args, no_env), EFAULT);
    CHECK_ERR(syscall(SYS_execve, "/bin/true", (char **)8, no_env), EFAULT);
    CHECK_ERR(syscall(SYS_execve, "/bin/true", args, (char **)8), EFAULT);
    char *bad[] = {"x", (char *)8, NULL};
    CHECK_ERR(syscall(SYS_execve, "/bin/true", bad, no_env), EFAULT);
    /* a string that runs off the end of mapped memory, as the path and as an argument */
    char *page = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(page != MAP_FAILED, "mmap");
    OK(munmap(page + PAGE, PAGE));
    memset(page, 'A', PAGE);
    char *tail = page + PAGE - 10;
    CHECK_ERR(syscall(SYS_execve, tail, args, no_env), EFAULT);
    char *runs_off[] = {"x", tail, NULL};
    CHECK_ERR(syscall(SYS_execve, "/bin/true", runs_off, no_env), EFAULT);
    /* an argv vector that runs off the end of memory */
    char **vec = (char **)(page + PAGE - sizeof(char *));
    vec[0] = "x";
    CHECK_ERR(syscall(SYS_execve, "/bin/true", vec, no_env), EFAULT);
    char longpath[PATH_MAX + 100];
    memset(longpath, 'p', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = 0;
    CHECK_ERR(syscall(SYS_execve, longpath, args, no_env), ENAMETOOLONG);
}

/* ---- what survives an exec and what does not ---- */

static void t_cloexec(int argc, char **argv) {
    (void)argc; (void)argv;
    char path[PATH_MAX];
    tmp_path(path, "data");
    write_file(path, "kept", 4, 0644);
    int keep = OK(open(path, O_RDONLY)), gone = OK(open(path, O_RDONLY | O_CLOEXEC));
    int fcntl_gone = OK(open(path, O_RDONLY));
    OK(dup2(keep, 20));
    OK(dup3(gone, 21, O_CLOEXEC));
    OK(dup2(fcntl_gone, 22));
    OK(fcntl(22, F_SETFD, FD_CLOEXEC));
    OK(lseek(20, 2, SEEK_SET)); /* the offset goes along with the description */
    exec_self("cloexec_child", NULL);
}

static void t_cloexec_child(int argc, char **argv) {
    (void)argc; (void)argv;
    char buf[8] = {0};
    CHECK_EQ(read(20, buf, sizeof buf), 2);
    CHECK_STR(buf, "pt");
    CHECK_EQ(fcntl(20, F_GETFD), 0);
    CHECK_ERR(fcntl(21, F_GETFD), EBADF);
    CHECK_ERR(fcntl(22, F_GETFD), EBADF);
    CHECK(fcntl(1, F_GETFD) >= 0, "stdout stays");
}

static volatile int got;
static void on_signal(int sig) { got = sig; }

static void t_signals(int argc, char **argv) {
    (void)argc; (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_ONSTACK;
    sigaddset(&sa.sa_mask, SIGHUP);
    OK(sigaction(SIGUSR1, &sa, NULL));
    signal(SIGUSR2, SIG_IGN);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    OK(sigprocmask(SIG_BLOCK, &block, NULL));
    static char altstack[64 << 10];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    OK(sigaltstack(&ss, NULL));
    OK(raise(SIGTERM)); /* blocked: stays pending across the exec */
    exec_self("signals_child", NULL);
}

static void t_signals_child(int argc, char **argv) {
    (void)argc; (void)argv;
    struct sigaction sa;
    OK(sigaction(SIGUSR1, NULL, &sa));
    CHECK(sa.sa_handler == SIG_DFL, "a caught signal is back to its default");
    CHECK_EQ(sa.sa_flags & ~0x04000000 /* SA_RESTORER, added by glibc */, 0);
    CHECK(!sigismember(&sa.sa_mask, SIGHUP), "its mask is cleared");
    OK(sigaction(SIGUSR2, NULL, &sa));
    CHECK(sa.sa_handler == SIG_IGN, "an ignored signal stays ignored");
    sigset_t now, pending;
    OK(sigprocmask(SIG_BLOCK, NULL, &now));
    CHECK(sigismember(&now, SIGTERM), "the blocked mask is kept");
    OK(sigpending(&pending));
    CHECK(sigismember(&pending, SIGTERM), "a pending signal is kept");
    stack_t ss;
    OK(sigaltstack(NULL, &ss));
    CHECK(ss.ss_flags & SS_DISABLE, "the alternate stack is gone");
    /* SIGTERM would kill us once unblocked: ignore it first (an ignored pending signal is dropped) */
    signal(SIGTERM, SIG_IGN);
    OK(sigprocmask(SIG_UNBLOCK, &now, NULL));
}

/* The new image: /proc/self/exe, its name, a fresh brk and memory layout, auxv. */
static void t_image(int argc, char **argv) {
    (void)argc; (void)argv;
    void *big = mmap(NULL, 64 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(big != MAP_FAILED, "mmap");
    memset(big, 0x5a, 1 << 20);
    OK(prctl(PR_SET_NAME, "before-exec"));
    char link[PATH_MAX];
    tmp_path(link, "renamed-prog");
    unlink(link);
    OK(symlink(self, link));
    char addr[32];
    snprintf(addr, sizeof addr, "%p", big);
    char *args[] = {link, "image_child", addr, NULL};
    fflush(stdout);
    syscall(SYS_execve, link, args, no_env);
    FAIL("execve: %s", strerror(errno));
}

static void t_image_child(int argc, char **argv) {
    CHECK_EQ(argc, 3);
    char comm[17] = {0};
    OK(prctl(PR_GET_NAME, comm));
    CHECK_STR(comm, "renamed-prog");
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "readlink");
    if (n > 0) { exe[n] = 0; CHECK_STR(exe, self); } /* the file, not the symlink it was run by */
    void *old = NULL;
    sscanf(argv[2], "%p", &old);
    CHECK_EQ(readable(old, 1), 0); /* the old image's mappings are gone */
    CHECK_EQ(getpid(), syscall(SYS_gettid));
    char *e = (char *)getauxval(AT_EXECFN);
    CHECK(e && strstr(e, "renamed-prog"), "AT_EXECFN is the name it was run by: %s", e ? e : "(null)");
    CHECK(getauxval(AT_SYSINFO_EHDR) != 0, "a vDSO");
    CHECK(getauxval(AT_RANDOM) != 0, "AT_RANDOM");
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int named = 0;
    while (f && fgets(line, sizeof line, f)) named |= !strncmp(line, "Name:\trenamed-prog", 18);
    if (f) fclose(f);
    CHECK(named, "/proc/self/status names the new program");
}

/* Memory the new image gets reads as zeros, wherever the old image's pages were: the engine lets go
 * of them without zeroing (zb_mem_drop) and must zero each one it hands out again, also in a child
 * the new image forks. The old image fills anonymous mappings and its brk with a pattern first. */
#define ZEROED_MAP (64ul << 20)
#define ZEROED_BRK (8ul << 20)
#define ZEROED_SMALL (256ul << 10) /* a short run: cleared in place, not given back */

static size_t nonzero_bytes(const unsigned char *p, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += p[i] != 0;
    return n;
}

static void t_zeroed(int argc, char **argv) {
    (void)argc; (void)argv;
    unsigned char *big = mmap(NULL, ZEROED_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(big != MAP_FAILED, "mmap");
    if (big == MAP_FAILED) return;
    memset(big, 0x5a, ZEROED_MAP);
    unsigned char *small = mmap(NULL, ZEROED_SMALL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(small != MAP_FAILED, "mmap");
    if (small == MAP_FAILED) return;
    memset(small, 0x5a, ZEROED_SMALL);
    unsigned char *heap = sbrk((intptr_t)ZEROED_BRK);
    CHECK(heap != (void *)-1, "sbrk");
    if (heap != (void *)-1) memset(heap, 0x5a, ZEROED_BRK);
    /* left alone by the new image: still dropped when it forks, so its child inherits it dropped */
    unsigned char *kept = mmap(NULL, ZEROED_SMALL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(kept != MAP_FAILED, "mmap");
    if (kept == MAP_FAILED) return;
    memset(kept, 0x5a, ZEROED_SMALL);
    char addr[32], small_addr[32], kept_addr[32];
    snprintf(addr, sizeof addr, "%p", (void *)big);
    snprintf(small_addr, sizeof small_addr, "%p", (void *)small);
    snprintf(kept_addr, sizeof kept_addr, "%p", (void *)kept);
    /* each fork snapshots this memory: the pattern becomes its base's content, and after a few
     * snapshots that found it unchanged its pages leave the dirty set (page_reprotect.c): what the
     * new image's fork below records of them must not be that content */
    for (int i = 0; i < 8; i++) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        CHECK(pid > 0, "fork: %s", strerror(errno));
        if (pid > 0) waitpid(pid, NULL, 0);
    }
    char *extra[] = {addr, small_addr, kept_addr, NULL};
    exec_self("zeroed_child", extra);
}

static void t_zeroed_child(int argc, char **argv) {
    CHECK_EQ(argc, 5);
    if (argc != 5) return;
    void *old = NULL, *old_small = NULL, *old_kept = NULL;
    sscanf(argv[2], "%p", &old);
    sscanf(argv[3], "%p", &old_small);
    sscanf(argv[4], "%p", &old_kept);
    size_t more = ZEROED_MAP; /* the family's budget also holds the fork snapshot's copy of the pattern */
    /* first a child, while the old image's pages are still dropped here: the child must be handed
     * them as zeros too */
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *k = mmap(old_kept, ZEROED_SMALL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (k != old_kept) _exit(4);
        if (nonzero_bytes(k, ZEROED_SMALL)) _exit(5);
        unsigned char *c = mmap(NULL, more, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        _exit(c == MAP_FAILED ? 2 : nonzero_bytes(c, more) ? 3 : 0);
    }
    CHECK(pid > 0, "fork: %s", strerror(errno));
    int status = -1;
    if (pid > 0) OK(waitpid(pid, &status, 0) == pid ? 0 : -1);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's mapping held non-zero bytes or failed: %d", status);
    unsigned char *small = mmap(old_small, ZEROED_SMALL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(small == old_small, "mmap at the old small mapping's address (hint): %p, %p", (void *)small, old_small);
    if (small != MAP_FAILED) CHECK_EQ(nonzero_bytes(small, ZEROED_SMALL), 0);
    /* where the old mapping was, by hint and by MAP_FIXED, and wherever the allocator puts a new one */
    unsigned char *hinted = mmap(old, ZEROED_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(hinted != MAP_FAILED, "mmap at the old address (hint)");
    if (hinted != MAP_FAILED) {
        CHECK_EQ(nonzero_bytes(hinted, ZEROED_MAP), 0);
        OK(munmap(hinted, ZEROED_MAP));
    }
    unsigned char *fixed = mmap(old, ZEROED_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(fixed == old, "mmap MAP_FIXED at the old address");
    if (fixed == old) CHECK_EQ(nonzero_bytes(fixed, ZEROED_MAP), 0);
    unsigned char *fresh = mmap(NULL, more, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(fresh != MAP_FAILED, "mmap: %s", strerror(errno));
    if (fresh != MAP_FAILED) CHECK_EQ(nonzero_bytes(fresh, more), 0);
    unsigned char *heap = sbrk((intptr_t)(2 * ZEROED_BRK));
    CHECK(heap != (void *)-1, "sbrk");
    if (heap != (void *)-1) CHECK_EQ(nonzero_bytes(heap, 2 * ZEROED_BRK), 0);
}

/* exec from a thread that is not the main one: the caller becomes the only thread, with the pid
 * as its tid. */
static void *exec_from_thread(void *arg) {
    (void)arg;
    exec_self("thread_child", NULL);
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    for (;;) sleep(1);
    return NULL;
}

static void t_thread(int argc, char **argv) {
    (void)argc; (void)argv;
    pthread_t a, b;
    pthread_create(&a, NULL, sleeper, NULL);
    pthread_create(&b, NULL, exec_from_thread, NULL);
    for (;;) sleep(1);
}

static void t_thread_child(int argc, char **argv) {
    (void)argc; (void)argv;
    CHECK_EQ(syscall(SYS_gettid), getpid());
    int threads = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "Threads:", 8)) threads = atoi(line + 8);
    if (f) fclose(f);
    CHECK_EQ(threads, 1);
}

/* Copy this program's binary to path (mode 0755). */
static void copy_self(const char *path) {
    int in = OK(open(self, O_RDONLY));
    int out = OK(open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755));
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0) CHECK_EQ(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
}

/* execveat with AT_EMPTY_PATH: run an open file (fexecve), also one whose fd is close-on-exec
 * and whose name is already gone. */
static void t_fexecve(int argc, char **argv) {
    (void)argc; (void)argv;
    char copy[PATH_MAX];
    tmp_path(copy, "copy-of-self");
    copy_self(copy);
    int fd = OK(open(copy, O_RDONLY | O_CLOEXEC));
    OK(unlink(copy));
    char *args[] = {"copy", "fexecve_child", NULL};
    if (zb_failures) exit(1);
    fflush(stdout);
    syscall(SYS_execveat, fd, "", args, no_env, AT_EMPTY_PATH);
    FAIL("execveat: %s", strerror(errno));
}

static void t_fexecve_child(int argc, char **argv) {
    (void)argc; (void)argv;
    char *e = (char *)getauxval(AT_EXECFN);
    CHECK(e && !strncmp(e, "/dev/fd/", 8), "AT_EXECFN is /dev/fd/N: %s", e ? e : "(null)");
}

/* A set-user-ID, set-group-ID copy of this program runs with the caller's identity: there is no
 * privilege to gain (the guest has one identity, as on a nosuid mount). */
static void t_setuid(int argc, char **argv) {
    (void)argc; (void)argv;
    char copy[PATH_MAX];
    tmp_path(copy, "setuid-copy");
    copy_self(copy);
    OK(chmod(copy, 06755));
    struct stat st;
    OK(stat(copy, &st));
    CHECK(st.st_mode & S_ISUID, "the bit is shown");
    char uid[16];
    snprintf(uid, sizeof uid, "%d", (int)getuid());
    char *args[] = {copy, "setuid_child", uid, NULL};
    if (zb_failures) exit(1);
    fflush(stdout);
    syscall(SYS_execve, copy, args, no_env);
    FAIL("execve: %s", strerror(errno));
}

static void t_setuid_child(int argc, char **argv) {
    CHECK_EQ(argc, 3);
    CHECK_EQ(getauxval(AT_SECURE), 0);
    CHECK_EQ(geteuid(), atoi(argv[2]));
    CHECK_EQ(getuid(), atoi(argv[2]));
    CHECK_EQ(getegid(), getgid());
}

/* 10,000 arguments arrive whole. */
#define MANY_ARGS 10000
static void t_many_args(int argc, char **argv) {
    (void)argc; (void)argv;
    char **args = calloc(MANY_ARGS + 3, sizeof *args);
    char *text = malloc(MANY_ARGS * 8);
    args[0] = self;
    args[1] = "many_args_child";
    for (int i = 0; i < MANY_ARGS; i++) {
        snprintf(text + 8 * i, 8, "%d", i);
        args[i + 2] = text + 8 * i;
    }
    fflush(stdout);
    syscall(SYS_execve, self, args, no_env);
    FAIL("execve with %d arguments: %s", MANY_ARGS, strerror(errno));
}

static void t_many_args_child(int argc, char **argv) {
    CHECK_EQ(argc, MANY_ARGS + 2);
    for (int i = 0; i < MANY_ARGS && i + 2 < argc; i++)
        if (atoi(argv[i + 2]) != i) { FAIL("argument %d is %s", i, argv[i + 2]); break; }
}

/* ---- hostile ELF files: ENOEXEC (or ENOMEM for what cannot fit), and the caller goes on ---- */

typedef struct {
    Elf64_Ehdr eh;
    Elf64_Phdr ph[3];
    unsigned char code[16];
} tiny_elf;

static tiny_elf tiny(void) {
    tiny_elf e;
    memset(&e, 0, sizeof e);
    memcpy(e.eh.e_ident, ELFMAG, SELFMAG);
    e.eh.e_ident[EI_CLASS] = ELFCLASS64;
    e.eh.e_ident[EI_DATA] = ELFDATA2LSB;
    e.eh.e_ident[EI_VERSION] = EV_CURRENT;
    e.eh.e_type = ET_EXEC;
    e.eh.e_machine = EM_X86_64;
    e.eh.e_version = EV_CURRENT;
    e.eh.e_entry = 0x400000 + offsetof(tiny_elf, code);
    e.eh.e_phoff = offsetof(tiny_elf, ph);
    e.eh.e_ehsize = sizeof(Elf64_Ehdr);
    e.eh.e_phentsize = sizeof(Elf64_Phdr);
    e.eh.e_phnum = 1;
    e.ph[0].p_type = PT_LOAD;
    e.ph[0].p_flags = PF_R | PF_X;
    e.ph[0].p_offset = 0;
    e.ph[0].p_vaddr = e.ph[0].p_paddr = 0x400000;
    e.ph[0].p_filesz = e.ph[0].p_memsz = sizeof e;
    e.ph[0].p_align = 0x1000;
    /* exit_group(7): mov $231, %eax; mov $7, %edi; syscall */
    static const unsigned char code[] = {0xb8, 0xe7, 0, 0, 0, 0xbf, 7, 0, 0, 0, 0x0f, 0x05};
    memcpy(e.code, code, sizeof code);
    return e;
}

static int try_elf(const char *name, const void *data, size_t len) {
    char path[PATH_MAX];
    tmp_path(path, name);
    write_file(path, data, len, 0755);
    char *args[] = {(char *)name, NULL};
    errno = 0;
    long r = syscall(SYS_execve, path, args, no_env);
    return r == -1 ? errno : 0;
}

#define CHECK_REFUSED(e, ...) do { int e_ = (e); CHECK(__VA_ARGS__, "errno %d %s", e_, strerrorname_np(e_) ? strerrorname_np(e_) : "0"); } while (0)

static void t_hostile_elf(int argc, char **argv) {
    (void)argc; (void)argv;
    tiny_elf e = tiny();
    CHECK_EQ(try_elf("truncated", &e, 4), ENOEXEC);
    CHECK_EQ(try_elf("half-header", &e, 40), ENOEXEC);
    e = tiny(); e.eh.e_phoff = 1ull << 40;
    CHECK_EQ(try_elf("phoff-beyond", &e, sizeof e), ENOEXEC); /* (Linux: EIO) */
    e = tiny(); e.eh.e_phnum = 0;
    CHECK_EQ(try_elf("no-phdrs", &e, sizeof e), ENOEXEC);
    e = tiny(); e.eh.e_phentsize = 12;
    CHECK_EQ(try_elf("phentsize", &e, sizeof e), ENOEXEC);
    e = tiny(); e.eh.e_machine = EM_AARCH64;
    CHECK_EQ(try_elf("other-machine", &e, sizeof e), ENOEXEC);
    e = tiny(); e.ph[0].p_filesz = 1ull << 40;
    CHECK_REFUSED(try_elf("filesz-beyond-file", &e, sizeof e), e_ == ENOEXEC || e_ == EINVAL);
    e = tiny(); e.ph[0].p_memsz = ~0ull;
    CHECK_REFUSED(try_elf("memsz-wraps", &e, sizeof e), e_ == ENOEXEC || e_ == EINVAL || e_ == ENOMEM);
    e = tiny(); e.ph[0].p_memsz = 1ull << 46;
    CHECK_REFUSED(try_elf("memsz-huge", &e, sizeof e), e_ == ENOEXEC || e_ == ENOMEM);
    e = tiny(); e.eh.e_phnum = 2; e.ph[1] = e.ph[0]; e.ph[1].p_flags = PF_R | PF_W;
    CHECK_REFUSED(try_elf("overlapping", &e, sizeof e), e_ == ENOEXEC || e_ == EINVAL);
    e = tiny(); e.eh.e_phnum = 2; e.ph[1].p_type = PT_INTERP; e.ph[1].p_offset = offsetof(tiny_elf, code);
    e.ph[1].p_filesz = 4; memcpy(e.code, "/tmp", 4); /* not NUL-terminated */
    CHECK_EQ(try_elf("interp-unterminated", &e, sizeof e), ENOEXEC);
    e.ph[1].p_filesz = 5; e.code[4] = 0; /* a directory */
    CHECK_EQ(try_elf("interp-directory", &e, sizeof e), EACCES);
    e.ph[1].p_offset = 1ull << 40;
    CHECK_EQ(try_elf("interp-beyond", &e, sizeof e), ENOEXEC);
    /* an interpreter that is no ELF file */
    char garbage[PATH_MAX];
    tmp_path(garbage, "garbage-loader");
    write_file(garbage, "not an ELF file at all\n", 23, 0755);
    size_t glen = strlen(garbage) + 1;
    char image[sizeof(tiny_elf) + PATH_MAX];
    e = tiny(); e.eh.e_phnum = 2; e.ph[1].p_type = PT_INTERP; e.ph[1].p_offset = sizeof e; e.ph[1].p_filesz = glen;
    memcpy(image, &e, sizeof e);
    memcpy(image + sizeof e, garbage, glen);
    CHECK_EQ(try_elf("interp-garbage", image, sizeof e + glen), ELIBBAD);
    /* and a well-formed one runs: its exit status is 7 */
    e = tiny();
    char path[PATH_MAX];
    tmp_path(path, "tiny");
    write_file(path, &e, sizeof e, 0755);
    char *args[] = {"tiny", NULL};
    if (zb_failures) exit(1);
    printf("PASS hostile_elf\n");
    fflush(stdout);
    syscall(SYS_execve, path, args, no_env);
    FAIL("execve tiny: %s", strerror(errno));
}

static const zb_test tests[] = {
    {"echo", t_echo},
    {"true", t_true},
    {"run", t_run},
    {"script", t_script},
    {"script_args", t_script_args},
    {"script_args_child", t_script_args_child},
    {"sh_c", t_sh_c},
    {"errors", t_errors},
    {"e2big", t_e2big},
    {"efault", t_efault},
    {"cloexec", t_cloexec},
    {"cloexec_child", t_cloexec_child},
    {"signals", t_signals},
    {"signals_child", t_signals_child},
    {"image", t_image},
    {"image_child", t_image_child},
    {"zeroed", t_zeroed},
    {"zeroed_child", t_zeroed_child},
    {"thread", t_thread},
    {"thread_child", t_thread_child},
    {"fexecve", t_fexecve},
    {"fexecve_child", t_fexecve_child},
    {"setuid", t_setuid},
    {"setuid_child", t_setuid_child},
    {"many_args", t_many_args},
    {"many_args_child", t_many_args_child},
    {"hostile_elf", t_hostile_elf},
    {NULL, NULL},
};

int main(int argc, char **argv) {
    setup();
    if (argc > 1 && !strncmp(argv[1], "script_args_child", 17)) { /* its argv[1] is the script's "arg" */
        t_script_args_child(argc, argv);
        if (zb_failures) return 1;
        printf("PASS script_args_child\n");
        return 0;
    }
    return zb_run(tests, argc, argv);
}
