/* kvm_vm.c - /dev/kvm, the executor VM, and moving a sandbox's vCPU state in and out of it.
 *
 * A sandbox is data; the engine owns one executor VM (one vCPU, one memslot, no irqchip, no PIT:
 * those make memslot changes ~7 ms and close ~16 ms on PVM hosts). Running a sandbox attaches it:
 * slot 0 is pointed at the sandbox's memory and its registers/XSAVE are loaded.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "sandbox_state.h"
#include "guest_abi.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MSR_IA32_TSC 0x10
#define MSR_STAR 0xc0000081
#define MSR_LSTAR 0xc0000082
#define MSR_SFMASK 0xc0000084
/* syscall: CS=0x08/SS=0x10 on entry; user CS=0x33/SS=0x2b (STAR[63:48]=0x20) */
#define STAR_VALUE 0x0020000800000000ull
#define SFMASK_VALUE 0x47700ull /* clear TF, IF, DF, NT, AC, IOPL on entry */

__thread volatile sig_atomic_t zb_kick_signal_seen;
volatile sig_atomic_t zb_outside_kick;

/* Tells the run loop that an EINTR came from the engine's own signal (a kick or its wake-up
 * timer), not from a signal the caller must see. A kick signal that is not the wake-up timer's
 * (si_code SI_TIMER) was sent by another process (the kernel's interrupt, kill -USR2): it is
 * remembered until a run loop or a sleeping syscall takes it, so that it ends the run even when it
 * lands while the guest sleeps (ppoll runs this handler, and nothing else would say why it woke). */
static void kick_handler(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)context;
    zb_kick_signal_seen = 1;
    if (!info || info->si_code != SI_TIMER) zb_outside_kick = 1;
}

