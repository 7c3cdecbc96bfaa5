/* uart16550.c - COM1 as a 16550A, and the guest<->host frame channel that runs over it.
 *
 * Two ways in, one device: a polled driver can use the registers byte by byte (port I/O from
 * CPL3 is allowed for 0x3f8-0x3ff only, through the TSS I/O bitmap), and the guest agent uses
 * read()/write() on /dev/ttyS0, which the engine serves straight from/to guest memory: a whole
 * frame per exit instead of one exit per byte (`rep outsb` would cost ~20 us per byte here).
 * Both feed the same frame assembler; see zeroboot.h for the frame format.
 */
#include "util.h"
#include "dev.h"
#include "serial.h"

#define REG_DATA 0 /* RBR/THR, DLL when DLAB */
#define REG_IER 1  /* DLM when DLAB */
#define REG_IIR 2  /* FCR on write */
#define REG_LCR 3
#define REG_MCR 4
#define REG_LSR 5
#define REG_MSR 6
#define REG_SCR 7
#define LCR_DLAB 0x80
#define MCR_LOOP 0x10
#define LSR_DR 0x01
#define LSR_OE 0x02
/* A 16550A's receive FIFO: in loopback mode (MCR bit 4) what the guest transmits is received back,
 * and, as on the chip, bytes beyond a full FIFO are lost (overrun, LSR bit 1). The engine's receive
 * buffer otherwise only holds what the host queued, so the guest cannot grow it. */
#define RX_FIFO 16
#define LSR_THRE 0x20
#define LSR_TEMT 0x40

void zb_uart_init(zb_uart *u) {
    memset(u, 0, sizeof *u);
    u->lcr = 0x03; /* 8N1 */
    u->dll = 0x01; /* 115200 baud */
}

void zb_uart_destroy(zb_uart *u) {
    free(u->rx);
    free(u->tx);
    memset(u, 0, sizeof *u);
}

