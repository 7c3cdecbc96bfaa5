/* vdso.c - placing the guest vDSO (guest/vdso.c, embedded at build time) and keeping its clock
 * data current. The data page sits right below the image; the host rewrites it whenever the
 * sandbox starts running, so forks of an old snapshot see the current time.
 */
#include "engine.h"

#include <sys/ioctl.h>
#include <time.h>

#define MSR_IA32_TSC 0x10

extern const unsigned char zb_vdso_image[];
extern const unsigned long zb_vdso_image_len;

struct zb_vdso_data { /* keep in sync with guest/vdso.c */
    uint64_t tsc0, mult;
    int64_t mono_ns, real_ns, boot_ns;
    int64_t raw_ns;           /* CLOCK_MONOTONIC_RAW: not slewed by NTP, so its own base */
    uint64_t generation;      /* bumped by every rewrite: a guest reader stopped mid-read retries */
};

uint64_t zb_vdso_load(zb_sandbox *sb, char *err) {
    uint64_t len = ZB_PAGE + ZB_PAGE_UP(zb_vdso_image_len);
    uint64_t at = zb_mem_alloc(&sb->mem, len);
    if (!at) { zb_seterr(err, "no guest memory left for the vDSO"); return 0; }
    zb_mem_mark(&sb->mem, at, len, 1);
    memcpy(sb->mem.host + at + ZB_PAGE, zb_vdso_image, zb_vdso_image_len);
    zb_mem_dirty(&sb->mem, at, len);
    zb_region_add(&sb->mem, at, at + ZB_PAGE, 1, "[vvar]");
    zb_region_add(&sb->mem, at + ZB_PAGE, at + len, 5, "[vdso]");
    sb->vdso_data = at;
    return at + ZB_PAGE;
}

static int64_t clock_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void zb_vdso_refresh(zb_sandbox *sb, zb_vm *vm) {
    if (!sb->vdso_data) return;
    struct zb_vdso_data d;
    memset(&d, 0, sizeof d);
    struct {
        struct kvm_msrs h;
        struct kvm_msr_entry e[1];
    } m;
    memset(&m, 0, sizeof m);
    m.h.nmsrs = 1;
    m.e[0].index = MSR_IA32_TSC;
    /* the guest's TSC (on VMX it carries an offset from the host's) */
    if (vm->tsc_khz && ioctl(vm->vcpu_fd, KVM_GET_MSRS, &m) == 1) {
        d.tsc0 = m.e[0].data;
        d.mult = (uint64_t)(((unsigned __int128)1000000 << 32) / vm->tsc_khz);
    }
    d.mono_ns = clock_ns(CLOCK_MONOTONIC);
    d.real_ns = clock_ns(CLOCK_REALTIME);
    d.boot_ns = clock_ns(CLOCK_BOOTTIME);
    d.raw_ns = clock_ns(CLOCK_MONOTONIC_RAW);
    struct zb_vdso_data *page = (struct zb_vdso_data *)(sb->mem.host + sb->vdso_data);
    d.generation = page->generation + 1;
    memcpy(page, &d, sizeof d);
    zb_mem_dirty(&sb->mem, sb->vdso_data, sizeof d);
}
