/* guest_layout.c - the guest's low 2 MiB: page tables, GDT, IDT, TSS and the CPL0 entry stubs.
 *
 * Guest virtual == guest physical. The page tables map all guest memory with 2 MiB leaves (the
 * first 2 MiB with 4 KiB pages) and are written once, before the first run, and never edited: a
 * shadow-paged KVM (PVM) does not see host edits of present entries. The first 2 MiB are
 * supervisor-only, so user code cannot read or write these structures (and a NULL dereference
 * faults), except the syscall entry page (ZB_SYSCALL_ENTRY), which user code may read and execute
 * but nobody may write, and the page after it, the deferred close's slot (ZB_ENTRY_CLOSE_SLOT),
 * which user code may read and write: the host takes nothing from it but a checked fd and a
 * bounded position, and the entry's read buffer (ZB_ENTRY_READ_BUF) and dispositions
 * (ZB_ENTRY_SIG_DATA), which user code may read.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "guest_abi.h"

#define PML4_GPA 0x1000ul
#define PDPT_GPA 0x2000ul
#define GDT_GPA 0x3000ul
#define IDT_GPA 0x4000ul
#define TSS_GPA 0x5000ul
#define TSS_SIZE 0x68ul
#define IOMAP_BYTES (8192ul + 1) /* one bit per port, then the mandatory 0xff byte */
#define XSTACK_TOP 0xc000ul    /* exception stack (IST1 and RSP0): 0x9000-0xc000 */
#define LOWPT_GPA 0xd000ul     /* the page table of the low 2 MiB (4 KiB pages) */
#define PD_GPA 0x10000ul       /* one page directory per GiB, up to ZB_MEM_MAX */
_Static_assert(ZB_SYSCALL_ENTRY % 4096 == 0 && ZB_SYSCALL_ENTRY > XSTACK_TOP && ZB_SYSCALL_ENTRY < PD_GPA &&
               ZB_SYSCALL_ENTRY != LOWPT_GPA, "the syscall entry page must be a free page of its own");
_Static_assert(ZB_ENTRY_CLOSE_SLOT == ZB_SYSCALL_ENTRY + 4096 && ZB_ENTRY_CLOSE_SLOT < PD_GPA,
               "the close slot must be the free page right after the entry");
_Static_assert(ZB_ENTRY_READ_SAVE + 16 <= ZB_ENTRY_CLOSE_SLOT + 4096, "the read block's slots are in the close slot's page");
_Static_assert(ZB_ENTRY_READ_BUF % 4096 == 0 && ZB_ENTRY_READ_BUF >= PD_GPA + (ZB_MEM_MAX >> 30) * 4096,
               "the read buffer must be free pages past the page directories");

#define PTE_P 0x1ull
#define PTE_RW 0x2ull
#define PTE_US 0x4ull
#define PTE_PS 0x80ull
#define PTE_NX (1ull << 63)

#define SEL_KCODE 0x08
#define SEL_UDATA 0x2b
#define SEL_UCODE 0x33
#define SEL_TSS 0x40

extern const unsigned char zb_cpl0_stubs[];
extern const unsigned long zb_cpl0_stubs_len;

uint64_t zb_layout_stub_addr(int vector) { return ZB_STUBS_GPA + ZB_STUB_SIZE * (uint64_t)(unsigned)vector; }
uint64_t zb_layout_exception_stack_top(void) { return XSTACK_TOP; }

static void write_page_tables(zb_memory *m) {
    uint64_t *pml4 = (uint64_t *)(m->host + PML4_GPA);
    uint64_t *pdpt = (uint64_t *)(m->host + PDPT_GPA);
    pml4[0] = PDPT_GPA | PTE_P | PTE_RW | PTE_US;
    uint64_t gib = m->size >> 30;
    if (m->size & ((1ul << 30) - 1)) gib++;
    for (uint64_t g = 0; g < gib; g++) {
        uint64_t *pd = (uint64_t *)(m->host + PD_GPA + g * ZB_PAGE);
        pdpt[g] = (PD_GPA + g * ZB_PAGE) | PTE_P | PTE_RW | PTE_US;
        for (uint64_t i = 0; i < 512; i++) {
            uint64_t gpa = (g << 30) + (i << 21);
            if (gpa >= m->size) break;
            pd[i] = gpa | PTE_P | PTE_RW | PTE_PS | (gpa < ZB_LOW_REGION ? 0 : PTE_US);
        }
    }
    /* the low 2 MiB in 4 KiB pages: supervisor read-write, but the syscall entry page */
    _Static_assert(ZB_LOW_REGION == 2ul << 20, "the low region is the first 2 MiB leaf");
    uint64_t *pt = (uint64_t *)(m->host + LOWPT_GPA);
    for (uint64_t i = 0; i < 512; i++) pt[i] = (i << 12) | PTE_P | PTE_RW;
    pt[ZB_SYSCALL_ENTRY >> 12] = ZB_SYSCALL_ENTRY | PTE_P | PTE_US; /* user read/execute, no write (CR0.WP) */
    /* the deferred close's slot: user read-write, so the entry's user-mode code can store to it;
     * data only (EFER.NXE) */
    pt[ZB_ENTRY_CLOSE_SLOT >> 12] = ZB_ENTRY_CLOSE_SLOT | PTE_P | PTE_RW | PTE_US | PTE_NX;
    /* the entry's read buffer: the bytes of a file the guest opened, user read-only data */
    for (uint64_t a = ZB_ENTRY_READ_BUF; a < ZB_ENTRY_READ_BUF + ZB_ENTRY_READ_BYTES; a += ZB_PAGE)
        pt[a >> 12] = a | PTE_P | PTE_US | PTE_NX;
    /* the dispositions the entry's rt_sigaction query copies: user read-only data */
    pt[ZB_ENTRY_SIG_DATA >> 12] = ZB_ENTRY_SIG_DATA | PTE_P | PTE_US | PTE_NX;
    ((uint64_t *)(m->host + PD_GPA))[0] = LOWPT_GPA | PTE_P | PTE_RW | PTE_US;
}

