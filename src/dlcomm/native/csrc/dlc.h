/* dlcomm's native data path: the switch dataplane, its packet loop, the load generator and
 * the worker's transport (C11, libcrypto). The Python modules dlcomm.switch.dataplane and
 * dlcomm.exchange.switch.window are the specification; tests/native/ holds the two side by
 * side. Wire format: dlcomm/wire/packet.py; tags: dlcomm/wire/auth.py. */
#ifndef DLC_H
#define DLC_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define DLC_HDR 32
#define DLC_TAG 16
#define DLC_MAGIC 0xD1C0
#define DLC_VERSION 2
#define DLC_MAX_DGRAM 65507
#define DLC_SWITCH_RANK 0xFFFF
#define DLC_MAX_WORKERS 64      /* native jobs: a bitmap of 64 ranks; larger jobs run in Python */
#define DLC_WINDOW_BITS 4096    /* replay window (wire/auth.ReplayWindow) */

/* Loss injection (--drop-rate, drop=): a xorshift64 coin that lands with probability p; the
 * generator moves only where p > 0. */
static inline int dlc_coin(uint64_t *rng, double p) {
    if (p <= 0) return 0;
    uint64_t x = *rng;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    *rng = x;
    return (double)(x >> 11) * 0x1.0p-53 < p;
}

/* A counter of one thread's context, which other threads read (dlc_counters): its one
 * writer adds by a relaxed atomic load and store (plain moves on x86-64, no locked add), so
 * no reader races with it. */
#define DLC_BUMP(counter, n) \
    __atomic_store_n(&(counter), __atomic_load_n(&(counter), __ATOMIC_RELAXED) + (uint64_t)(n), \
                     __ATOMIC_RELAXED)

/* The hot loops are built for AVX2 too and chosen at load (target_clones), except under
 * ThreadSanitizer: its instrumentation of the ifunc resolvers runs before its runtime. */
#if defined(__SANITIZE_THREAD__)
#define DLC_CLONES
#else
#define DLC_CLONES __attribute__((target_clones("avx2", "default")))
#endif

/* client.c's counters (dlc_client_stats) and the kinds of a failed op (dlc_client_error);
 * dlcomm/native/client.py mirrors both */
enum { S_SENT, S_BSENT, S_RECV, S_BRECV, S_RETX, S_PROBES, S_REJECTED, S_DROPS };
enum { E_NONE, E_SWITCH, E_NONFINITE, E_STUCK, E_NO_ANSWER, E_PLAN, E_SOCKET };

enum { T_DATA = 1, T_RESULT, T_STATUS, T_ERROR, T_CHALLENGE };
enum { F_PROBE = 1, F_RESEND = 2, F_COMPLETE = 4, F_SPARSE = 8, F_RUN = 16, F_ANNOUNCE = 32 };
enum { AUTH_NONE = 0, AUTH_MAC = 1, AUTH_ENCRYPT = 2 };
enum { STREAM_UP = 1, STREAM_DOWN = 2, STREAM_RESULT = 3 };
#define EXP_ZERO (-32768)
#define EXP_NONFINITE 32767

/* Counters: the Python dataplane's names (dlc_counter_names). */
#define DLC_COUNTERS(X) \
    X(packets_in) X(bytes_in) X(drop_truncated) X(drop_foreign) X(drop_version) \
    X(drop_type) X(drop_unknown_job) X(drop_not_live) X(drop_bad_source) X(drop_bad_slot) \
    X(drop_too_large) X(drop_not_sparse) X(drop_bad_exponent) X(drop_bad_tag) X(drop_replay) \
    X(drop_length) X(drop_stale) X(drop_out_of_order) X(retransmissions) \
    X(drop_answer_too_large) X(completions) X(probes) X(resent_results) X(drop_mismatch) \
    X(drop_error_limited) X(errors_sent) X(drop_bad_value) X(packets_out) X(bytes_out) \
    X(send_errors) X(drop_injected_in) X(drop_injected_out) X(recv_errors) \
    X(slow_path) X(drop_slow_full) X(recv_calls) X(send_calls) X(gro_segments) \
    X(gso_segments) X(drop_unplanned)
