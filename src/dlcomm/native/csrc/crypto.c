/* AES-128-GCM tags and ciphertext through the system's libcrypto (never a hand-written
 * primitive), and the replay window of wire/auth.py. A context per thread: the key and
 * nonce are set per packet (the key schedule costs about as much as one block). */
#include "dlc.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

struct dlc_crypto { EVP_CIPHER_CTX *enc, *dec; };

dlc_crypto *dlc_crypto_new(void) {
    dlc_crypto *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->enc = EVP_CIPHER_CTX_new();
    c->dec = EVP_CIPHER_CTX_new();
    if (!c->enc || !c->dec ||
        EVP_EncryptInit_ex(c->enc, EVP_aes_128_gcm(), NULL, NULL, NULL) != 1 ||
        EVP_DecryptInit_ex(c->dec, EVP_aes_128_gcm(), NULL, NULL, NULL) != 1) {
        dlc_crypto_free(c);
        return NULL;
    }
    return c;
}

void dlc_crypto_free(dlc_crypto *c) {
    if (!c) return;
    EVP_CIPHER_CTX_free(c->enc);
    EVP_CIPHER_CTX_free(c->dec);
    free(c);
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
    if (EVP_EncryptInit_ex(c->enc, NULL, NULL, key, nonce) != 1) return -1;
    if (mode == AUTH_MAC) {
        if (EVP_EncryptUpdate(c->enc, NULL, &n, buf, (int)len) != 1) return -1;
    } else {
        if (EVP_EncryptUpdate(c->enc, NULL, &n, buf, DLC_HDR) != 1) return -1;
        if (len > DLC_HDR &&
            EVP_EncryptUpdate(c->enc, out + DLC_HDR, &n, buf + DLC_HDR, (int)(len - DLC_HDR)) != 1)
            return -1;
    }
    if (EVP_EncryptFinal_ex(c->enc, out + len, &n) != 1) return -1;
    return EVP_CIPHER_CTX_ctrl(c->enc, EVP_CTRL_GCM_GET_TAG, DLC_TAG, tag) == 1 ? 0 : -1;
}

int dlc_open(dlc_crypto *c, const uint8_t key[16], int mode, uint32_t stream, uint64_t counter,
             const uint8_t *buf, size_t len, uint8_t *plain) {
    uint8_t nonce[12], tag[DLC_TAG];
    int n = 0;
    if (len < DLC_HDR + DLC_TAG) return -1;
    size_t body = len - DLC_TAG;
    memcpy(tag, buf + body, DLC_TAG);
    nonce_of(nonce, stream, counter);
    if (EVP_DecryptInit_ex(c->dec, NULL, NULL, key, nonce) != 1) return -1;
    if (mode == AUTH_MAC) {
        if (EVP_DecryptUpdate(c->dec, NULL, &n, buf, (int)body) != 1) return -1;
    } else {
        if (EVP_DecryptUpdate(c->dec, NULL, &n, buf, DLC_HDR) != 1) return -1;
        if (body > DLC_HDR &&
            EVP_DecryptUpdate(c->dec, plain, &n, buf + DLC_HDR, (int)(body - DLC_HDR)) != 1)
            return -1;
    }
    if (EVP_CIPHER_CTX_ctrl(c->dec, EVP_CTRL_GCM_SET_TAG, DLC_TAG, tag) != 1) return -1;
    return EVP_DecryptFinal_ex(c->dec, plain ? plain + (body - DLC_HDR) : tag, &n) == 1 ? 0 : -1;
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
