/* fs_proc.c - the /proc files libraries read about their own process, synthesised in guest terms.
 *
 * threadpoolctl, psutil, scikit-learn, joblib and friends read /proc/self/maps, status, stat, statm,
 * smaps_rollup and cgroup, /proc/meminfo and /proc/cpuinfo. The guest has no kernel, so the engine
 * writes them from the sandbox's own state when they are opened: guest addresses and the region
 * names the guest itself used (paths as the guest sees them), the guest's pid, memory limit and
 * CPU time; never host pids, host memory figures or host paths the view does not show. Each open
 * gets a private snapshot of the content (an unnamed read-only overlay file), as Linux's seq files
 * give a consistent view per open.
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/sysmacros.h>

#define PROC_MAX (4u << 20)

typedef struct proc_buf {
    char *data;
    size_t len, cap;
    int failed;
} proc_buf;

static void put(proc_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->failed = 1; return; }
        if (b->data && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap <= b->len + (size_t)n) cap *= 2;
        if (cap > PROC_MAX) { b->failed = 1; return; }
        char *nd = realloc(b->data, cap);
        if (!nd) { b->failed = 1; return; }
        b->data = nd;
        b->cap = cap;
    }
}

/* Raw bytes (with NULs, which put's format cannot carry). */
static void put_bytes(proc_buf *b, const void *data, size_t n) {
    if (b->failed) return;
    if (b->len + n > PROC_MAX) { b->failed = 1; return; }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *nd = realloc(b->data, cap);
        if (!nd) { b->failed = 1; return; }
        b->data = nd;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static uint64_t kib(uint64_t pages) { return pages * (ZB_PAGE / 1024); }

static const char *comm(zb_sandbox *sb) { return sb->proc.comm; }

/* the pids sys_process.c answers getpid()/getppid() with (the agent is 1, with no parent) */
static int own_pid(const zb_sandbox *sb) { return (int)zb_proc_getpid(sb); }
static int parent_pid(zb_sandbox *sb) {
    int32_t ppid, pgid, sid;
    zb_proc_ids(sb, &ppid, &pgid, &sid);
    return (int)ppid;
}

static uint64_t mapped_pages(zb_sandbox *sb) {
    uint64_t n = 0;
    for (size_t i = 0; i < sb->mem.nregions; i++) n += (sb->mem.regions[i].end - sb->mem.regions[i].start) / ZB_PAGE;
    return n;
}

static void gen_maps(zb_sandbox *sb, proc_buf *b) {
    for (size_t i = 0; i < sb->mem.nregions; i++) {
        const zb_region *r = &sb->mem.regions[i];
        const char *name = strcmp(r->name, "[anon]") ? r->name : "";
        put(b, "%012llx-%012llx %c%c%cp 00000000 00:00 0%s%s\n", (unsigned long long)r->start,
            (unsigned long long)r->end, (r->prot & PROT_READ) ? 'r' : '-', (r->prot & PROT_WRITE) ? 'w' : '-',
            (r->prot & PROT_EXEC) ? 'x' : '-', name[0] ? "                          " : "", name);
    }
}

/* The signal masks of /proc/PID/status (bit sig-1 for signal sig), which CPython's test suite and
 * tools such as ps read to see what a process ignores or catches. */
static void signal_sets(const zb_sandbox *sb, uint64_t *ignored, uint64_t *caught) {
    *ignored = *caught = 0;
    for (int sig = 1; sig <= 64; sig++) {
        uint64_t h = sb->sig.action[sig].handler;
        if (h == (uint64_t)(uintptr_t)SIG_IGN) *ignored |= ZB_SIG_BIT(sig);
        else if (h != (uint64_t)(uintptr_t)SIG_DFL) *caught |= ZB_SIG_BIT(sig);
    }
}

static void gen_status(zb_sandbox *sb, proc_buf *b) {
    uint64_t rss = sb->mem.pages_allocated, vm = mapped_pages(sb);
    uint64_t ignored, caught;
    signal_sets(sb, &ignored, &caught);
    const zb_thread *me = &sb->threads.t[sb->threads.current];
    put(b, "Name:\t%.15s\nUmask:\t%04o\nState:\tR (running)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\n"
           "TracerPid:\t0\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nFDSize:\t%d\nGroups:\t1000\n"
           "VmPeak:\t%8llu kB\nVmSize:\t%8llu kB\nVmLck:\t       0 kB\nVmPin:\t       0 kB\n"
           "VmHWM:\t%8llu kB\nVmRSS:\t%8llu kB\nRssAnon:\t%8llu kB\nRssFile:\t       0 kB\nRssShmem:\t       0 kB\n"
           "VmData:\t%8llu kB\nVmStk:\t     132 kB\nVmExe:\t       0 kB\nVmLib:\t       0 kB\nVmSwap:\t       0 kB\n"
           "Threads:\t%d\nSigQ:\t0/0\nSigPnd:\t%016llx\nShdPnd:\t%016llx\nSigBlk:\t%016llx\n"
           "SigIgn:\t%016llx\nSigCgt:\t%016llx\nCpus_allowed:\t1\nCpus_allowed_list:\t0\nMems_allowed_list:\t0\n"
           "voluntary_ctxt_switches:\t0\nnonvoluntary_ctxt_switches:\t0\n",
        comm(sb), (unsigned)sb->proc.umask, own_pid(sb), own_pid(sb), parent_pid(sb), ZB_MAX_FDS,
        (unsigned long long)kib(vm), (unsigned long long)kib(vm), (unsigned long long)kib(rss),
        (unsigned long long)kib(rss), (unsigned long long)kib(rss), (unsigned long long)kib(rss),
        ZB_MAX(sb->threads.count, 1), (unsigned long long)me->pending, (unsigned long long)sb->sig.pending,
        (unsigned long long)sb->sig.blocked, (unsigned long long)ignored, (unsigned long long)caught);
}

static void gen_statm(zb_sandbox *sb, proc_buf *b) {
    uint64_t rss = sb->mem.pages_allocated;
    put(b, "%llu %llu 0 0 0 %llu 0\n", (unsigned long long)mapped_pages(sb), (unsigned long long)rss,
        (unsigned long long)rss);
}

static void gen_stat(zb_sandbox *sb, proc_buf *b) {
    int32_t ppid, pgid, sid;
    zb_proc_ids(sb, &ppid, &pgid, &sid);
    uint64_t user, sys;
    zb_guest_cpu_split(sb, &user, &sys);
    const uint64_t tick = 10000000; /* USER_HZ 100 */
    /* the 52 fields of proc(5); what the sandbox has no notion of is 0 */
    put(b, "%d (%.15s) R %d %d %d 0 -1 4194304 %llu 0 0 0 %llu %llu 0 0 20 0 1 0 0 %llu %llu "
           "18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
        own_pid(sb), comm(sb), (int)ppid, (int)pgid, (int)sid, (unsigned long long)sb->mem.pages_allocated,
        (unsigned long long)(user / tick), (unsigned long long)(sys / tick),
        (unsigned long long)(mapped_pages(sb) * ZB_PAGE), (unsigned long long)sb->mem.pages_allocated);
}

static void gen_smaps_rollup(zb_sandbox *sb, proc_buf *b) {
    uint64_t lo = sb->mem.nregions ? sb->mem.regions[0].start : 0, hi = lo;
    for (size_t i = 0; i < sb->mem.nregions; i++) {
        lo = ZB_MIN(lo, sb->mem.regions[i].start);
        hi = sb->mem.regions[i].end > hi ? sb->mem.regions[i].end : hi;
    }
    unsigned long long rss = (unsigned long long)kib(sb->mem.pages_allocated);
    put(b, "%012llx-%012llx ---p 00000000 00:00 0                          [rollup]\n"
           "Rss:            %8llu kB\nPss:            %8llu kB\nPss_Anon:       %8llu kB\nPss_File:              0 kB\n"
           "Pss_Shmem:             0 kB\nShared_Clean:          0 kB\nShared_Dirty:          0 kB\n"
           "Private_Clean:         0 kB\nPrivate_Dirty:  %8llu kB\nReferenced:     %8llu kB\nAnonymous:      %8llu kB\n"
           "LazyFree:              0 kB\nAnonHugePages:         0 kB\nShmemPmdMapped:        0 kB\nFilePmdMapped:         0 kB\n"
           "Shared_Hugetlb:        0 kB\nPrivate_Hugetlb:       0 kB\nSwap:                  0 kB\nSwapPss:               0 kB\n"
           "Locked:                0 kB\n",
        (unsigned long long)lo, (unsigned long long)hi, rss, rss, rss, rss, rss, rss);
}

static void gen_meminfo(zb_sandbox *sb, proc_buf *b) {
    uint64_t total = kib(sb->mem.pages_limit);
    uint64_t used = kib(ZB_MIN(sb->mem.pages_allocated, sb->mem.pages_limit));
    put(b, "MemTotal:       %8llu kB\nMemFree:        %8llu kB\nMemAvailable:   %8llu kB\nBuffers:               0 kB\n"
           "Cached:                0 kB\nSwapCached:            0 kB\nActive:         %8llu kB\nInactive:              0 kB\n"
           "SwapTotal:             0 kB\nSwapFree:              0 kB\nDirty:                 0 kB\nAnonPages:      %8llu kB\n"
           "Shmem:                 0 kB\nCommitLimit:    %8llu kB\nCommitted_AS:   %8llu kB\nHugePages_Total:       0\n"
           "HugePages_Free:        0\nHugepagesize:       2048 kB\n",
        (unsigned long long)total, (unsigned long long)(total - used), (unsigned long long)(total - used),
        (unsigned long long)used, (unsigned long long)used, (unsigned long long)total, (unsigned long long)used);
}

/* The CPU the guest runs on is the host's (CPUID is not hidden from it): the first processor's
 * description from the host, read once, as the single CPU the sandbox reports. */
static char cpu_desc[8192];
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static const char *const cpu_keys[] = {"vendor_id", "cpu family", "model", "model name", "stepping", "microcode",
                                       "cpu MHz", "cache size", "fpu", "fpu_exception", "cpuid level", "wp", "flags",
                                       "bugs", "bogomips", "clflush size", "cache_alignment", "address sizes", NULL};

static void read_cpu_desc(void) {
    char raw[65536];
    size_t len = 0;
    int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n;
        while (len < sizeof raw - 1 && (n = read(fd, raw + len, sizeof raw - 1 - len)) > 0) len += (size_t)n;
        close(fd);
    }
    raw[len] = 0;
    char *end = strstr(raw, "\n\n"); /* the first processor only */
    if (end) *end = 0;
    size_t out = 0;
    for (char *line = raw, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        size_t keylen = (size_t)(colon - line);
        while (keylen && (line[keylen - 1] == '\t' || line[keylen - 1] == ' ')) keylen--;
        for (int k = 0; cpu_keys[k]; k++) {
            if (strlen(cpu_keys[k]) == keylen && !strncmp(line, cpu_keys[k], keylen)) {
                int n = snprintf(cpu_desc + out, sizeof cpu_desc - out, "%s\n", line);
                if (n > 0 && out + (size_t)n < sizeof cpu_desc) out += (size_t)n;
                break;
            }
        }
    }
}