#define DLC_ENUM(n) C_##n,
enum { DLC_COUNTERS(DLC_ENUM) C_COUNT };

typedef struct {
    uint16_t magic; uint8_t version, type; uint16_t job, worker, slot, numel;
    uint32_t seq, tsi; int16_t exp; uint8_t flags, resv; uint64_t counter;
} dlc_hdr;

void dlc_hdr_pack(uint8_t *out, const dlc_hdr *h);
void dlc_hdr_unpack(const uint8_t *in, dlc_hdr *h);

/* -- crypto (crypto.c): AES-128-GCM through libcrypto, one context per thread -------- */
typedef struct dlc_crypto dlc_crypto;
dlc_crypto *dlc_crypto_new(void);
void dlc_crypto_free(dlc_crypto *c);
/* mode MAC: tag over buf[0:len]; ENCRYPT: buf[0:32] is associated data, buf[32:len] is
 * encrypted into out[32:len] (out may be buf). The tag goes to tag. 0 on success. */
int dlc_seal(dlc_crypto *c, const uint8_t key[16], int mode, uint32_t stream, uint64_t counter,
             const uint8_t *buf, size_t len, uint8_t *out, uint8_t tag[16]);
/* The reverse on a datagram buf[0:len] (tag last); ENCRYPT decrypts into plain[0:len-48].
 * 0 if the tag verifies. */
int dlc_open(dlc_crypto *c, const uint8_t key[16], int mode, uint32_t stream, uint64_t counter,
             const uint8_t *buf, size_t len, uint8_t *plain);

typedef struct { uint64_t highest; int any; uint64_t bits[DLC_WINDOW_BITS / 64]; } dlc_window;
int dlc_window_accept(dlc_window *w, uint64_t counter);

/* -- the switch dataplane (dataplane.c) ------------------------------------------------ */
/* -- sparse rounds (sparse.c): switch/sparse_rounds.py and switch/planning.py ---------- */
#define DLC_LOOKAHEAD 64   /* wire/sparse.LOOKAHEAD */

/* A round's groups (sorted), their agreed exponents and block masks (g x words u32). */
typedef struct { int g, cap, run; int64_t *groups; int32_t *exps; uint32_t *unions; } dlc_plan;

/* Per slot: every worker's look-ahead (rows of 2 + words u32, as on the wire) and the
 * round it plans (switch/slots.Stream). */
typedef struct {
    int *nlook, *caplook; uint32_t **look;
    int64_t pending_seq; dlc_plan pending;
} dlc_stream;

/* Per slot copy of a sparse job: the round's plan (none in an announce round), each
 * group's first row of sums, and the encoded result (header room, payload, tag room). */
typedef struct {
    int announce; dlc_plan round; int *base; int nblocks;
    uint8_t *frame, *cipher; size_t cap, len;
} dlc_sparse_copy;

typedef struct {
    int64_t seq; int remaining; uint64_t expected, bitmap; int32_t exp; uint32_t tsi;
    uint16_t numel; double started;
    uint8_t *frame;     /* header room, k int32 (the accumulator), tag room: sealed in place */
    uint8_t *cipher;    /* encrypted jobs: the result's ciphertext frame */
    int sparse, run;    /* a sparse round; its result plans a dense run */
    dlc_sparse_copy *sp;   /* sparse jobs only */
} dlc_copy;

typedef struct { pthread_mutex_t mu; dlc_copy c[2]; dlc_stream *stream; } dlc_slot;

typedef struct dlc_job {
    uint16_t id; int workers, slot_count, k, auth, python, live; int32_t limit;
    int block, m;                              /* sparse jobs: block size, blocks per group */
    uint32_t *ips; uint16_t *ports;            /* host order */
    uint32_t group_ip; uint16_t group_port;    /* group_port 0: no multicast group */
    uint8_t (*up)[16], (*down)[16], result[16];
    dlc_window *windows; pthread_mutex_t *window_mu;
    uint64_t result_sent, *down_sent;          /* next counter per key (atomics) */
    pthread_mutex_t mu;                        /* failure, error replies */
    int failed; char failure[512]; double *error_replies;
    int64_t last_packet_ns;                    /* atomic */
    uint64_t counters[C_COUNT];                /* atomics: the job's own */
    dlc_slot *slots;
} dlc_job;

