/* AES-128-GCM tags and ciphertext through the system's libcrypto (never a hand-written
 * primitive), and the replay window of wire/auth.py. A cache of contexts per thread. */
#include "dlc.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdlib.h>
#include <string.h>

/* A context keeps its key schedule and GHASH tables (expanding a key costs far more than
 * tagging a small packet), so each thread caches one context per key and direction:
 * direct-mapped by the key's bytes; a packet then only sets its nonce. */
#define CACHE 64
typedef struct { uint8_t key[16]; int used; EVP_CIPHER_CTX *ctx; } cached;
struct dlc_crypto { cached enc[CACHE], dec[CACHE]; };

static unsigned slot_of(const uint8_t key[16]) {
    uint32_t h;
    memcpy(&h, key, 4);      /* keys are HKDF output: their bytes are uniform */
    return h % CACHE;
}

/* The context for key, its nonce set (the key only if the slot held another key). */
static EVP_CIPHER_CTX *keyed(cached *table, int encrypt, const uint8_t key[16],
                             const uint8_t nonce[12]) {
    cached *c = &table[slot_of(key)];
    int same = c->used && memcmp(c->key, key, 16) == 0;
    int ok = encrypt ? EVP_EncryptInit_ex(c->ctx, NULL, NULL, same ? NULL : key, nonce)
                     : EVP_DecryptInit_ex(c->ctx, NULL, NULL, same ? NULL : key, nonce);
    if (ok != 1) { c->used = 0; return NULL; }
    if (!same) { memcpy(c->key, key, 16); c->used = 1; }
    return c->ctx;
}

dlc_crypto *dlc_crypto_new(void) {
    dlc_crypto *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    for (int i = 0; i < CACHE; i++) {
        c->enc[i].ctx = EVP_CIPHER_CTX_new();
        c->dec[i].ctx = EVP_CIPHER_CTX_new();
        if (!c->enc[i].ctx || !c->dec[i].ctx ||
            EVP_EncryptInit_ex(c->enc[i].ctx, EVP_aes_128_gcm(), NULL, NULL, NULL) != 1 ||
            EVP_DecryptInit_ex(c->dec[i].ctx, EVP_aes_128_gcm(), NULL, NULL, NULL) != 1) {
            dlc_crypto_free(c);
            return NULL;
        }
    }
    return c;
}

void dlc_crypto_free(dlc_crypto *c) {
    if (!c) return;
    for (int i = 0; i < CACHE; i++) {
        EVP_CIPHER_CTX_free(c->enc[i].ctx);
        EVP_CIPHER_CTX_free(c->dec[i].ctx);
    }
    free(c);
}

/* The tag as a parameter of the cipher: straight to the provider (the ctrl interface
 * translates through a table of names for every packet). */
static OSSL_PARAM *tag_param(uint8_t tag[16]) {
    static _Thread_local OSSL_PARAM p[2];
    p[0] = OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, tag, DLC_TAG);
    p[1] = OSSL_PARAM_construct_end();
    return p;
}

static void nonce_of(uint8_t nonce[12], uint32_t stream, uint64_t counter) {
    memcpy(nonce, &stream, 4);     /* "<IQ": little-endian (this code runs on x86-64/arm64) */
    memcpy(nonce + 4, &counter, 8);
}

int dlc_seal(dlc_crypto *c, const uint8_t key[16], int mode, uint32_t stream, uint64_t counter,
             const uint8_t *buf, size_t len, uint8_t *out, uint8_t tag[16]) {
    uint8_t nonce[12];
    int n = 0;
    nonce_of(nonce, stream, counter);
    EVP_CIPHER_CTX *e = keyed(c->enc, 1, key, nonce);
    if (!e) return -1;
    if (mode == AUTH_MAC) {
        if (EVP_EncryptUpdate(e, NULL, &n, buf, (int)len) != 1) return -1;
    } else {
        if (EVP_EncryptUpdate(e, NULL, &n, buf, DLC_HDR) != 1) return -1;
        if (len > DLC_HDR &&
            EVP_EncryptUpdate(e, out + DLC_HDR, &n, buf + DLC_HDR, (int)(len - DLC_HDR)) != 1)
            return -1;
    }
    if (EVP_EncryptFinal_ex(e, out + len, &n) != 1) return -1;
    return EVP_CIPHER_CTX_get_params(e, tag_param(tag)) == 1 ? 0 : -1;
}

int dlc_open(dlc_crypto *c, const uint8_t key[16], int mode, uint32_t stream, uint64_t counter,
             const uint8_t *buf, size_t len, uint8_t *plain) {
    uint8_t nonce[12], tag[DLC_TAG];
    int n = 0;
    if (len < DLC_HDR + DLC_TAG) return -1;
    size_t body = len - DLC_TAG;
    memcpy(tag, buf + body, DLC_TAG);
    nonce_of(nonce, stream, counter);
    EVP_CIPHER_CTX *d = keyed(c->dec, 0, key, nonce);
    if (!d) return -1;
    if (mode == AUTH_MAC) {
        if (EVP_DecryptUpdate(d, NULL, &n, buf, (int)body) != 1) return -1;
    } else {
        if (EVP_DecryptUpdate(d, NULL, &n, buf, DLC_HDR) != 1) return -1;
        if (body > DLC_HDR &&
            EVP_DecryptUpdate(d, plain, &n, buf + DLC_HDR, (int)(body - DLC_HDR)) != 1)
            return -1;
    }
    if (EVP_CIPHER_CTX_set_params(d, tag_param(tag)) != 1) return -1;
    return EVP_DecryptFinal_ex(d, plain ? plain + (body - DLC_HDR) : tag, &n) == 1 ? 0 : -1;
}

/* IPsec's window: a counter is accepted once, and only within DLC_WINDOW_BITS of the highest. */
int dlc_window_accept(dlc_window *w, uint64_t counter) {
    const uint64_t size = DLC_WINDOW_BITS;
    if (!w->any || counter > w->highest) {
        if (!w->any || counter - w->highest >= size) {
            memset(w->bits, 0, sizeof w->bits);
        } else {
            for (uint64_t c = w->highest + 1; c < counter; c++)
                w->bits[(c % size) / 64] &= ~(1ull << (c % 64));
        }
        w->bits[(counter % size) / 64] |= 1ull << (counter % 64);
        w->highest = counter;
        w->any = 1;
        return 1;
    }
    uint64_t age = w->highest - counter;
    if (age >= size) return 0;
    uint64_t *word = &w->bits[(counter % size) / 64], bit = 1ull << (counter % 64);
    if (*word & bit) return 0;
    *word |= bit;
    return 1;
}