static void gen_cpuinfo(zb_sandbox *sb, proc_buf *b) {
    (void)sb;
    pthread_once(&cpu_once, read_cpu_desc);
    put(b, "processor\t: 0\n%sphysical id\t: 0\nsiblings\t: 1\ncore id\t\t: 0\ncpu cores\t: 1\napicid\t\t: 0\n"
           "initial apicid\t: 0\n\n", cpu_desc);
}

/* /proc/uptime and /proc/stat, which ps, top, uptime and psutil read first (procps gives up
 * without them: "fatal library error, reap"). The uptime is the guest's CLOCK_BOOTTIME, which
 * sys_time.c serves from the host's, so that btime + a clock the guest reads agree; the idle
 * time is what the sandbox did not spend running this process. */
static void gen_uptime(zb_sandbox *sb, proc_buf *b) {
    uint64_t up = zb_guest_uptime_ns(), cpu = zb_guest_cpu_ns(sb), idle = up > cpu ? up - cpu : 0;
    put(b, "%llu.%02llu %llu.%02llu\n", (unsigned long long)(up / 1000000000), (unsigned long long)(up % 1000000000 / 10000000),
        (unsigned long long)(idle / 1000000000), (unsigned long long)(idle % 1000000000 / 10000000));
}

static void gen_system_stat(zb_sandbox *sb, proc_buf *b) {
    const uint64_t tick = 10000000; /* USER_HZ 100 */
    uint64_t user, sys, up = zb_guest_uptime_ns();
    zb_guest_cpu_split(sb, &user, &sys);
    uint64_t idle = up > user + sys ? (up - user - sys) / tick : 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long u = (unsigned long long)(user / tick), s = (unsigned long long)(sys / tick);
    put(b, "cpu  %llu 0 %llu %llu 0 0 0 0 0 0\ncpu0 %llu 0 %llu %llu 0 0 0 0 0 0\nintr 0\nctxt 0\nbtime %llu\n"
           "processes %d\nprocs_running 1\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n",
        u, s, (unsigned long long)idle, u, s, (unsigned long long)idle,
        (unsigned long long)(now.tv_sec - (time_t)(up / 1000000000)), zb_sandbox_process_count(sb));
}

