/* sandbox.c - creating, configuring and freeing sandboxes; the small public accessors.
 * Below the snapshot layer: a sandbox's lineage (its base snapshot) is snapshot.c's business. */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "shared_map.h"
#include "linux.h"
#include "sandbox.h"

#include <fcntl.h>

static int std_fds(zb_sandbox *sb) {
    zb_file *in = zb_file_new(FILE_DEV), *out = zb_file_new(FILE_CONSOLE), *err = zb_file_new(FILE_CONSOLE);
    if (!in || !out || !err) { free(in); free(out); free(err); return -1; }
    in->dev = DEV_NULL;
    in->flags = O_RDONLY;
    out->stream = 1;
    out->flags = O_WRONLY;
    err->stream = 2;
    err->flags = O_WRONLY;
    if (zb_fd_install(sb, in, 0, 0) != 0 || zb_fd_install(sb, out, 1, 0) != 1 || zb_fd_install(sb, err, 2, 0) != 2) return -1;
    return 0;
}

/* The parts every sandbox has, before memory and state are filled in (boot or fork). */
zb_sandbox *zb_sandbox_alloc(zb_engine *e, char *err) {
    zb_sandbox *sb = calloc(1, sizeof *sb);
    if (!sb || !(sb->cpu.xsave = calloc(1, e->xsave_size))) {
        free(sb);
        zb_seterr(err, "out of memory");
        return NULL;
    }
    if (zb_threads_init(&sb->threads, e->xsave_size) < 0) {
        free(sb->cpu.xsave);
        free(sb);
        zb_seterr(err, "out of memory");
        return NULL;
    }
    sb->engine = e;
    sb->trace_fd = -1;
    zb_uart_init(&sb->uart);
    return sb;
}

zb_sandbox *zb_sandbox_new(zb_engine *e, uint64_t mem_bytes, char *err) {
    zb_sandbox *sb = zb_sandbox_alloc(e, err);
    if (!sb) return NULL;
    if (zb_mem_init(&sb->mem, mem_bytes, NULL, err) < 0) goto fail;
    zb_layout_write(&sb->mem);
    zb_cpu_init_fpu(sb->cpu.xsave, e->xsave_size);
    if (!(sb->fs = zb_fs_new(err))) goto fail;
    if (!(sb->fds = zb_fdtable_new()) || std_fds(sb) < 0) { zb_seterr(err, "out of memory"); goto fail; }
    strcpy(sb->proc.cwd, "/");
    sb->proc.umask = 022;
    return sb;
fail:
    zb_sandbox_destroy(sb);
    return NULL;
}

static zb_mnode *remap(zb_mnode *n, zb_mnode **map, size_t nmap) {
    for (size_t i = 0; n && i < nmap; i += 2)
        if (map[i] == n) return map[i + 1];
    return n;
}

/* Before changing the namespace of a sandbox that shares it with snapshots (a fork), give it a
 * copy, and point its open files' resolved locations into that copy. */
static int own_namespace(zb_sandbox *sb, char *err) {
    zb_mnode **map;
    size_t nmap;
    if (zb_fs_privatize_trie(sb->fs, &map, &nmap, err) < 0) return -1;
    for (int fd = 0; nmap && fd < ZB_MAX_FDS; fd++) {
        zb_file *f = sb->fds->fd[fd];
        if (!f || !f->where) continue;
        if (zb_where_own(f) < 0) { free(map); zb_seterr(err, "out of memory"); return -1; }
        f->where->loc.mnode = remap(f->where->loc.mnode, map, nmap);
        f->where->parent.mnode = remap(f->where->parent.mnode, map, nmap);
        f->where->loc.proj_root = remap(f->where->loc.proj_root, map, nmap);
        f->where->parent.proj_root = remap(f->where->parent.proj_root, map, nmap);
    }
    free(map);
    return 0;
}

int zb_sandbox_view_add(zb_sandbox *sb, const char *host_path, char *err) {
    return own_namespace(sb, err) < 0 ? -1 : zb_fs_view_add(sb->fs, host_path, err);
}
int zb_sandbox_overlay_dir(zb_sandbox *sb, const char *guest_path, char *err) {
    return own_namespace(sb, err) < 0 ? -1 : zb_fs_overlay_dir(sb->fs, guest_path, err);
}
int zb_sandbox_put_file(zb_sandbox *sb, const char *guest_path, const void *data, size_t len, char *err) {
    return own_namespace(sb, err) < 0 ? -1 : zb_fs_put_file(sb->fs, guest_path, data, len, err);
}
int zb_sandbox_mount_project(zb_sandbox *sb, const char *host_dir, int mode, char *err) {
    return own_namespace(sb, err) < 0 ? -1 : zb_fs_mount_project(sb->fs, host_dir, mode, err);
}
/* The mode changes for this sandbox and every snapshot of its lineage (restores, rewinds,
 * isolated cells), and for its open files (zb_file_write_check): no trie copy needed. */
