/* A libFuzzer target for the native data path: the switch dataplane (dataplane.c, through
 * switch.c's job table) and the worker's state machine (client.c), fed attacker datagrams.
 *
 * Input: a sequence of records, each  u8 selector, u16 little-endian length, that many bytes
 * (a record cut short by the end of the input takes what is left). The selector:
 *   0x3F  source address: ADDR_IP/ADDR_PORT[(sel & 0x3F) % NADDR] (three worker ranks,
 *         the switch, a stranger, rank 0's host with rank 1's port);
 *   0x80  the bytes are header + payload: seal them before they are delivered, as their
 *         sender would (switch: the up key of the source address's rank, or of the header's
 *         worker field from any other address; client: the result key for a RESULT, else
 *         down[0]). The header's counter is the nonce. This lets a fuzzer reach the deep
 *         paths of authenticated jobs (rounds, completions, resends, mismatches).
 *   0x40  deliver to the client (rank 0 of job J_MAC) instead of the switch.
 * The clock advances STEP_S per record. After every record the invariants below are checked
 * (well-formed outputs from the switch, results only to their job's addresses, no answer
 * larger than its datagram, at most one answer per datagram, slow-path datagrams intact,
 * the client's outputs well-formed and to its switch); a broken one abort()s.
 *
 * Every input starts from the same state (the jobs registered anew; the client made anew,
 * its op begun, at the input's first client record): a crash file reproduces alone. Within
 * an input, the state is reset every RESET_EVERY records and RESET_AFTER_FAIL records after
 * a job failed, so that it does not only grow.
 *
 * The fixed keys (keys.h: KEYS_MAC, KEYS_ENC, KEYS_SPARSE) are mirrored in
 * src/dlcomm/testing/native_corpus.py, which
 * writes seed inputs: the two must match. Builds with clang -fsanitize=fuzzer, or with gcc
 * and cov_fuzz.c / replay_main.c (src/dlcomm/native/harness.py). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dlc.h"
#include "api.h"
#include "keys.h"
#include "records.h"

#define SEL_SEAL 0x80
#define SEL_CLIENT 0x40
#define SEL_ADDR 0x3F
#define STEP_S 0.001
#define T0 1000.0
#define RESET_EVERY 4096
#define RESET_AFTER_FAIL 64
#define TAKE_CAP (1u << 16)

/* -- the fixed world (mirrored in corpus.py) ------------------------------------------- */
enum { J_MAC = 1, J_NONE = 2, J_ENC = 3, J_SLOW = 4, J_IDLE = 5, J_SPARSE = 6 };
#define SPARSE_BLOCK 4   /* J_SPARSE: sparse rounds, groups of K / 4 = 4 blocks */
#define SLOTS 4
#define K 16
#define CLIENT_SLOTS 2
#define CLIENT_ELEMENTS 40

#define NADDR 6
enum { A_SWITCH = 3, A_STRANGER = 4, A_MIXED = 5 };
static const uint32_t ADDR_IP[NADDR] = {0x0A000001, 0x0A000002, 0x0A000003,   /* ranks 0-2 */
                                        0x0A000064, 0x0A090909, 0x0A000001};
static const uint16_t ADDR_PORT[NADDR] = {7000, 7001, 7002, 9000, 4444, 7001};
#define GROUP_IP 0xEF010101u   /* 239.1.1.1: J_ENC's results go to a multicast group */
#define GROUP_PORT 7100

typedef struct {
    int id, workers, auth, python, live; uint32_t group_ip; uint16_t group_port;
    const char (*keys)[17]; int block;
} fz_job;

static const fz_job JOBS[] = {
    {J_MAC, 3, AUTH_MAC, 0, 1, 0, 0, KEYS_MAC, 0},
    {J_NONE, 2, AUTH_NONE, 0, 1, 0, 0, NULL, 0},
    {J_ENC, 3, AUTH_ENCRYPT, 0, 1, GROUP_IP, GROUP_PORT, KEYS_ENC, 0},
    {J_SLOW, 3, AUTH_MAC, 1, 1, 0, 0, NULL, 0},    /* python=1: every datagram to the slow path */
    {J_IDLE, 2, AUTH_NONE, 0, 0, 0, 0, NULL, 0},   /* registered, never live */
    {J_SPARSE, 3, AUTH_MAC, 0, 1, 0, 0, KEYS_SPARSE, SPARSE_BLOCK},   /* sparse rounds */
};
#define NJOBS ((int)(sizeof JOBS / sizeof JOBS[0]))