/* The argv strings as the process's memory holds them now (setproctitle rewrites them), NUL-separated,
 * as Linux reads mm->arg_start..arg_end; empty if that memory is gone. */
static void gen_cmdline(zb_sandbox *sb, proc_buf *b) {
    uint64_t n = ZB_MIN(sb->proc.arg_end - sb->proc.arg_start, (uint64_t)ZB_PROC_CMDLINE_MAX);
    char *buf = n ? malloc(n) : NULL;
    if (n && !buf) { b->failed = 1; return; }
    if (n && zb_copy_from_guest(sb, buf, sb->proc.arg_start, n) == 0) put_bytes(b, buf, n);
    free(buf);
}

static void gen_cgroup(zb_sandbox *sb, proc_buf *b) {
    (void)sb;
    put(b, "0::/\n");
}

/* The mount table df, findmnt and psutil.disk_partitions read (df warns "cannot read table of
 * mounted file systems" without it): the sandbox's file system as one mount at /, on the device
 * its synthetic and overlay files report (ZB_DEV_ID), and /proc. Host paths and devices never
 * show. */
static void gen_mounts(zb_sandbox *sb, proc_buf *b) {
    (void)sb;
    put(b, "zeroboot / zeroboot rw,relatime 0 0\nproc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n");
}