static int reserve(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    uint8_t *nb = realloc(*buf, c);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

int zb_uart_clone(zb_uart *dst, const zb_uart *src) {
    *dst = *src;
    dst->rx = dst->tx = NULL;
    dst->rx_cap = dst->tx_cap = 0;
    size_t unread = src->rx_len - src->rx_pos;
    if (reserve(&dst->rx, &dst->rx_cap, unread) < 0 || reserve(&dst->tx, &dst->tx_cap, src->tx_len) < 0) {
        zb_uart_destroy(dst);
        return -1;
    }
    if (unread) memcpy(dst->rx, src->rx + src->rx_pos, unread);
    if (src->tx_len) memcpy(dst->tx, src->tx, src->tx_len);
    dst->rx_len = unread;
    dst->rx_pos = 0;
    return 0;
}

/* On disk: the seven registers, the unread input, the frame being assembled (and how much of it
 * is a complete frame handed out as an event) and the overrun flag. */
void zb_uart_save(const zb_uart *u, struct zb_out *o) {
    const uint8_t regs[7] = {u->ier, u->lcr, u->mcr, u->scr, u->dll, u->dlm, u->fcr};
    for (int i = 0; i < 7; i++) out_u8(o, regs[i]);
    size_t unread = u->rx_len - u->rx_pos;
    out_u64(o, unread);
    if (unread) out_bytes(o, u->rx + u->rx_pos, unread);
    out_u64(o, u->tx_len);
    out_bytes(o, u->tx, u->tx_len);
    out_u64(o, u->frame_ready);
    out_u8(o, u->overrun ? 1 : 0);
}

int zb_uart_load(zb_uart *u, struct zb_in *in, char *err) {
    zb_uart_init(u);
    uint8_t *const regs[7] = {&u->ier, &u->lcr, &u->mcr, &u->scr, &u->dll, &u->dlm, &u->fcr};
    for (int i = 0; i < 7; i++) *regs[i] = in_u8(in);
    /* the host queues at most one request frame's payload at a time; the guest's half-written
     * frame is at most one frame */
    uint64_t rx = in_count(in, ZB_FRAME_MAX_PAYLOAD);
    if (!in->err && rx && !(u->rx = malloc(rx))) goto oom;
    in_bytes(in, u->rx, rx);
    u->rx_len = u->rx_cap = rx;
    uint64_t tx = in_count(in, ZB_FRAME_HEADER + (uint64_t)ZB_FRAME_MAX_PAYLOAD);
    if (!in->err && tx && !(u->tx = malloc(tx))) goto oom;
    in_bytes(in, u->tx, tx);
    u->tx_len = u->tx_cap = tx;
    u->frame_ready = in_u64(in);
    uint8_t overrun = in_u8(in);
    if (in->err || u->frame_ready > tx || overrun > 1) {
        zb_uart_destroy(u);
        zb_uart_init(u);
        zb_seterr(err, "UART state: truncated, or buffers beyond a frame's size");
        return -1;
    }
    u->overrun = overrun;
    return 0;
oom:
    zb_uart_destroy(u);
    zb_uart_init(u);
    zb_seterr(err, "out of memory");
    return -1;
}

int zb_uart_push_input(zb_uart *u, const void *data, size_t len) {
    if (!len) return 0; /* (rx may still be NULL: no pointer arithmetic on it) */
    if (u->rx_pos && u->rx_pos == u->rx_len) u->rx_pos = u->rx_len = 0;
    if (u->rx_pos > (1u << 20)) { /* compact once a lot has been read */
        memmove(u->rx, u->rx + u->rx_pos, u->rx_len - u->rx_pos);
        u->rx_len -= u->rx_pos;
        u->rx_pos = 0;
    }
    if (reserve(&u->rx, &u->rx_cap, u->rx_len + len) < 0) return -1;
    memcpy(u->rx + u->rx_len, data, len);
    u->rx_len += len;
    return 0;
}

size_t zb_uart_rx_available(const zb_uart *u) { return u->rx_len - u->rx_pos; }

size_t zb_uart_read(zb_uart *u, void *buf, size_t len) {
    size_t n = ZB_MIN(len, zb_uart_rx_available(u));
    if (!n) return 0; /* nothing queued: rx may be NULL (a guest reading the data port before any
                         input), and NULL + 0 and memcpy from NULL are undefined behaviour */
    memcpy(buf, u->rx + u->rx_pos, n);
    u->rx_pos += n;
    return n;
}

int zb_frame_check(const uint8_t *buf, size_t len, size_t *total, char *err) {
    uint8_t hdr[ZB_FRAME_HEADER];
    uint32_t magic = ZB_FRAME_MAGIC;
    uint16_t version = ZB_FRAME_VERSION;
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &version, 2);
    /* reject garbage as soon as the first wrong byte of magic/version arrives */
    for (size_t i = 0; i < ZB_MIN(len, 6); i++) {
        if (buf[i] != hdr[i]) {
            zb_seterr(err, i < 4 ? "bad frame magic (byte %zu is 0x%02x)" : "unsupported frame version (byte %zu is 0x%02x)",
                      i, buf[i]);
            return -1;
        }
    }
    if (len < ZB_FRAME_HEADER) return 0;
    uint32_t length;
    memcpy(&length, buf + 8, 4);
    if (length > ZB_FRAME_MAX_PAYLOAD) {
        zb_seterr(err, "frame payload of %u bytes exceeds the %u byte maximum", length, (unsigned)ZB_FRAME_MAX_PAYLOAD);
        return -1;
    }
    *total = ZB_FRAME_HEADER + (size_t)length;
    return len >= *total;
}