static int install_kick_handler(char *err) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = kick_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO; /* no SA_RESTART: KVM_RUN and ppoll must return EINTR */
    if (sigaction(ZB_KICK_SIGNAL, &sa, NULL) < 0 || sigaction(ZB_WATCH_SIGNAL, &sa, NULL) < 0) {
        zb_seterr(err, "cannot install the engine's kick signal handler: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int zb_engine_watch_fd(int fd, int on) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return -1;
    if (on) {
        struct f_owner_ex owner = {F_OWNER_TID, (pid_t)syscall(SYS_gettid)}; /* the thread that runs sandboxes */
        if (fcntl(fd, F_SETOWN_EX, &owner) < 0 || fcntl(fd, F_SETSIG, ZB_WATCH_SIGNAL) < 0) return -1;
    }
    return fcntl(fd, F_SETFL, on ? flags | O_ASYNC : flags & ~O_ASYNC);
}

static int open_kvm(char *err) {
    int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (fd >= 0) return fd;
    if (errno == ENOENT)
        zb_seterr(err, "/dev/kvm does not exist: this machine offers no KVM. Enable hardware "
                       "virtualization (VT-x/AMD-V, or nested virtualization if this is a VM) and "
                       "load the kvm module (modprobe kvm_intel or kvm_amd), then try again.");
    else if (errno == EACCES || errno == EPERM)
        zb_seterr(err, "permission denied opening /dev/kvm: add your user to the 'kvm' group "
                       "(sudo usermod -aG kvm $USER, then log in again) or run as root.");
    else
        zb_seterr(err, "cannot open /dev/kvm: %s", strerror(errno));
    return -1;
}

/* 1 if /dev/kvm is PVM's: its module is loaded and neither hardware one is. Under PVM the guest's
 * `syscall` reaches LSTAR still at CPL3 (docs/DESIGN.md); under VMX/SVM at CPL0. Unsure: 0. */
static int kvm_is_pvm(void) {
    return access("/sys/module/kvm_pvm", F_OK) == 0 && access("/sys/module/kvm_intel", F_OK) != 0 &&
           access("/sys/module/kvm_amd", F_OK) != 0;
}

zb_engine *zb_engine_open(char *err) {
    zb_engine *e = calloc(1, sizeof *e);
    if (!e) { zb_seterr(err, "out of memory"); return NULL; }
    e->kvm_fd = open_kvm(err);
    if (e->kvm_fd < 0) goto fail;
    int api = ioctl(e->kvm_fd, KVM_GET_API_VERSION, 0);
    if (api != KVM_API_VERSION) {
        zb_seterr(err, "/dev/kvm speaks KVM API %d, the engine needs %d", api, KVM_API_VERSION);
        goto fail;
    }
    if (ioctl(e->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_IMMEDIATE_EXIT) <= 0 ||
        ioctl(e->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_XSAVE) <= 0) {
        zb_seterr(err, "this KVM lacks KVM_CAP_IMMEDIATE_EXIT or KVM_CAP_XSAVE (Linux >= 4.11 needed)");
        goto fail;
    }
    for (int n = 128; n <= 4096; n *= 2) {
        free(e->cpuid);
        e->cpuid = calloc(1, sizeof(struct kvm_cpuid2) + n * sizeof(struct kvm_cpuid_entry2));
        if (!e->cpuid) { zb_seterr(err, "out of memory"); goto fail; }
        e->cpuid->nent = n;
        if (ioctl(e->kvm_fd, KVM_GET_SUPPORTED_CPUID, e->cpuid) == 0) break;
        if (errno != E2BIG) { zb_seterr(err, "KVM_GET_SUPPORTED_CPUID: %s", strerror(errno)); goto fail; }
    }
    e->xcr0 = 0x7;
    for (unsigned i = 0; i < e->cpuid->nent; i++) {
        struct kvm_cpuid_entry2 *c = &e->cpuid->entries[i];
        if (c->function == 0xd && c->index == 0) e->xcr0 = c->eax | ((uint64_t)c->edx << 32);
    }
    /* AMX tile state (bits 17/18) needs a permission dance and KVM rejects it in XCR0 here. */
    e->xcr0 &= ~(3ull << 17);
    int runsz = ioctl(e->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, 0);
    if (runsz <= 0) { zb_seterr(err, "KVM_GET_VCPU_MMAP_SIZE: %s", strerror(errno)); goto fail; }
    e->vcpu_mmap_size = runsz;
    int xs2 = ioctl(e->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_XSAVE2);
    e->have_xsave2 = xs2 > 0;
    e->xsave_size = ZB_MAX((size_t)(xs2 > 0 ? xs2 : 0), sizeof(struct kvm_xsave));
    if (install_kick_handler(err) < 0) goto fail;
    e->entry_runs_at_cpl3 = kvm_is_pvm();
    return e;
fail:
    zb_engine_close(e);
    return NULL;
}

static uint64_t fnv(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

uint64_t zb_engine_fingerprint(zb_engine *e) {
    /* The CPU features that decide which code glibc, CPython and numpy pick (and so what a
     * template's memory holds): vendor, leaf 1/7/0xD/0x80000001 feature bits, XSAVE layout.
     * Per-CPU fields (APIC ids, cache topology) vary between calls and stay out. */
    uint64_t h = 1469598103934665603ull;
    for (unsigned i = 0; i < e->cpuid->nent; i++) {
        const struct kvm_cpuid_entry2 *c = &e->cpuid->entries[i];
        switch (c->function) {
        case 0: h = fnv(fnv(h, c->ebx), ((uint64_t)c->edx << 32) | c->ecx); break;
        case 1: case 0x80000001: h = fnv(fnv(h, c->function), ((uint64_t)c->edx << 32) | c->ecx); break;
        case 7: case 0xd:
            h = fnv(fnv(h, ((uint64_t)c->function << 32) | c->index), ((uint64_t)c->ebx << 32) | c->eax);
            h = fnv(h, ((uint64_t)c->edx << 32) | c->ecx);
            break;
        }
    }
    return fnv(fnv(h, e->xsave_size), e->xcr0);
}

void zb_engine_destroy(zb_engine *e) {
    if (!e) return;
    if (e->vm) zb_vm_destroy(e->vm);
    for (int i = 0; i < ZB_CHILD_VMS; i++) if (e->child_vms[i]) zb_vm_destroy(e->child_vms[i]);
    zb_net_free(e->net);
    if (e->kvm_fd >= 0 && e->kvm_fd != 0) close(e->kvm_fd);
    free(e->cpuid);
    free(e);
}

/* The engine's seccomp lockdown (seccomp.c): socket calls only for a session with a network policy. */
int zb_engine_lockdown(zb_engine *e, int phase, char *err) {
    return zb_seccomp_lockdown(phase, e->net != NULL, err);
}

static int set_msrs(zb_vm *vm, uint64_t lstar, char *err) {
    struct {
        struct kvm_msrs h;
        struct kvm_msr_entry e[3];
    } m;
    memset(&m, 0, sizeof m);
    m.h.nmsrs = 3;
    m.e[0].index = MSR_STAR; m.e[0].data = STAR_VALUE;
    m.e[1].index = MSR_LSTAR; m.e[1].data = lstar;
    m.e[2].index = MSR_SFMASK; m.e[2].data = SFMASK_VALUE;
    int n = ioctl(vm->vcpu_fd, KVM_SET_MSRS, &m);
    if (n != 3) {
        zb_seterr(err, "KVM_SET_MSRS(STAR/LSTAR/SFMASK) set %d of 3: %s", n, strerror(errno));
        return -1;
    }
    return 0;
}

static uint64_t read_guest_tsc_msr(zb_vm *vm) {
    struct {
        struct kvm_msrs h;
        struct kvm_msr_entry e[1];
    } m;
    memset(&m, 0, sizeof m);
    m.h.nmsrs = 1;
    m.e[0].index = MSR_IA32_TSC;
    return ioctl(vm->vcpu_fd, KVM_GET_MSRS, &m) == 1 ? m.e[0].data : 0;
}

/* The vCPU's TSC offset, if KVM says it (Linux 5.16) and its own readings of the guest's TSC agree:
 * each must lie between the host TSC read before and after it, plus the offset. That holds while
 * the vCPU's TSC is not scaled (this engine never sets KVM_SET_TSC_KHZ) and KVM does not move the
 * offset, which it does only when the guest writes its TSC (no guest here runs at CPL0) or when the
 * host's TSC is unstable (a host whose clocksource is not the TSC: checked too). 1 if known. */
static int learn_tsc_offset(zb_vm *vm, int64_t *offset) {
    char source[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
    if (f) {
        if (!fgets(source, sizeof source, f)) source[0] = 0;
        fclose(f);
    }
    if (strcmp(source, "tsc\n")) return 0;
    int64_t off = 0;
    struct kvm_device_attr attr = {.group = KVM_VCPU_TSC_CTRL, .attr = KVM_VCPU_TSC_OFFSET,
                                   .addr = (uint64_t)(uintptr_t)&off};
    if (ioctl(vm->vcpu_fd, KVM_GET_DEVICE_ATTR, &attr) < 0) return 0;
    for (int i = 0; i < 3; i++) {
        uint64_t before = __builtin_ia32_rdtsc() + (uint64_t)off;
        uint64_t guest = read_guest_tsc_msr(vm);
        uint64_t after = __builtin_ia32_rdtsc() + (uint64_t)off;
        if (!guest || (int64_t)(guest - before) < 0 || (int64_t)(after - guest) < 0) return 0;
    }
    *offset = off;
    return 1;
}

int zb_vm_create(zb_engine *e, zb_vm **out, char *err) {
    zb_vm *vm = calloc(1, sizeof *vm);
    if (!vm) { zb_seterr(err, "out of memory"); return -1; }
    vm->vm_fd = vm->vcpu_fd = -1;
    vm->vm_fd = ioctl(e->kvm_fd, KVM_CREATE_VM, 0);
    if (vm->vm_fd < 0) { zb_seterr(err, "KVM_CREATE_VM: %s", strerror(errno)); goto fail; }
    /* Manual dirty-log protection: pages a cell writes stay writable across the snapshot after it
     * (each later first write would otherwise cost a write-protect fault, ~20 us on the nested test
     * host, for the ~1,000 pages every IPython cell rewrites); the snapshot finds out by comparison
     * whether they changed, and page_reprotect.c decides when to protect them again. Optional:
     * without it, reading the log re-protects every page. */
    if (ioctl(vm->vm_fd, KVM_CHECK_EXTENSION, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2) & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE) {
        struct kvm_enable_cap cap;
        memset(&cap, 0, sizeof cap);
        cap.cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2;
        cap.args[0] = KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE;
        vm->manual_protect = ioctl(vm->vm_fd, KVM_ENABLE_CAP, &cap) == 0;
    }
    vm->vcpu_fd = ioctl(vm->vm_fd, KVM_CREATE_VCPU, 0);
    if (vm->vcpu_fd < 0) { zb_seterr(err, "KVM_CREATE_VCPU: %s", strerror(errno)); goto fail; }
    vm->run_size = e->vcpu_mmap_size;
    vm->run = mmap(NULL, vm->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, vm->vcpu_fd, 0);
    if (vm->run == MAP_FAILED) { vm->run = NULL; zb_seterr(err, "mmap kvm_run: %s", strerror(errno)); goto fail; }
    if (ioctl(vm->vcpu_fd, KVM_SET_CPUID2, e->cpuid) < 0) {
        zb_seterr(err, "KVM_SET_CPUID2: %s", strerror(errno));
        goto fail;
    }
    if (ioctl(e->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_XCRS) > 0) {
        struct kvm_xcrs x;
        memset(&x, 0, sizeof x);
        x.nr_xcrs = 1;
        x.xcrs[0].xcr = 0;
        x.xcrs[0].value = e->xcr0;
        if (ioctl(vm->vcpu_fd, KVM_SET_XCRS, &x) < 0) {
            x.xcrs[0].value = e->xcr0 = 0x7; /* x87|SSE|AVX is accepted everywhere */
            if (ioctl(vm->vcpu_fd, KVM_SET_XCRS, &x) < 0) {
                zb_seterr(err, "KVM_SET_XCRS: %s", strerror(errno));
                goto fail;
            }
        }
    }
    if (zb_vm_apply_syscall_path(vm, e, err) < 0) goto fail;
    long khz = ioctl(vm->vcpu_fd, KVM_GET_TSC_KHZ, 0);
    vm->tsc_khz = khz > 0 ? (uint64_t)khz : 0;
    vm->tsc_offset_known = learn_tsc_offset(vm, &vm->tsc_offset);
    *out = vm;
    return 0;
fail:
    zb_vm_destroy(vm);
    return -1;
}

void zb_vm_destroy(zb_vm *vm) {
    if (!vm) return;
    zb_mem_destroy(&vm->parked); /* normally given back before (zb_engine_close): a no-op then */
    if (vm->run) munmap(vm->run, vm->run_size);
    if (vm->vcpu_fd >= 0) close(vm->vcpu_fd);
    if (vm->vm_fd >= 0) close(vm->vm_fd);
    free(vm);
}

static int slot_region(zb_vm *vm, int i, const zb_memory *m, char *err) {
    const struct zb_memslot *sl = &vm->slot[i];
    struct kvm_userspace_memory_region r;
    memset(&r, 0, sizeof r);
    r.slot = (uint32_t)i;
    r.flags = sl->logged ? KVM_MEM_LOG_DIRTY_PAGES : 0; /* the snapshot's page-level change set */
    r.guest_phys_addr = sl->first_pfn * ZB_PAGE;
    r.memory_size = sl->npages * ZB_PAGE;
    r.userspace_addr = (uint64_t)(uintptr_t)(m->host + sl->first_pfn * ZB_PAGE);
    if (ioctl(vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &r) < 0) {
        zb_seterr(err, "KVM_SET_USER_MEMORY_REGION(slot %d, %llu MiB, flags %u): %s", i,
                  (unsigned long long)(r.memory_size >> 20), r.flags, strerror(errno));
        return -1;
    }
    return 0;
}

/* Memory m as memslots (into out, at most ZB_MAX_MEMSLOTS; returns how many): below its unlogged
 * window, each part of the window as the memory wishes it logged or not, above it. */
static int slot_layout(const zb_memory *m, struct zb_memslot *out) {
    uint64_t lo = m->unlogged_lo / ZB_PAGE, hi = m->unlogged_hi / ZB_PAGE;
    int n = 0;
    if (lo < hi && m->window_parts + 2 <= ZB_MAX_MEMSLOTS) {
        out[n++] = (struct zb_memslot){0, lo, 1, -1};
        for (uint32_t k = 0; k < m->window_parts; k++) {
            uint64_t first = lo + (uint64_t)k * m->window_part_pages;
            out[n++] = (struct zb_memslot){first, ZB_MIN(m->window_part_pages, hi - first), m->window_logged[k], (int)k};
        }
        if (hi < m->npages) out[n++] = (struct zb_memslot){hi, m->npages - hi, 1, -1};
    } else {
        out[n++] = (struct zb_memslot){0, m->npages, 1, -1};
    }
    return n;
}

/* Replace the VM's memslots with those of memory m (none if m is NULL). A slot's host address
 * cannot change: delete, then add. KVM drops its shadow page tables of the old ones. */
static int set_slots(zb_vm *vm, const zb_memory *m, char *err) {
    struct kvm_userspace_memory_region r;
    vm->slots_host = NULL;
    for (int i = 0; i < vm->nslots; i++) {
        memset(&r, 0, sizeof r);
        r.slot = (uint32_t)i; /* memory_size 0: delete */
        if (ioctl(vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &r) < 0) {
            zb_seterr(err, "KVM_SET_USER_MEMORY_REGION(delete slot %d): %s", i, strerror(errno));
            return -1;
        }
    }
    vm->nslots = 0;
    if (!m) return 0;
    int n = slot_layout(m, vm->slot);
    for (int i = 0; i < n; i++) {
        if (slot_region(vm, i, m, err) < 0) return -1;
        vm->nslots = i + 1;
    }
    vm->slots_host = m->host;
    return 0;
}

/* The memslots already map memory m, slot for slot (whether each is logged may differ: the
 * attach's zb_vm_sync_window makes that so). */
static int slots_map(const zb_vm *vm, const zb_memory *m) {
    if (!m->host || vm->slots_host != m->host) return 0;
    struct zb_memslot want[ZB_MAX_MEMSLOTS];
    int n = slot_layout(m, want);
    if (n != vm->nslots) return 0;
    for (int i = 0; i < n; i++)
        if (want[i].first_pfn != vm->slot[i].first_pfn || want[i].npages != vm->slot[i].npages ||
            want[i].part != vm->slot[i].part)
            return 0;
    return 1;
}

/* Read slot i's dirty log into bits (a whole-memory bitmap) and, unless keep_writable, write-protect
 * what it read again. */
static int slot_log(zb_vm *vm, int i, uint64_t *bits, int keep_writable, char *err) {
    const struct zb_memslot *sl = &vm->slot[i];
    struct kvm_dirty_log log;
    memset(&log, 0, sizeof log);
    log.slot = (uint32_t)i;
    log.dirty_bitmap = bits + sl->first_pfn / 64; /* slots start 2 MiB aligned: whole words */
    if (ioctl(vm->vm_fd, KVM_GET_DIRTY_LOG, &log) < 0) {
        zb_seterr(err, "KVM_GET_DIRTY_LOG(slot %d): %s", i, strerror(errno));
        return -1;
    }
    if (keep_writable || !vm->manual_protect) return 0;
    struct kvm_clear_dirty_log clear;
    memset(&clear, 0, sizeof clear);
    clear.slot = (uint32_t)i;
    clear.num_pages = (uint32_t)sl->npages;
    clear.dirty_bitmap = bits + sl->first_pfn / 64;
    if (ioctl(vm->vm_fd, KVM_CLEAR_DIRTY_LOG, &clear) < 0) {
        zb_seterr(err, "KVM_CLEAR_DIRTY_LOG(slot %d): %s", i, strerror(errno));
        return -1;
    }
    return 0;
}

void zb_vm_sync_window(zb_vm *vm, zb_sandbox *sb, int just_snapshotted) {
    if (!vm || vm->attached != sb) return;
    zb_memory *m = &sb->mem;
    char ignored[ZB_ERRLEN];
    for (int i = 0; i < vm->nslots; i++) {
        struct zb_memslot *sl = &vm->slot[i];
        if (sl->part < 0 || (uint32_t)sl->part >= m->window_parts || sl->logged == m->window_logged[sl->part]) continue;
        if (sl->logged) {
            /* what the log holds goes to host_dirty before the log goes away (KVM overwrites the
             * bitmap it is given: read into a zeroed one, then merge) */
            uint64_t words = (m->npages + 63) / 64, *bits = calloc(words, sizeof *bits);
            if (!bits || slot_log(vm, i, bits, 1, ignored) < 0) { free(bits); continue; }
            for (uint64_t w = sl->first_pfn / 64; w < (sl->first_pfn + sl->npages) / 64; w++) m->host_dirty[w] |= bits[w];
            free(bits);
        } else if (!just_snapshotted) {
            zb_mem_populated(m, sl->first_pfn, sl->npages, m->host_dirty);
        }
        sl->logged = !sl->logged;
        if (slot_region(vm, i, m, ignored) < 0) {
            sl->logged = !sl->logged;  /* KVM kept the old flags */
            if (!sl->logged) zb_mem_populated(m, sl->first_pfn, sl->npages, m->host_dirty);
        }
    }
}

int zb_vm_load_xsave(zb_vm *vm, zb_sandbox *sb, char *err) {
    /* with KVM_CAP_XSAVE2, KVM_SET_XSAVE takes the larger buffer as is */
    if (ioctl(vm->vcpu_fd, KVM_SET_XSAVE, sb->cpu.xsave) < 0) {
        zb_seterr(err, "KVM_SET_XSAVE: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int zb_vm_save_xsave(zb_vm *vm, zb_sandbox *sb, char *err) {
    unsigned long req = sb->engine->have_xsave2 ? KVM_GET_XSAVE2 : KVM_GET_XSAVE;
    if (ioctl(vm->vcpu_fd, req, sb->cpu.xsave) < 0) {
        zb_seterr(err, "KVM_GET_XSAVE: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static int sync_regs_supported(zb_engine *e) {
    const int want = KVM_SYNC_X86_REGS | KVM_SYNC_X86_SREGS;
    int have = ioctl(e->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_SYNC_REGS);
    return have > 0 && (have & want) == want;
}

/* The entry's answers in the guest: asked for, with the direct entry, and only where the entry
 * runs at CPL3 (on VMX it runs at CPL0, and its `jmp *%rcx` would run user code at CPL0). */
static int guest_answers(const zb_engine *e) {
    return e->entry_runs_at_cpl3 && !(e->syscall_path_off & (ZB_SYSCALLS_GUEST_ANSWERS | ZB_SYSCALLS_DIRECT_ENTRY));
}

int zb_vm_apply_syscall_path(zb_vm *vm, zb_engine *e, char *err) {
    vm->guest_answers = guest_answers(e);
    vm->site_rewrite = !(e->syscall_path_off & ZB_SYSCALLS_SITE_REWRITE);
    if (zb_vm_flush_user_state(vm) < 0) { zb_seterr(err, "KVM_SET_SREGS/REGS: %s", strerror(errno)); return -1; }
    vm->sync_regs = !(e->syscall_path_off & ZB_SYSCALLS_SYNC_REGS) && sync_regs_supported(e);
    vm->run->kvm_valid_regs = vm->sync_regs ? KVM_SYNC_X86_REGS : 0; /* the exit copies regs only: sregs cost more */
    return set_msrs(vm, (e->syscall_path_off & ZB_SYSCALLS_DIRECT_ENTRY) ? ZB_SYSCALL_TRAP : ZB_SYSCALL_ENTRY, err);
}

int zb_engine_set_syscall_path(zb_engine *e, int flags) {
    char err[ZB_ERRLEN];
    e->syscall_path_off = (ZB_SYSCALLS_SYNC_REGS | ZB_SYSCALLS_DIRECT_ENTRY | ZB_SYSCALLS_GUEST_ANSWERS | ZB_SYSCALLS_SITE_REWRITE) & ~flags;
    if (e->vm && zb_vm_apply_syscall_path(e->vm, e, err) < 0) return -1;
    for (int i = 0; i < ZB_CHILD_VMS; i++)
        if (e->child_vms[i] && zb_vm_apply_syscall_path(e->child_vms[i], e, err) < 0) return -1;
    int sync = e->vm ? e->vm->sync_regs : sync_regs_supported(e) && (flags & ZB_SYSCALLS_SYNC_REGS);
    return (sync ? ZB_SYSCALLS_SYNC_REGS : 0) | (flags & ZB_SYSCALLS_DIRECT_ENTRY) |
           (guest_answers(e) ? ZB_SYSCALLS_GUEST_ANSWERS : 0) | (flags & ZB_SYSCALLS_SITE_REWRITE);
}

int zb_vm_exit_regs(zb_vm *vm, struct kvm_regs *out) {
    if (vm->sync_regs) {
        *out = vm->run->s.regs.regs;
        return 0;
    }
    return ioctl(vm->vcpu_fd, KVM_GET_REGS, out) < 0 ? -1 : 0;
}

int zb_vm_set_user_state(zb_vm *vm, const struct kvm_regs *regs, const struct kvm_sregs *sregs) {
    if (vm->sync_regs) {
        vm->run->s.regs.regs = *regs;
        vm->run->s.regs.sregs = *sregs;
        vm->run->kvm_dirty_regs = KVM_SYNC_X86_REGS | KVM_SYNC_X86_SREGS;
        return 0;
    }
    if (ioctl(vm->vcpu_fd, KVM_SET_SREGS, sregs) < 0 || ioctl(vm->vcpu_fd, KVM_SET_REGS, regs) < 0) return -1;
    return 0;
}

int zb_vm_flush_user_state(zb_vm *vm) {
    if (!vm->run || !vm->run->kvm_dirty_regs) return 0; /* KVM_RUN clears the bits it applied */
    uint64_t dirty = vm->run->kvm_dirty_regs;
    vm->run->kvm_dirty_regs = 0;
    if ((dirty & KVM_SYNC_X86_SREGS) && ioctl(vm->vcpu_fd, KVM_SET_SREGS, &vm->run->s.regs.sregs) < 0) return -1;
    if ((dirty & KVM_SYNC_X86_REGS) && ioctl(vm->vcpu_fd, KVM_SET_REGS, &vm->run->s.regs.regs) < 0) return -1;
    return 0;
}

int zb_vm_load_cpu(zb_vm *vm, zb_sandbox *sb, char *err) {
    struct kvm_sregs s;
    vm->user_sregs_valid = 0;
    vm->run->kvm_dirty_regs = 0; /* whatever the previous sandbox left for the next entry is replaced */
    if (ioctl(vm->vcpu_fd, KVM_GET_SREGS, &s) < 0) { zb_seterr(err, "KVM_GET_SREGS: %s", strerror(errno)); return -1; }
    zb_layout_user_sregs(&sb->mem, &s, sb->cpu.fs_base, sb->cpu.gs_base);
    if (ioctl(vm->vcpu_fd, KVM_SET_SREGS, &s) < 0) { zb_seterr(err, "KVM_SET_SREGS: %s", strerror(errno)); return -1; }
    if (zb_vm_load_xsave(vm, sb, err) < 0) return -1;
    if (ioctl(vm->vcpu_fd, KVM_SET_REGS, &sb->cpu.regs) < 0) { zb_seterr(err, "KVM_SET_REGS: %s", strerror(errno)); return -1; }
    return 0;
}

int zb_vm_load_thread(zb_vm *vm, zb_sandbox *sb, char *err) {
    if (vm->attached != sb) return zb_vm_load_cpu(vm, sb, err);
    if (zb_vm_load_xsave(vm, sb, err) < 0) return -1;
    if (!vm->user_sregs_valid) { /* the fields outside the user template: read once, as set_user_state does */
        if (ioctl(vm->vcpu_fd, KVM_GET_SREGS, &vm->user_sregs) < 0) { zb_seterr(err, "KVM_GET_SREGS: %s", strerror(errno)); return -1; }
        vm->user_sregs_valid = 1;
    }
    struct kvm_sregs s = vm->user_sregs;
    zb_layout_user_sregs(&sb->mem, &s, sb->cpu.fs_base, sb->cpu.gs_base);
    if (zb_vm_set_user_state(vm, &sb->cpu.regs, &s) < 0) { zb_seterr(err, "KVM_SET_SREGS/REGS: %s", strerror(errno)); return -1; }
    return 0;
}

zb_vm *zb_vm_of(const zb_sandbox *sb) {
    zb_engine *e = sb->engine;
    for (int i = 0; i < ZB_CHILD_VMS; i++)
        if (e->child_vms[i] && e->child_vms[i]->attached == sb) return e->child_vms[i];
    return e->vm;
}

static zb_vm **child_executor(zb_engine *e, const zb_sandbox *sb) {
    zb_vm **idle = NULL, **reserved = NULL, **empty = NULL, **oldest = NULL;
    for (int i = 0; i < ZB_CHILD_VMS; i++) {
        zb_vm **v = &e->child_vms[i];
        if (!*v) { if (!empty) empty = v; continue; }
        if ((*v)->attached == sb) return v;
        if (!(*v)->attached) {
            /* its memslots map sb's memory (a parked memory the fork took): KVM's shadow pages are warm */
            if ((*v)->slots_host && (*v)->slots_host == sb->mem.host) return v;
            /* memslots that map another process's memory that the fork took (it has not run yet)
             * are its warm ones: used only when there is no other idle VM and no VM to create */
            int taken = (*v)->slots_host && (*v)->slots_host != (*v)->parked.host;
            if (taken && !reserved) reserved = v;
            if (!taken && !idle) idle = v;
        }
        if (!oldest || (*v)->last_used < (*oldest)->last_used) oldest = v;
    }
    return idle ? idle : empty ? empty : reserved ? reserved : oldest;
}

zb_vm *zb_engine_executor(zb_engine *e, zb_sandbox *sb, int is_child, char *err) {
    zb_vm **slot = is_child ? child_executor(e, sb) : &e->vm;
    if (!*slot && zb_vm_create(e, slot, err) < 0) return NULL;
    if (is_child) (*slot)->last_used = ++e->executor_runs;
    /* it ran on another executor before (as the other kind, or displaced from a child's) */
    zb_vm *other = zb_vm_of(sb);
    if (other && other != *slot && other->attached == sb && zb_vm_detach(other, err) < 0) return NULL;
    return *slot;
}

int zb_vm_attach(zb_vm *vm, zb_sandbox *sb, char *err) {
    if (vm->attached == sb) return 0;
    if (vm->attached && zb_vm_detach(vm, err) < 0) return -1;
    /* Memslots that already map this memory are kept, and with them KVM's shadow page tables of
     * it. That is safe: since they were last attached, nothing ran on them, and the host's changes
     * of the memory went through its own mapping, which KVM follows (MMU notifiers); its dirty log
     * still holds what the guest wrote, for the next collection. */
    if (!slots_map(vm, &sb->mem) && set_slots(vm, &sb->mem, err) < 0) return -1;
    if (zb_vm_load_cpu(vm, sb, err) < 0) return -1;
    vm->attached = sb;
    zb_vm_sync_window(vm, sb, 0); /* parts whose logging the memory wants changed meanwhile */
    return 0;
}

int zb_vm_protect_pages(zb_vm *vm, uint64_t *pages, char *err) {
    if (!vm->attached || !vm->manual_protect) return 0;
    for (int i = 0; i < vm->nslots; i++) {
        const struct zb_memslot *sl = &vm->slot[i];
        if (!sl->logged) continue;
        struct kvm_clear_dirty_log clear;
        memset(&clear, 0, sizeof clear);
        clear.slot = (uint32_t)i;
        clear.first_page = 0;
        clear.num_pages = (uint32_t)sl->npages;
        clear.dirty_bitmap = pages + sl->first_pfn / 64; /* slots start 2 MiB aligned: whole words */
        if (ioctl(vm->vm_fd, KVM_CLEAR_DIRTY_LOG, &clear) < 0) {
            zb_seterr(err, "KVM_CLEAR_DIRTY_LOG(slot %d): %s", i, strerror(errno));
            return -1;
        }
    }
    return 0;
}

int zb_vm_collect_dirty(zb_vm *vm, int keep_writable, char *err) {
    zb_sandbox *sb = vm->attached;
    if (!sb || !vm->nslots) return 0;
    size_t words = (sb->mem.npages + 63) / 64;
    uint64_t *bits = calloc(words, sizeof(uint64_t));
    if (!bits) { zb_seterr(err, "out of memory"); return -1; }
    int rc = 0;
    for (int i = 0; i < vm->nslots && rc == 0; i++) {
        const struct zb_memslot *sl = &vm->slot[i];
        if (sl->logged) { rc = slot_log(vm, i, bits, keep_writable, err); continue; }
        /* no log: what the host populated, in one scan for a run of adjacent unlogged slots (the
         * window's empty parts stay unlogged: a scan per part was 12 ioctls per collection) */
        uint64_t end = sl->first_pfn + sl->npages;
        while (i + 1 < vm->nslots && !vm->slot[i + 1].logged && vm->slot[i + 1].first_pfn == end)
            end += vm->slot[++i].npages;
        zb_mem_populated(&sb->mem, sl->first_pfn, end - sl->first_pfn, bits);
    }
    if (rc == 0)
        for (size_t i = 0; i < words; i++) sb->mem.host_dirty[i] |= bits[i];
    free(bits);
    return rc < 0 ? -1 : 0;
}

int zb_vm_detach(zb_vm *vm, char *err) {
    zb_sandbox *sb = vm->attached;
    if (!sb) return 0;
    if (zb_vm_collect_dirty(vm, 0, err) < 0) return -1;
    if (!sb->finished && zb_vm_save_xsave(vm, sb, err) < 0) return -1;
    vm->attached = NULL;
    return 0;
}

static void forget(zb_vm *vm, const zb_sandbox *sb, const zb_memory *m) {
    if (!vm) return;
    if (vm->attached && (vm->attached == sb || (m->host && vm->attached->mem.host == m->host))) vm->attached = NULL;
    if (!m->host) return;
    char ignored[ZB_ERRLEN];
    /* if deleting fails the slots stay counted and the next attach replaces them; slots_host is
     * NULL from the first step on, so nothing takes them for this memory's successor */
    if (vm->slots_host == m->host) (void)set_slots(vm, NULL, ignored);
}

void zb_engine_forget(zb_engine *e, const zb_sandbox *sb, const zb_memory *m) {
    forget(e->vm, sb, m);
    for (int i = 0; i < ZB_CHILD_VMS; i++) forget(e->child_vms[i], sb, m);
}

static int vcpu_stat(zb_vm *vm, const char *name, uint64_t *value) {
    int fd = ioctl(vm->vcpu_fd, KVM_GET_STATS_FD, 0);
    if (fd < 0) return -1;
    int rc = -1;
    struct kvm_stats_header h;
    if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.name_size > 0 && h.name_size < 4096 && h.num_desc < 4096) {
        size_t dsz = sizeof(struct kvm_stats_desc) + h.name_size;
        uint8_t *d = malloc(dsz * h.num_desc);
        if (d && pread(fd, d, dsz * h.num_desc, h.desc_offset) == (ssize_t)(dsz * h.num_desc)) {
            for (uint32_t i = 0; i < h.num_desc; i++) {
                struct kvm_stats_desc *k = (struct kvm_stats_desc *)(d + i * dsz);
                if (k->size == 1 && !strncmp(k->name, name, h.name_size) &&
                    pread(fd, value, 8, h.data_offset + k->offset) == 8) {
                    rc = 0;
                    break;
                }
            }
        }
        free(d);
    }
    close(fd);
    return rc;
}

uint64_t zb_vm_guest_tsc(zb_vm *vm) {
    return vm->tsc_offset_known ? __builtin_ia32_rdtsc() + (uint64_t)vm->tsc_offset : read_guest_tsc_msr(vm);
}

/* Summed over the executors (process 1's and the children's). */
int zb_engine_vcpu_stat(zb_engine *e, const char *name, uint64_t *value) {
    uint64_t sum = 0, v = 0;
    if (!e->vm || vcpu_stat(e->vm, name, &sum) < 0) return -1;
    for (int i = 0; i < ZB_CHILD_VMS; i++) {
        if (!e->child_vms[i]) continue;
        if (vcpu_stat(e->child_vms[i], name, &v) < 0) return -1;
        sum += v;
    }
    *value = sum;
    return 0;
}