static void gen_mountinfo(zb_sandbox *sb, proc_buf *b) {
    (void)sb;
    put(b, "1 0 %u:%u / / rw,relatime - zeroboot zeroboot rw\n2 1 0:4 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n",
        major(ZB_DEV_ID), minor(ZB_DEV_ID));
}

typedef void (*proc_gen)(zb_sandbox *, proc_buf *);
static const struct { int id; const char *name; int in_self; proc_gen gen; } proc_files[] = {
    {DEV_PROC_MAPS, "maps", 1, gen_maps},
    {DEV_PROC_STATUS, "status", 1, gen_status},
    {DEV_PROC_STAT, "stat", 1, gen_stat},
    {DEV_PROC_STATM, "statm", 1, gen_statm},
    {DEV_PROC_SMAPS_ROLLUP, "smaps_rollup", 1, gen_smaps_rollup},
    {DEV_PROC_CGROUP, "cgroup", 1, gen_cgroup},
    {DEV_PROC_CMDLINE, "cmdline", 1, gen_cmdline},
    {DEV_PROC_MEMINFO, "meminfo", 0, gen_meminfo},
    {DEV_PROC_CPUINFO, "cpuinfo", 0, gen_cpuinfo},
    {DEV_PROC_UPTIME, "uptime", 0, gen_uptime},
    {DEV_PROC_SYSTEM_STAT, "stat", 0, gen_system_stat},
    {DEV_PROC_MOUNTS, "mounts", 1, gen_mounts},
    {DEV_PROC_MOUNTS, "mounts", 0, gen_mounts},
    {DEV_PROC_MOUNTINFO, "mountinfo", 1, gen_mountinfo},
};
#define NPROC (sizeof proc_files / sizeof proc_files[0])