static uint64_t seg_desc(uint32_t flags_access) {
    /* base 0, limit 0xfffff; flags_access = access byte | flags nibble << 12 */
    uint64_t access = flags_access & 0xff, flags = (flags_access >> 12) & 0xf;
    return 0xffffull | (access << 40) | (0xfull << 48) | (flags << 52);
}

static void write_gdt_idt_tss(zb_memory *m) {
    uint64_t *gdt = (uint64_t *)(m->host + GDT_GPA);
    gdt[1] = seg_desc(0x9b | 0xa << 12);  /* 0x08 kernel code, 64-bit */
    gdt[2] = seg_desc(0x93 | 0xc << 12);  /* 0x10 kernel data */
    gdt[5] = seg_desc(0xf3 | 0xc << 12);  /* 0x28 user data (selector 0x2b) */
    gdt[6] = seg_desc(0xfb | 0xa << 12);  /* 0x30 user code, 64-bit (selector 0x33) */
    uint64_t base = TSS_GPA, limit = TSS_SIZE + IOMAP_BYTES - 1;
    gdt[8] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89ull << 40) |
             (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    gdt[9] = base >> 32;

    uint8_t *tss = m->host + TSS_GPA;
    memcpy(tss + 4, &(uint64_t){XSTACK_TOP}, 8);       /* RSP0 */
    memcpy(tss + 0x24, &(uint64_t){XSTACK_TOP}, 8);    /* IST1 */
    memcpy(tss + 0x66, &(uint16_t){TSS_SIZE}, 2);      /* I/O map base */
    uint8_t *iomap = tss + TSS_SIZE;
    memset(iomap, 0xff, IOMAP_BYTES);                  /* every port denied at CPL3 ... */
    for (unsigned p = ZB_UART_BASE; p < ZB_UART_BASE + ZB_UART_PORTS; p++)
        iomap[p / 8] &= ~(1u << (p % 8));              /* ... except COM1 */
    iomap[ZB_PORT_SYSCALL / 8] &= ~(1u << (ZB_PORT_SYSCALL % 8)); /* and the syscall entry's (PVM runs it at CPL3) */

    uint8_t *idt = m->host + IDT_GPA;
    for (int v = 0; v < ZB_STUB_VECTORS; v++) {
        uint64_t h = zb_layout_stub_addr(v);
        uint8_t *g = idt + v * 16;
        int dpl = (v == 3 || v == 4) ? 3 : 0; /* int3/into are allowed from user mode */
        memset(g, 0, 16);
        memcpy(g, &(uint16_t){h & 0xffff}, 2);
        memcpy(g + 2, &(uint16_t){SEL_KCODE}, 2);
        g[4] = 1;                             /* IST1: never push onto the user's stack */
        g[5] = 0x8e | (dpl << 5);             /* present 64-bit interrupt gate */
        memcpy(g + 6, &(uint16_t){(h >> 16) & 0xffff}, 2);
        memcpy(g + 8, &(uint32_t){h >> 32}, 4);
    }
    /* the stubs, then the syscall entry on its own page (bounded by the blob: the fuzzers link a
     * one-byte stand-in) */
    unsigned long n = zb_cpl0_stubs_len;
    memcpy(m->host + ZB_STUBS_GPA, zb_cpl0_stubs, ZB_MIN(n, (unsigned long)ZB_SYSCALL_ENTRY_OFFSET));
    if (n > ZB_SYSCALL_ENTRY_OFFSET)
        memcpy(m->host + ZB_SYSCALL_ENTRY, zb_cpl0_stubs + ZB_SYSCALL_ENTRY_OFFSET, ZB_MIN(n - ZB_SYSCALL_ENTRY_OFFSET, ZB_PAGE));
}