typedef struct {
    uint32_t ip; uint16_t port; int niov; struct iovec iov[2];
} dlc_out;

#define DLC_MAX_OUTS 256
typedef struct {
    int n; dlc_out out[DLC_MAX_OUTS];
    uint8_t *scratch; size_t used, cap;
} dlc_outs;

typedef struct dlc_switch dlc_switch;

/* Results of one batch to one address, sent as one UDP_SEGMENT datagram (segments of one
 * size; the kernel cuts them, or hands them whole to a receiver with UDP_GRO). */
#define DLC_GSO_BUCKETS 32
#define DLC_GSO_MAX_SEG 16384
typedef struct { uint32_t ip; uint16_t port; int count; size_t seg, used; uint8_t *buf; } dlc_gso;

/* One thread's context: its counters, crypto, scratch, and the socket that sends results
 * at once (-1: results are copied into the outputs, as the pure API does). */
typedef struct {
    dlc_switch *sw; dlc_crypto *crypto; uint64_t counters[C_COUNT];
    uint8_t *plain; dlc_outs outs; int send_fd; double drop_rate; uint64_t rng;
    int64_t cpu_ns; int gso; dlc_gso buckets[DLC_GSO_BUCKETS]; int nbuckets;
} dlc_ctx;

struct dlc_switch {
    pthread_rwlock_t lock;            /* the job table: read by packets, written by control */
    dlc_job *jobs[65536];
    pthread_mutex_t ctx_mu; dlc_ctx *ctxs[64]; int nctx;
    pthread_mutex_t fail_mu; pthread_cond_t fail_cv; uint16_t fail_ids[1024]; int nfail;
    /* the slow path: datagrams of jobs the Python dataplane serves */
    pthread_mutex_t slow_mu; pthread_cond_t slow_cv; struct dlc_slow *slow_head, *slow_tail;
    size_t slow_bytes; int stopping;
    uint64_t base_counters[C_COUNT];   /* of contexts that ended */
};

dlc_switch *dlc_switch_new(void);
void dlc_switch_free(dlc_switch *sw);
dlc_ctx *dlc_ctx_new(dlc_switch *sw, int send_fd, double drop_rate, uint64_t seed);
void dlc_ctx_free(dlc_ctx *ctx);
int dlc_process(dlc_ctx *ctx, uint8_t *data, size_t len, uint32_t ip, uint16_t port,
                double now);
double dlc_now(void);
void dlc_slow_clear(dlc_switch *sw);
int dlc_slow_push(dlc_switch *sw, const uint8_t *data, size_t len, uint32_t ip,
                   uint16_t port);
/* sparse.c */
typedef struct {   /* a sparse payload's parts (wire/sparse.py), little-endian u32 words */
    uint32_t nseg, nhead, m; uint64_t words;
    const uint8_t *head, *groups, *masks, *values;
} dlc_sparse_view;
int dlc_sparse_decode(const uint8_t *p, size_t len, uint32_t numel, int b, int width,
                      dlc_sparse_view *v);   /* 0 if consistent */
int dlc_valid_exponent(int e);
int dlc_sparse_alloc(dlc_job *job);                    /* 0, or -2: out of memory */
void dlc_sparse_free(dlc_job *job);
int dlc_sparse_start(dlc_job *job, dlc_slot *s, dlc_copy *c, const dlc_hdr *h);
int dlc_sparse_add(dlc_job *job, dlc_slot *s, dlc_copy *c, const dlc_hdr *h,
                   const uint8_t *payload, size_t len);   /* -1 added, else a drop counter */
int dlc_sparse_finish(dlc_job *job, dlc_slot *s, dlc_copy *c);  /* 0, or -2 */
void dlc_sendmmsg_all(dlc_ctx *ctx, int fd, dlc_out *outs, int n);
void dlc_gso_flush(dlc_ctx *ctx);

#endif