int zb_proc_add_files(zb_mnode *proc, zb_mnode *self) {
    for (size_t i = 0; i < NPROC; i++) {
        zb_mnode *n = zb_mnode_add(proc_files[i].in_self ? self : proc, proc_files[i].name, MNT_DEV);
        if (!n) return -1;
        n->dev = proc_files[i].id;
    }
    if (!zb_mnode_add(self, "cwd", MNT_PROC_CWD) || !zb_mnode_add(self, "fd", MNT_PROC_FD) ||
        !zb_mnode_add(self, "fdinfo", MNT_PROC_FDINFO))
        return -1;
    return 0;
}

int zb_proc_fd_link(zb_sandbox *t, int fd, char *buf, size_t cap) {
    zb_file *f = fd >= 0 ? zb_fd_get(t, (uint64_t)fd) : NULL;
    if (!f) return -ENOENT;
    if (f->where && f->where->path[0]) return snprintf(buf, cap, "%s", f->where->path);
    if (f->kind == FILE_DEV) { /* opened by the engine itself (the agent's stdin): the /dev entry */
        static const char *const names[] = {[DEV_NULL] = "null", [DEV_ZERO] = "zero", [DEV_URANDOM] = "urandom",
                                            [DEV_UART] = "ttyS0", [DEV_PTMX] = "ptmx"};
        if (f->dev > 0 && f->dev <= DEV_PTMX && names[f->dev]) return snprintf(buf, cap, "/dev/%s", names[f->dev]);
    }
    struct stat st;
    if (zb_file_stat(t, f, &st) < 0) memset(&st, 0, sizeof st);
    /* anonymous files have no inode number of their own: the description's id names it */
    unsigned long long ino = st.st_ino ? (unsigned long long)st.st_ino : (unsigned long long)f->id;
    if (S_ISFIFO(st.st_mode)) return snprintf(buf, cap, "pipe:[%llu]", ino);
    if (S_ISSOCK(st.st_mode)) return snprintf(buf, cap, "socket:[%llu]", ino);
    return snprintf(buf, cap, "anon_inode:[%s]", f->kind == FILE_EPOLL ? "eventpoll" : f->ops->name);
}

int zb_proc_list_fds(zb_sandbox *sb, int32_t pid, unsigned char dtype, zb_listing *out) {
    zb_sandbox *t = zb_proc_target(sb, pid);
    for (int fd = 0; t && fd < ZB_MAX_FDS; fd++) {
        if (!zb_fd_get(t, (uint64_t)fd)) continue;
        char name[16];
        snprintf(name, sizeof name, "%d", fd);
        int r = zb_listing_add(out, name, dtype, 0);
        if (r < 0) return r;
    }
    return 0;
}

/* /proc/<pid>/fdinfo/N as Linux writes it: the offset, the status flags in octal (O_CLOEXEC
 * among them when the fd has it), the mount and the inode. */
static void gen_fdinfo(zb_sandbox *t, int fd, proc_buf *b) {
    zb_file *f = zb_fd_get(t, (uint64_t)fd);
    struct stat st;
    if (!f || zb_file_stat(t, f, &st) < 0) return;
    int flags = f->flags | (t->fds->cloexec[fd] ? O_CLOEXEC : 0);
    put(b, "pos:\t%llu\nflags:\t0%o\nmnt_id:\t1\nino:\t%llu\n", (unsigned long long)f->offset, (unsigned)flags,
        (unsigned long long)st.st_ino);
}

int zb_dev_is_proc(int dev) { return dev >= DEV_PROC_FIRST && dev <= DEV_PROC_LAST; }

zb_sandbox *zb_proc_target(zb_sandbox *sb, int32_t pid) {
    if (!pid || pid == own_pid(sb)) return sb;
    int i = sb->fam ? zb_family_find(sb->fam, pid) : -1;
    if (i < 0 || sb->fam->m[i].zombie || !sb->fam->m[i].sb || sb->fam->m[i].sb->finished) return NULL;
    return sb->fam->m[i].sb;
}

