/* mac.c - GMAC (AES-256-GCM with associated data only) through OpenSSL's EVP interface (zeroboot.h says why). */
#include "util.h"
#include "zeroboot.h"

#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>

struct zb_mac {
    EVP_CIPHER_CTX *ctx;
    int failed;
};

static EVP_CIPHER *gcm;
static pthread_once_t gcm_once = PTHREAD_ONCE_INIT;

static void fetch_gcm(void) { gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL); }

int zb_mac_prepare(char *err) {
    pthread_once(&gcm_once, fetch_gcm);
    if (!gcm) { zb_seterr(err, "OpenSSL's libcrypto has no AES-256-GCM cipher (needed for the spill file's MAC)"); return -1; }
    return 0;
}

zb_mac *zb_mac_begin(const uint8_t *key, size_t key_len, const uint8_t *nonce, size_t nonce_len, char *err) {
    if (zb_mac_prepare(err) < 0) return NULL;
    if (key_len != ZB_MAC_KEY_BYTES || nonce_len != ZB_MAC_NONCE_BYTES) {
        zb_seterr(err, "a MAC needs a %d-byte key and a %d-byte nonce", ZB_MAC_KEY_BYTES, ZB_MAC_NONCE_BYTES);
        return NULL;
    }
    zb_mac *m = calloc(1, sizeof *m);
    if (m) m->ctx = EVP_CIPHER_CTX_new();
    if (!m || !m->ctx || EVP_EncryptInit_ex(m->ctx, gcm, NULL, key, nonce) != 1) {
        zb_mac_abandon(m);
        zb_seterr(err, "cannot start a MAC (OpenSSL refused the key or nonce)");
        return NULL;
    }
    return m;
}

int zb_mac_update(zb_mac *m, const uint8_t *p, size_t n) {
    while (!m->failed && n > 0) { /* EVP takes an int length */
        int part = n > INT_MAX / 2 ? INT_MAX / 2 : (int)n, outl = 0;
        if (EVP_EncryptUpdate(m->ctx, NULL, &outl, p, part) != 1) m->failed = 1;
        p += part;
        n -= (size_t)part;
    }
    return m->failed ? -1 : 0;
}

int zb_mac_end(zb_mac *m, uint8_t *tag, size_t tag_len, char *err) {
    uint8_t full[ZB_MAC_TAG_BYTES];
    int outl = 0;
    int ok = !m->failed && tag_len <= ZB_MAC_TAG_BYTES && EVP_EncryptFinal_ex(m->ctx, full, &outl) == 1 &&
             EVP_CIPHER_CTX_ctrl(m->ctx, EVP_CTRL_GCM_GET_TAG, ZB_MAC_TAG_BYTES, full) == 1;
    zb_mac_abandon(m);
    if (!ok) { zb_seterr(err, "cannot compute the MAC (OpenSSL failed, or a tag longer than %d bytes)", ZB_MAC_TAG_BYTES); return -1; }
    memcpy(tag, full, tag_len);
    return 0;
}

void zb_mac_abandon(zb_mac *m) {
    if (!m) return;
    EVP_CIPHER_CTX_free(m->ctx);
    free(m);
}