int zb_sandbox_set_project_mode(zb_sandbox *sb, const char *host_dir, int mode, char *err) {
    return zb_fs_set_project_mode(sb->fs, host_dir, mode, err);
}

int zb_sandbox_own_policies(zb_sandbox *sb, char *err) {
    if (!zb_fs_has_project(sb->fs)) return 0;
    if (own_namespace(sb, err) < 0) return -1;
    if (zb_fs_own_policies(sb->fs) < 0) { zb_seterr(err, "out of memory"); return -1; }
    return 0;
}
int zb_sandbox_project_hide(zb_sandbox *sb, const char *host_dir, const char *paths, char *err) {
    return own_namespace(sb, err) < 0 ? -1 : zb_fs_project_hide(sb->fs, host_dir, paths, err);
}
long zb_sandbox_project_diff(zb_sandbox *sb, const char *host_dir, char *buf, size_t len, char *err) {
    return zb_project_diff(sb, host_dir, buf, len, err);
}
long zb_sandbox_read_file(zb_sandbox *sb, const char *guest_path, uint64_t offset, void *buf, size_t len, char *err) {
    return zb_guest_read_file(sb, guest_path, offset, buf, len, err);
}
long zb_sandbox_list_dir(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err) {
    return zb_guest_list_dir(sb, guest_path, buf, len, err);
}
long zb_sandbox_guest_stat(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err) {
    return zb_guest_stat(sb, guest_path, buf, len, err);
}

int zb_sandbox_chdir(zb_sandbox *sb, const char *guest_path, char *err) {
    zb_resolved r;
    int rc = zb_fs_resolve(sb, sb->proc.cwd[0] ? sb->proc.cwd : "/", guest_path, 0, &r);
    if (rc < 0 || !r.exists || !r.loc.is_dir) {
        zb_seterr(err, "%s is not a directory in the sandbox", guest_path);
        return -1;
    }
    snprintf(sb->proc.cwd, sizeof sb->proc.cwd, "%s", r.path);
    return 0;
}

void zb_sandbox_set_overlay_limit(zb_sandbox *sb, uint64_t bytes) { sb->fs->bytes_limit = bytes ? bytes : 256ull << 20; }
void zb_sandbox_set_memory_limit(zb_sandbox *sb, uint64_t bytes) {
    uint64_t pages = bytes ? bytes / ZB_PAGE : sb->mem.npages;
    sb->mem.pages_limit = ZB_MIN(pages, sb->mem.npages);
}
void zb_sandbox_set_trace_fd(zb_sandbox *sb, int fd) { sb->trace_fd = fd; }

int zb_sandbox_set_max_threads(zb_sandbox *sb, int n) {
    if (n < 1 || n > ZB_THREADS_MAX) return -1;
    sb->threads.max_threads = n;
    return 0;
}

void zb_sandbox_set_input_yields(zb_sandbox *sb, int on) { sb->input_yields = on != 0; }

void zb_sandbox_set_profile(zb_sandbox *sb, int on) {
    if (on) {
        memset(&sb->prof, 0, sizeof sb->prof);
        if (!sb->prof_nr) sb->prof_nr = calloc(ZB_PROFILE_NRS, sizeof *sb->prof_nr); /* NULL: no per-number rows */
        else memset(sb->prof_nr, 0, ZB_PROFILE_NRS * sizeof *sb->prof_nr);
    }
    sb->profile = on != 0;
}

void zb_sandbox_profile(zb_sandbox *sb, zb_syscall_profile *out) { *out = sb->prof; }

const char *zb_sandbox_syscall_name(uint64_t nr) { return zb_syscall_name(nr); }

int zb_sandbox_profile_syscalls(zb_sandbox *sb, zb_syscall_nr_profile *out, int max) {
    int n = 0;
    for (int i = 0; sb->prof_nr && i < ZB_PROFILE_NRS; i++) {
        if (!sb->prof_nr[i].calls) continue;
        if (n < max) { out[n] = sb->prof_nr[i]; out[n].nr = (uint64_t)i; }
        n++;
    }
    return n;
}

int zb_sandbox_exec(zb_sandbox *sb, const char *exe, const char *cwd, const char *const *argv,
                    const char *const *envp, char *err) {
    if (sb->proc.exe[0]) { zb_seterr(err, "this sandbox already runs a program"); return -1; }
    zb_resolved r;
    int rc = zb_fs_resolve(sb, "/", cwd && cwd[0] ? cwd : "/", 0, &r);
    if (rc < 0 || !r.exists || !r.loc.is_dir) {
        zb_seterr(err, "working directory %s is not a directory in the guest's view", cwd);
        return -1;
    }
    snprintf(sb->proc.cwd, sizeof sb->proc.cwd, "%s", r.path);
    return zb_elf_exec(sb, exe, argv, envp, err);
}