static struct {
    dlc_switch *sw; dlc_ctx *ctx; dlc_crypto *crypto; dlc_client *client;
    uint8_t *slow, *taken;   /* room for a slow-path datagram, the client's outputs */
    float data[CLIENT_ELEMENTS], out[CLIENT_ELEMENTS];
    double now; unsigned long records; int reset_in;
    unsigned long ops_done, ops_failed;   /* the client's, for -DDLC_FUZZ_STATS */
} S;

static void fail(const char *what, long a, long b) {
    fprintf(stderr, "fuzz_target: invariant broken at record %lu: %s (%ld, %ld)\n",
            S.records, what, a, b);
    abort();
}

static const fz_job *job_of(unsigned id) {
    for (int i = 0; i < NJOBS; i++) if ((unsigned)JOBS[i].id == id) return &JOBS[i];
    return NULL;
}

static void add_job(const fz_job *j) {
    uint8_t keys[7 * 16] = {0};
    uint32_t ips[3];
    uint16_t ports[3];
    for (int r = 0; r < j->workers; r++) { ips[r] = ADDR_IP[r]; ports[r] = ADDR_PORT[r]; }
    for (int i = 0; j->keys && i < 2 * j->workers + 1; i++) memcpy(keys + 16 * i, j->keys[i], 16);
    if (dlc_job_add(S.sw, j->id, j->workers, ips, ports, SLOTS, K, dlc_value_limit(j->workers),
                    j->auth, keys, j->group_ip, j->group_port, j->python))
        fail("dlc_job_add refused a fixed job", j->id, 0);
    if (j->block && dlc_job_sparse(S.sw, j->id, j->block))
        fail("dlc_job_sparse refused a fixed job", j->id, j->block);
    if (j->live) dlc_job_set_live(S.sw, j->id, 1);
}

static void client_begin(void) {
    if (dlc_client_begin(S.client, S.data, S.out, CLIENT_ELEMENTS, S.now))
        fail("dlc_client_begin failed", 0, 0);
}

/* The client, made when a record first needs it (most inputs never do: a client costs
 * 1.6 MB of buffers, which would dominate every run). Its op begins then. */
static dlc_client *client(void) {
    if (S.client) return S.client;
    uint8_t keys[48];   /* dlc_client_shard's layout: up, down, result */
    memcpy(keys, KEYS_MAC[0], 16); memcpy(keys + 16, KEYS_MAC[3], 16);
    memcpy(keys + 32, KEYS_MAC[6], 16);
    /* timeouts of 5-50 ms, and it gives up after 0.1 s (100 records) without progress */
    S.client = dlc_client_new(-1, 0, 3, K, AUTH_MAC, 0.02, 0.005, 0.05, 0.1, 0.0, 0);
    if (!S.client || dlc_client_shard(S.client, ADDR_IP[A_SWITCH], ADDR_PORT[A_SWITCH], J_MAC,
                                      CLIENT_SLOTS, keys) < 0)
        fail("cannot make the client", 0, 0);
    client_begin();
    return S.client;
}

/* Every job registered anew (dlc_job_add replaces and frees the old one), no client. */
static void reset_state(void) {
    uint16_t ids[64];
    for (int i = 0; i < NJOBS; i++) add_job(&JOBS[i]);
    if (S.sw->nfail) dlc_take_failures(S.sw, ids, 64, 0);   /* a wait (a syscall) if none */
    dlc_client_free(S.client);
    S.client = NULL;
    S.reset_in = -1;
}

static void teardown(void) {   /* at exit: what LeakSanitizer then finds is a real leak */
    dlc_client_free(S.client);
    dlc_ctx_free(S.ctx);
    dlc_switch_free(S.sw);
    dlc_crypto_free(S.crypto);
    free(S.slow); free(S.taken);
    memset(&S, 0, sizeof S);
}

static void init(void) {
    S.sw = dlc_switch_new();
    S.ctx = S.sw ? dlc_ctx_new(S.sw, -1, 0.0, 0) : NULL;   /* pure: outputs to ctx->outs */
    S.crypto = dlc_crypto_new();
    S.slow = malloc(DLC_MAX_DGRAM);
    S.taken = malloc(TAKE_CAP);
    if (!S.ctx || !S.crypto || !S.slow || !S.taken) fail("cannot allocate the switch", 0, 0);
    for (int i = 0; i < CLIENT_ELEMENTS; i++) S.data[i] = (float)(i % 7 - 3) * 0.25f;
    atexit(teardown);
}

/* -- datagrams ------------------------------------------------------------------------- */
/* The record as a datagram in a buffer of exactly its length (ASan sees any overread),
 * sealed with `key` if given. No UDP datagram is longer than DLC_MAX_DGRAM. */