long zb_uart_write(zb_uart *u, const uint8_t *data, size_t len, char *err) {
    size_t used = 0;
    while (used < len && !u->frame_ready) {
        size_t total = 0, want;
        int st = zb_frame_check(u->tx, u->tx_len, &total, err);
        if (st < 0) return -1;
        want = u->tx_len < ZB_FRAME_HEADER ? ZB_FRAME_HEADER - u->tx_len : total - u->tx_len;
        size_t n = ZB_MIN(want, len - used);
        if (reserve(&u->tx, &u->tx_cap, u->tx_len + n) < 0) { zb_seterr(err, "out of memory"); return -1; }
        memcpy(u->tx + u->tx_len, data + used, n);
        u->tx_len += n;
        used += n;
        st = zb_frame_check(u->tx, u->tx_len, &total, err);
        if (st < 0) return -1;
        if (st == 1) u->frame_ready = total;
    }
    return (long)used;
}

/* The run loop calls this once the caller has seen the FRAME event. */
void zb_uart_consume_frame(zb_uart *u) {
    if (!u->frame_ready) return;
    memmove(u->tx, u->tx + u->frame_ready, u->tx_len - u->frame_ready);
    u->tx_len -= u->frame_ready;
    u->frame_ready = 0;
}

int zb_uart_port_out(zb_uart *u, unsigned offset, uint8_t value, char *err) {
    int dlab = u->lcr & LCR_DLAB;
    switch (offset) {
    case REG_DATA:
        if (dlab) { u->dll = value; return 0; }
        if (u->mcr & MCR_LOOP) {
            if (zb_uart_rx_available(u) >= RX_FIFO) { u->overrun = 1; return 0; }
            return zb_uart_push_input(u, &value, 1);
        }
        return zb_uart_write(u, &value, 1, err) < 0 ? -1 : 0;
    case REG_IER:
        if (dlab) u->dlm = value;
        else u->ier = value & 0x0f;
        return 0;
    case REG_IIR:
        u->fcr = value;
        if (value & 0x02) u->rx_pos = u->rx_len = 0; /* clear receive FIFO */
        if ((value & 0x04) && !u->frame_ready) u->tx_len = 0; /* clear transmit FIFO */
        return 0;
    case REG_LCR: u->lcr = value; return 0;
    case REG_MCR: u->mcr = value & 0x1f; return 0;
    case REG_SCR: u->scr = value; return 0;
    default: return 0; /* LSR/MSR are read-only */
    }
}

uint8_t zb_uart_port_in(zb_uart *u, unsigned offset) {
    int dlab = u->lcr & LCR_DLAB;
    switch (offset) {
    case REG_DATA: {
        if (dlab) return u->dll;
        uint8_t b = 0;
        zb_uart_read(u, &b, 1);
        return b;
    }
    case REG_IER: return dlab ? u->dlm : u->ier;
    case REG_IIR: {
        uint8_t fifo = (u->fcr & 1) ? 0xc0 : 0;
        if ((u->ier & 1) && zb_uart_rx_available(u)) return fifo | 0x04; /* data available */
        if (u->ier & 2) return fifo | 0x02;                            /* THR empty */
        return fifo | 0x01;                                             /* nothing pending */
    }
    case REG_LCR: return u->lcr;
    case REG_MCR: return u->mcr;
    case REG_LSR: {
        uint8_t lsr = (zb_uart_rx_available(u) ? LSR_DR : 0) | (u->overrun ? LSR_OE : 0) | LSR_THRE | LSR_TEMT;
        u->overrun = 0; /* reading LSR clears the error bits */
        return lsr;
    }
    case REG_MSR:
        if (u->mcr & MCR_LOOP) /* loopback: DTR->DSR, RTS->CTS, OUT1->RI, OUT2->DCD */
            return (uint8_t)(((u->mcr & 1) << 5) | ((u->mcr & 2) << 3) | ((u->mcr & 4) << 4) | ((u->mcr & 8) << 4));
        return 0xb0; /* DCD, DSR, CTS */
    case REG_SCR: return u->scr;
    }
    return 0xff;
}