int zb_sandbox_push_input(zb_sandbox *sb, const void *data, size_t len, char *err) {
    if (zb_uart_push_input(&sb->uart, data, len) < 0) { zb_seterr(err, "out of memory queueing UART input"); return -1; }
    /* a thread of process 1 that yielded while it waited for input (its asyncio loop's poll of the
     * UART, with child processes in the family) may go on now: the family's scheduler must see it
     * as runnable, or it waits for a wake-up that never comes (zb_thread_retry_may_go_on) */
    zb_wake_gen++;
    return 0;
}

int zb_sandbox_raise(zb_sandbox *sb, int signo, char *err) {
    if (signo < 1 || signo > 64) { zb_seterr(err, "no signal %d", signo); return -1; }
    if (!zb_signal_has_handler(sb, signo)) {
        zb_seterr(err, "the guest has no handler for signal %d", signo);
        return -1;
    }
    sb->sig.pending |= 1ull << (signo - 1);
    zb_family *fam = sb->fam;
    if (fam && fam->m[0].sb == sb) { /* as a terminal's Ctrl-C: the whole foreground process group */
        for (int i = 1; i < fam->count; i++)
            if (fam->m[i].pgid == fam->m[0].pgid) zb_family_signal(fam, i, signo);
        zb_wake_gen++;
    }
    return 0;
}

int zb_sandbox_test_break_in_trap(zb_sandbox *sb, int vector, char *err) {
    if (vector < 0 || vector > ZB_BREAK_SYSCALL_ENTRY) { zb_seterr(err, "no exception vector %d", vector); return -1; }
    sb->test_break_vector = vector + 1;
    return 0;
}

int zb_sandbox_finished(zb_sandbox *sb) { return sb->finished; }

void zb_sandbox_stats(zb_sandbox *sb, zb_stats *out) {
    *out = sb->stats;
    uint64_t dirty = 0, words = (sb->mem.npages + 63) / 64;
    for (uint64_t i = 0; i < words; i++) dirty += (uint64_t)__builtin_popcountll(sb->mem.host_dirty[i]);
    out->dirty_pages = dirty;
    out->unchanged_finds = sb->mem.unchanged_finds;
    out->pages_reprotected = sb->mem.pages_reprotected;
    out->guest_pages = sb->mem.pages_allocated;
    out->guest_pages_limit = sb->mem.pages_limit;
    out->threads = (uint64_t)sb->threads.count;
    out->thread_switches = sb->threads.switches;
    out->family_pages = sb->mem.budget ? zb_mem_budget_total(sb->mem.budget) : zb_mem_charge(&sb->mem);
    out->family_pages_peak = sb->mem.budget ? sb->mem.budget->peak : 0;
    out->family_refusals = sb->mem.budget ? sb->mem.budget->refusals : 0;
    const zb_family *fam = sb->fam;
    if (fam) {
        out->proc_forks = fam->forks;
        out->proc_switches = fam->switches;
        out->proc_fork_ns = fam->fork_ns;
        out->proc_attaches = fam->attaches;
        out->proc_attach_ns = fam->attach_ns;
        out->proc_child_run_ns = fam->child_run_ns;
        out->proc_end_ns = fam->end_ns;
    }
}

size_t zb_sandbox_take_log(zb_sandbox *sb, char *buf, size_t len) {
    size_t n = ZB_MIN(len, sb->log_len);
    memcpy(buf, sb->log, n);
    memmove(sb->log, sb->log + n, sb->log_len - n);
    sb->log_len -= n;
    return n;
}

void zb_sandbox_free_state(zb_sandbox *sb) {
    if (sb->fs_borrowed) { /* a child process: its family's file system stays, with its counts right */
        zb_fdtable_free(sb->fds, sb->fs);
        zb_shmap_count_opens(&sb->mem, sb->fs, -1);
        sb->fds = NULL;
        sb->fs = NULL;
        sb->fs_borrowed = 0;
        return;
    }
    /* the fs goes away with the table: no open counts to keep (and no shared inode chunk to copy) */
    zb_fdtable_free(sb->fds, NULL);
    sb->fds = NULL;
    zb_fs_free(sb->fs);
    sb->fs = NULL;
}

/* zb_sandbox_free (snapshot.c) drops the base snapshot first; a sandbox that never had one (a
 * failed zb_sandbox_new) comes here directly. */
void zb_sandbox_destroy(zb_sandbox *sb) {
    if (!sb) return;
    zb_engine_forget(sb->engine, sb, &sb->mem);
    zb_sandbox_free_state(sb);
    zb_mem_destroy(&sb->mem);
    zb_uart_destroy(&sb->uart);
    zb_threads_free(&sb->threads);
    free(sb->cpu.xsave);
    free(sb->out_buf);
    free(sb->prof_nr);
    free(sb);
}