static uint8_t *datagram(const uint8_t *bytes, size_t n, const uint8_t *key, int mode,
                         uint32_t stream, size_t *len) {
    int seal = key != NULL && n >= DLC_HDR;
    size_t cap = seal ? DLC_MAX_DGRAM - DLC_TAG : DLC_MAX_DGRAM;
    if (n > cap) n = cap;
    *len = n + (seal ? DLC_TAG : 0);
    uint8_t *d = malloc(*len ? *len : 1);
    if (!d) fail("out of memory", (long)*len, 0);
    if (n) memcpy(d, bytes, n);
    if (seal) {
        dlc_hdr h;
        dlc_hdr_unpack(d, &h);
        if (dlc_seal(S.crypto, key, mode, stream, h.counter, d, n, d, d + n))
            fail("dlc_seal failed", (long)n, mode);
    }
    return d;
}

/* The key a worker would seal `bytes` with: the source address's rank, or the header's. */
static const uint8_t *up_key(const uint8_t *bytes, size_t n, int addr, int *mode) {
    if (n < DLC_HDR) return NULL;
    dlc_hdr h;
    dlc_hdr_unpack(bytes, &h);
    const fz_job *j = job_of(h.job);
    if (!j || !j->keys) return NULL;
    int rank = addr < j->workers ? addr : h.worker % j->workers;
    *mode = j->auth;
    return (const uint8_t *)j->keys[rank];
}

/* -- invariants ------------------------------------------------------------------------ */
/* A result goes to its job's group, or to one of the job's workers (every worker, or the
 * one that asked for it again). */
static void check_result_to(const dlc_out *o, const dlc_hdr *h) {
    const fz_job *j = job_of(h->job);
    if (!j || j->python) fail("a result of a job the switch does not serve", h->job, 0);
    if (j->group_port && o->ip == j->group_ip && o->port == j->group_port) return;
    for (int r = 0; r < j->workers; r++)
        if (o->ip == ADDR_IP[r] && o->port == ADDR_PORT[r]) return;
    fail("a result to an address outside its job", (long)o->ip, o->port);
}

/* The switch's outputs for a datagram of in_len bytes: well-formed headers from the switch;
 * besides results, at most one answer and never larger than what caused it (no
 * amplification: a probe pads itself to the answer it asks for). */
static void check_switch_outputs(size_t in_len, int r) {
    const dlc_outs *o = &S.ctx->outs;
    int answers = 0;
    if (r != o->n) fail("dlc_process's count is not its outputs'", r, o->n);
    for (int i = 0; i < o->n; i++) {
        size_t len = 0;
        for (int v = 0; v < o->out[i].niov; v++) len += o->out[i].iov[v].iov_len;
        if (o->out[i].niov != 1 || len < DLC_HDR)
            fail("an output shorter than a header", i, (long)len);
        dlc_hdr h;
        dlc_hdr_unpack(o->out[i].iov[0].iov_base, &h);
        if (h.magic != DLC_MAGIC || h.version != DLC_VERSION || h.worker != DLC_SWITCH_RANK)
            fail("an output with a bad header", h.magic, h.worker);
        if (h.type == T_RESULT) { check_result_to(&o->out[i], &h); continue; }
        if (len > in_len) fail("an answer larger than its datagram", (long)len, (long)in_len);
        answers++;
    }
    if (answers > 1) fail("more than one answer to one datagram", answers, 0);
}

/* A slow-path datagram comes back from dlc_slow_next as it went in (and is drained, so the
 * queue stays empty). */
static void check_slow(const uint8_t *d, size_t len, int addr) {
    uint32_t ip = 0;
    uint16_t port = 0;
    if (S.ctx->outs.n) fail("outputs for a slow-path datagram", S.ctx->outs.n, 0);
    long got = dlc_slow_next(S.sw, S.slow, DLC_MAX_DGRAM, &ip, &port, 0);
    if (got != (long)len || memcmp(S.slow, d, len) || ip != ADDR_IP[addr] ||
        port != ADDR_PORT[addr])
        fail("the slow path changed a datagram", got, (long)len);
}