void zb_layout_entry_answers(zb_memory *m, int on, const struct zb_entry_data *data) {
    struct zb_entry_data d;
    if (on) d = *data;
    else {
        memset(&d, 0, sizeof d);
        d.read_fd = -1; /* the read block's registers after a fault (zb_layout_entry_read_saved) */
    }
    d.on = on ? ZB_ENTRY_ANSWERS_ON : 0;
    uint8_t *at = m->host + ZB_SYSCALL_ENTRY + ZB_ENTRY_DATA;
    if (!memcmp(at, &d, sizeof d)) return; /* unchanged: the page stays shared with the snapshot */
    memcpy(at, &d, sizeof d);
    zb_mem_dirty(m, ZB_SYSCALL_ENTRY + ZB_ENTRY_DATA, sizeof d);
}

void zb_layout_entry_sigactions(zb_memory *m, const struct zb_entry_sigactions *acts) {
    uint8_t *at = m->host + ZB_ENTRY_SIG_DATA;
    if (!memcmp(at, acts, sizeof *acts)) return; /* unchanged: the page stays shared with the snapshot */
    memcpy(at, acts, sizeof *acts);
    zb_mem_dirty(m, ZB_ENTRY_SIG_DATA, sizeof *acts);
}

int zb_layout_take_deferred_close(zb_memory *m) {
    int32_t fd;
    uint8_t *at = m->host + ZB_ENTRY_CLOSE_SLOT;
    memcpy(&fd, at, sizeof fd);
    if (fd == ZB_ENTRY_CLOSE_NONE) return -1;
    const int32_t none = ZB_ENTRY_CLOSE_NONE;
    memcpy(at, &none, sizeof none);
    zb_mem_dirty(m, ZB_ENTRY_CLOSE_SLOT, sizeof none);
    return fd < 0 ? -1 : fd;
}

uint8_t *zb_layout_entry_read_buffer(zb_memory *m) { return m->host + ZB_ENTRY_READ_BUF; }

static void entry_read_pos_clear(zb_memory *m) {
    const uint32_t zero = 0;
    memcpy(m->host + ZB_ENTRY_READ_POS, &zero, sizeof zero);
    zb_mem_dirty(m, ZB_ENTRY_READ_POS, sizeof zero);
}

void zb_layout_entry_read_filled(zb_memory *m, uint32_t n) {
    zb_mem_dirty(m, ZB_ENTRY_READ_BUF, ZB_MIN(n, (uint32_t)ZB_ENTRY_READ_BYTES));
    entry_read_pos_clear(m);
}

uint32_t zb_layout_take_entry_read(zb_memory *m) {
    uint32_t pos;
    memcpy(&pos, m->host + ZB_ENTRY_READ_POS, sizeof pos);
    if (pos) entry_read_pos_clear(m);
    return pos;
}

void zb_layout_entry_read_saved(const zb_memory *m, struct kvm_regs *r) {
    memcpy(&r->rsi, m->host + ZB_ENTRY_READ_SAVE, 8);
    memcpy(&r->rcx, m->host + ZB_ENTRY_READ_SAVE + 8, 8);
    int32_t fd;
    memcpy(&fd, m->host + ZB_SYSCALL_ENTRY + ZB_ENTRY_DATA + offsetof(struct zb_entry_data, read_fd), sizeof fd);
    r->rdi = (uint64_t)(int64_t)fd;
}

void zb_layout_write(zb_memory *m) {
    uint64_t used = PD_GPA + ZB_PAGE * ((m->size + (1ul << 30) - 1) >> 30);
    memset(m->host, 0, used);
    write_page_tables(m);
    write_gdt_idt_tss(m);
    const int32_t none = ZB_ENTRY_CLOSE_NONE; /* no close waits */
    memcpy(m->host + ZB_ENTRY_CLOSE_SLOT, &none, sizeof none);
    zb_mem_dirty(m, 0, used); /* part of every snapshot of this sandbox */
}

void zb_layout_user_sregs(const zb_memory *m, struct kvm_sregs *s, uint64_t fs_base, uint64_t gs_base) {
    (void)m;
    struct kvm_segment data = {.base = 0, .limit = 0xffffffff, .selector = SEL_UDATA, .type = 3,
                               .present = 1, .dpl = 3, .db = 1, .s = 1, .l = 0, .g = 1};
    struct kvm_segment code = data;
    code.selector = SEL_UCODE;
    code.type = 11;
    code.l = 1;
    code.db = 0;
    s->cs = code;
    s->ss = s->ds = s->es = s->fs = s->gs = data;
    s->fs.base = fs_base;
    s->gs.base = gs_base;
    struct kvm_segment tr = {.base = TSS_GPA, .limit = TSS_SIZE + IOMAP_BYTES - 1, .selector = SEL_TSS,
                             .type = 11, .present = 1, .dpl = 0, .s = 0, .g = 0};
    s->tr = tr;
    s->ldt.unusable = 1;
    s->gdt.base = GDT_GPA;
    s->gdt.limit = 10 * 8 - 1;
    s->idt.base = IDT_GPA;
    s->idt.limit = 32 * 16 - 1;
    s->cr0 = 0x80050033;  /* PG WP NE ET MP PE */
    s->cr3 = PML4_GPA;
    s->cr4 = 0x40620;     /* OSXSAVE OSXMMEXCPT OSFXSR PAE */
    s->efer = 0xd01;      /* NXE LMA LME SCE */
}