/* A zombie of sb's family (it ended and its parent has not waited for it yet), or NULL. */
static const zb_member *zombie_of(const zb_sandbox *sb, int32_t pid) {
    int i = sb->fam && pid > 0 ? zb_family_find(sb->fam, pid) : -1;
    return i >= 0 && sb->fam->m[i].zombie ? &sb->fam->m[i] : NULL;
}

int zb_proc_exists(zb_sandbox *sb, int32_t pid) { return zb_proc_target(sb, pid) || zombie_of(sb, pid); }

/* A zombie's /proc/PID files, as Linux shows a task without memory or files: state Z, its name and
 * ids, the CPU time wait4 will report; no memory, an empty cmdline and maps (ps: "[name] <defunct>"). */
static void gen_zombie(const zb_member *z, int dev, proc_buf *b) {
    const uint64_t tick = 10000000; /* USER_HZ 100 */
    switch (dev) {
    case DEV_PROC_STATUS:
        put(b, "Name:\t%.15s\nState:\tZ (zombie)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\nTracerPid:\t0\n"
               "Uid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nFDSize:\t0\nGroups:\t1000\n"
               "Threads:\t1\nSigQ:\t0/0\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"
               "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n",
            z->comm, (int)z->pid, (int)z->pid, (int)z->ppid);
        break;
    case DEV_PROC_STAT:
        put(b, "%d (%.15s) Z %d %d %d 0 -1 4194308 0 0 0 0 %llu %llu 0 0 20 0 1 0 0 0 0 "
               "18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 %d\n",
            (int)z->pid, z->comm, (int)z->ppid, (int)z->pgid, (int)z->sid, (unsigned long long)(z->utime_ns / tick),
            (unsigned long long)(z->stime_ns / tick), z->wstatus); /* flags: PF_EXITING; last: the exit code */
        break;
    case DEV_PROC_STATM: put(b, "0 0 0 0 0 0 0\n"); break;
    case DEV_PROC_CGROUP: put(b, "0::/\n"); break;
    default: break; /* maps, cmdline, smaps_rollup: empty */
    }
}

int zb_proc_list_pids(zb_sandbox *sb, zb_listing *out) {
    int n = sb->fam ? sb->fam->count : 1;
    for (int i = 0; i < n; i++) {
        int32_t pid = sb->fam ? sb->fam->m[i].pid : own_pid(sb);
        if (!zb_proc_exists(sb, pid)) continue;
        char name[16];
        snprintf(name, sizeof name, "%d", (int)pid);
        int r = zb_listing_add(out, name, DT_DIR, 0);
        if (r < 0) return r;
    }
    return 0;
}

/* An unnamed read-only overlay file holding the content of /proc file `dev` of process pid now:
 * its inode, or -errno. */
long zb_proc_snapshot(zb_sandbox *sb, const zb_loc *l) {
    proc_gen gen = NULL;
    int32_t pid = l->pid;
    int dev = l->dev;
    for (size_t i = 0; i < NPROC; i++)
        if (proc_files[i].id == dev) gen = proc_files[i].gen;
    zb_sandbox *target = zb_proc_target(sb, pid);
    const zb_member *zombie = target ? NULL : zombie_of(sb, pid);
    proc_buf b = {0};
    if (dev == DEV_PROC_FDINFO) { /* the fd may have been closed since the lookup */
        if (!target || !zb_fd_get(target, (uint64_t)(l->proc_fd - 1))) return -ENOENT;
        gen_fdinfo(target, l->proc_fd - 1, &b);
    } else {
        if (!gen || (!target && !zombie)) return -ENOENT;
        if (target) gen(target, &b);
        else gen_zombie(zombie, dev, &b);
    }
    if (b.failed) { free(b.data); return -ENOMEM; }
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_FILE, 0444);
    if (!ino) { free(b.data); return -ENOMEM; }
    long rc = b.len ? zb_ovl_write(sb->fs, ino, b.data, b.len, 0) : 0;
    free(b.data);
    if (rc < 0) { zb_ovl_discard(sb->fs, ino); return rc; }
    zb_inode *in = zb_ovl_inode(sb->fs, ino);
    if (in) in->readonly = 1;
    return ino;
}