/* The client's outputs: DATA packets of rank 0 of J_MAC, to the switch and nowhere else. */
static void client_outputs(void) {
    long w = dlc_client_take(S.client, S.taken, TAKE_CAP);
    if (w < 0) fail("the client's outputs overflow the harness's buffer", w, 0);
    for (long at = 0; at < w;) {
        uint32_t ip, n;
        uint16_t port;
        memcpy(&ip, S.taken + at, 4); memcpy(&port, S.taken + at + 4, 2);
        memcpy(&n, S.taken + at + 6, 4);
        if (n < DLC_HDR || at + 10 + (long)n > w) fail("a client output too short", (long)n, at);
        dlc_hdr h;
        dlc_hdr_unpack(S.taken + at + 10, &h);
        if (h.magic != DLC_MAGIC || h.type != T_DATA || h.job != J_MAC || h.worker != 0)
            fail("a client output with a bad header", h.magic, h.type);
        if (ip != ADDR_IP[A_SWITCH] || port != ADDR_PORT[A_SWITCH])
            fail("a client output not to its switch", (long)ip, port);
        at += 10 + (long)n;
    }
}

/* -- records --------------------------------------------------------------------------- */
static void to_switch(uint8_t sel, const uint8_t *bytes, size_t n, int addr) {
    int mode = AUTH_NONE;
    const uint8_t *key = sel & SEL_SEAL ? up_key(bytes, n, addr, &mode) : NULL;
    size_t len;
    uint8_t *d = datagram(bytes, n, key, mode, STREAM_UP, &len);
    S.ctx->outs.n = 0; S.ctx->outs.used = 0;
    int r = dlc_process(S.ctx, d, len, ADDR_IP[addr], ADDR_PORT[addr], S.now);
    if (r < 0) check_slow(d, len, addr);
    else check_switch_outputs(len, r);
    free(d);
}

static void to_client(uint8_t sel, const uint8_t *bytes, size_t n, int addr) {
    const uint8_t *key = NULL;
    uint32_t stream = STREAM_DOWN;
    if ((sel & SEL_SEAL) && n >= DLC_HDR) {
        int result = bytes[3] == T_RESULT;
        key = (const uint8_t *)KEYS_MAC[result ? 6 : 3];   /* result, or down[0] */
        stream = result ? STREAM_RESULT : STREAM_DOWN;
    }
    size_t len;
    uint8_t *d = datagram(bytes, n, key, AUTH_MAC, stream, &len);
    dlc_client_on_datagram(client(), d, len, ADDR_IP[addr], ADDR_PORT[addr], S.now);
    free(d);
    client_outputs();
}

/* The client's clock: its timeouts, and a new op once one ended (done or failed). */
static void client_tick(void) {
    if (!S.client) return;
    if (S.now >= dlc_client_next_deadline(S.client)) {
        dlc_client_on_timeout(S.client, S.now);
        client_outputs();
    }
    int done = dlc_client_done(S.client);
    if (done) {
        if (done > 0) S.ops_done++; else S.ops_failed++;
        client_begin();
        client_outputs();
    }
}

static int any_failed(void) {
    for (int i = 0; i < NJOBS; i++) {
        dlc_job *j = JOBS[i].python ? NULL : S.sw->jobs[JOBS[i].id];
        if (j && __atomic_load_n(&j->failed, __ATOMIC_ACQUIRE)) return 1;
    }
    return 0;
}

static void one_record(uint8_t sel, const uint8_t *bytes, size_t n) {
    int addr = (sel & SEL_ADDR) % NADDR;
    S.now += STEP_S;
    S.records++;
    if (sel & SEL_CLIENT) to_client(sel, bytes, n, addr);
    else to_switch(sel, bytes, n, addr);
    client_tick();
    /* a failed job answers errors for a while (their rate limit), then starts over */
    if (S.reset_in < 0 && any_failed()) S.reset_in = RESET_AFTER_FAIL;
    if (S.records % RESET_EVERY == 0 || (S.reset_in >= 0 && S.reset_in-- == 0)) reset_state();
}

#ifdef DLC_FUZZ_STATS
/* -DDLC_FUZZ_STATS: the switch's non-zero counters after each input (which paths a corpus
 * reaches; the counters of dlc.h, cumulative over the inputs). */
static void print_stats(void) {
    uint64_t c[C_COUNT];
    char names[2048];
    dlc_counters(S.sw, c);
    snprintf(names, sizeof names, "%s", dlc_counter_names());
    fprintf(stderr, "fuzz_target: %lu records:", S.records);
    char *save = NULL, *name = strtok_r(names, ",", &save);
    for (int i = 0; i < C_COUNT && name; i++, name = strtok_r(NULL, ",", &save))
        if (c[i]) fprintf(stderr, " %s=%llu", name, (unsigned long long)c[i]);
    fprintf(stderr, " client_ops_done=%lu client_ops_failed=%lu\n", S.ops_done, S.ops_failed);
}
#else
static void print_stats(void) {}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!S.sw) init();
    S.now = T0;
    S.records = 0;
    reset_state();
    dlc_each_record(data, size, 0, one_record);
    print_stats();
    return 0;
}
