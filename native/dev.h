/* dev.h - the device layer: COM1 and the frame assembler (uart16550.c), and the vDSO's placement
 * and its clock data page (vdso_page.c).
 */
#ifndef ZB_DEV_H
#define ZB_DEV_H
#include "vm.h"

struct zb_out; /* serial.h: the snapshot state writer and reader */
struct zb_in;
/* ---- the UART (uart16550.c) ---- */
typedef struct zb_uart {
    uint8_t ier, lcr, mcr, scr, dll, dlm, fcr;
    uint8_t *rx;             /* host -> guest bytes, rx[rx_pos..rx_len) unread */
    size_t rx_len, rx_pos, rx_cap;
    uint8_t *tx;             /* guest -> host bytes of the frame being assembled */
    size_t tx_len, tx_cap;
    size_t frame_ready;      /* bytes of a complete frame at tx[0..] handed out as an event */
    int overrun;             /* loopback bytes were lost to a full receive FIFO (LSR OE) */
} zb_uart;

void zb_uart_init(zb_uart *u);
void zb_uart_destroy(zb_uart *u);
int zb_uart_clone(zb_uart *dst, const zb_uart *src);
void zb_uart_save(const zb_uart *u, struct zb_out *o);
int zb_uart_load(zb_uart *u, struct zb_in *in, char *err);
int zb_uart_push_input(zb_uart *u, const void *data, size_t len);
size_t zb_uart_rx_available(const zb_uart *u);
size_t zb_uart_read(zb_uart *u, void *buf, size_t len);
/* Feed guest bytes into the frame assembler. Returns bytes consumed (stops after a complete
 * frame), or -1 with a message for a malformed frame. */
long zb_uart_write(zb_uart *u, const uint8_t *data, size_t len, char *err);
/* Port access from a CPL3 polled driver. Returns 0, or -1 with err for a malformed frame. */
void zb_uart_consume_frame(zb_uart *u);
int zb_uart_port_out(zb_uart *u, unsigned offset, uint8_t value, char *err);
uint8_t zb_uart_port_in(zb_uart *u, unsigned offset);
/* Frame parsing, also used by the fuzzer: 1 = complete frame of *total bytes, 0 = need more,
 * -1 = malformed (err). */
int zb_frame_check(const uint8_t *buf, size_t len, size_t *total, char *err);

/* ---- the vDSO's placement and data page (vdso_page.c) ---- */
/* Place the vDSO (data page + library) in free guest memory: the library's address, or 0. */
uint64_t zb_vdso_load(zb_sandbox *sb, char *err);
/* Bytes the data page, the library and the stubbed syscall sites' page take. */
uint64_t zb_vdso_size(void);
/* The stubbed syscall sites' page (guest_abi.h), right after the library, or 0 if the sandbox has
 * none or the process unmapped or replaced it. */
#define ZB_SITE_STUBS_NAME "[syscall stubs]"
uint64_t zb_vdso_site_stubs(zb_sandbox *sb);
/* exec: keep the vDSO where it is (its data page stays current) with a fresh copy of the library
 * and its regions named again; the library's address, or 0 if the sandbox has none. */
uint64_t zb_vdso_keep(zb_sandbox *sb);
void zb_vdso_refresh(zb_sandbox *sb, zb_vm *vm);
/* The run stopped: record the latest monotonic times the guest can have read (proc.clock_floor). */
void zb_vdso_note_stop(zb_sandbox *sb, zb_vm *vm);

#endif
