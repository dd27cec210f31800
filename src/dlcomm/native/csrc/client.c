/* The worker's side of the aggregation protocol: dlcomm/exchange/switch/window.py's
 * AllreduceOp (dense rounds), rule for rule, fused with quantization: each chunk is
 * quantized straight into its packet and each result dequantized straight out of the
 * received datagram. A pure state machine (begin, on_datagram, on_timeout: outputs to send)
 * and a socket loop around it (dlc_client_run: batched receives, no GIL). */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "dlc.h"
#include "rx.h"

#define MAX_SHARDS 16
#define RTT_WINDOW 128
#define RX_BATCH 16
#define CL_MAX_OUTS 1024

typedef struct {
    uint32_t ip; uint16_t port, job; int slots; uint8_t up[16], down[16], result[16];
    uint64_t up_next; dlc_window w_result, w_down; uint64_t *seqs;
    /* the op: the wait the shard's last STATUS set while only others were missing (one
     * position probes for the shard, the rest hold: window.py's holding) */
    int holding, probed; double hold;
} cl_shard;

typedef struct {
    int index, shard, slot, chunk; uint64_t seq; int e_used;
    uint16_t numel; uint32_t tsi; int16_t exp_announced;
    double sent_at, deadline; int retries, done, has_missing, complete_seen, probed, waits;
    uint64_t missing;
    uint8_t *pkt;      /* header room, the quantized chunk (or sparse payload), tag room */
    uint64_t queued;   /* the queue's epoch + 1 while an output points into pkt, else 0 */
    uint8_t flags;     /* the round's header flags (sparse rounds: SPARSE, ANNOUNCE) */
    size_t plen;       /* the payload's bytes */
    /* sparse op: the planned round's groups (sorted, distinct) and their exponents, and the
     * dense run left (sparse_window.py's plans and runs) */
    int nplan, nrun, run_at, in_run; int64_t *plan_g; int32_t *plan_e;
    int64_t *run_g; int32_t *run_e;
} cl_pos;

typedef struct {
    int fd, rank, workers, k, auth, nshards, gso; int32_t limit; int log2n;
    int rfd;          /* results' own socket (a group shared by workers of one host), or -1 */
    int gro_on;       /* UDP_GRO set on fd (and rfd): once, it stays on */
    size_t gso_max;   /* segments of this size or more exceeded the path's frame: no GSO */
    double init_to, min_to, max_to, deadline_s, drop_rate; uint64_t rng;
    cl_shard shards[MAX_SHARDS];
    double samples[RTT_WINDOW]; int nsamples, head, fresh, have_srtt; double srtt, median;
    dlc_crypto *crypto;
    /* the op */
    const float *data; float *out; size_t n; int chunks, npos, active; int32_t *exps;
    cl_pos *pos; double last_progress; int error_kind; long error_arg;
    char error_text[512]; int error_shard;
    /* a sparse op (sparse_window.py): blocks of `block`, m per group; this worker's present
     * blocks per group, their masks as words, and per position its groups with data */
    int sparse, block, m, words; uint8_t *gmask; uint32_t *packed;
    int *mine, *mine_off, *mine_cnt, *cursor; long union_blocks;
    int count_block;   /* a dense op counts its result's blocks of this many that hold data */
    /* outputs of the pure API / the loop's batch */
    dlc_out outs[CL_MAX_OUTS]; int nouts; uint8_t *scratch; size_t used, cap; int pure;
    uint64_t epoch;   /* how many times the queue was emptied (sent, or taken) */
    uint64_t stats[8];   /* sent, bytes sent, received, bytes received, retransmissions,
                            probes, rejected, drops injected */
    uint8_t *rx;
} dlc_client;

#define EXP_UNKNOWN INT32_MIN   /* a chunk's exponent not taken yet */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void rtt_sample(dlc_client *c, double rtt) {
    c->samples[c->head] = rtt;
    c->head = (c->head + 1) % RTT_WINDOW;
    if (c->nsamples < RTT_WINDOW) c->nsamples++;
    c->srtt = c->have_srtt ? 0.875 * c->srtt + 0.125 * rtt : rtt;
    c->have_srtt = 1;
    c->fresh++;
    if (c->fresh >= 16 || c->nsamples < 16) {   /* numpy's median: the mean of the middle two */
        double s[RTT_WINDOW];
        c->fresh = 0;
        memcpy(s, c->samples, sizeof(double) * (size_t)c->nsamples);
        qsort(s, (size_t)c->nsamples, sizeof(double), cmp_double);
        int m = c->nsamples;
        c->median = m % 2 ? s[m / 2] : (s[m / 2 - 1] + s[m / 2]) / 2;
    }
}

static double rtt_timeout(const dlc_client *c, int backoff) {
    double base = c->init_to;
    if (c->nsamples) {
        double lo = c->samples[0];
        for (int i = 1; i < c->nsamples; i++) lo = c->samples[i] < lo ? c->samples[i] : lo;
        base = fmax(4.0 * lo, 2.0 * c->median);
    }
    return fmin(c->max_to, fmax(c->min_to, base) * ldexp(1.0, backoff));
}

dlc_client *dlc_client_new(int fd, int rank, int workers, int k, int auth, double init_to,
                           double min_to, double max_to, double deadline_s, double drop_rate,
                           uint64_t seed) {
    if (workers < 1 || workers > DLC_MAX_WORKERS || rank < 0 || rank >= workers || k < 1 ||
        k > (DLC_MAX_DGRAM - DLC_HDR - DLC_TAG) / 4)
        return NULL;
    dlc_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd; c->rfd = -1; c->rank = rank; c->workers = workers; c->k = k; c->auth = auth;
    c->init_to = init_to; c->min_to = min_to; c->max_to = max_to; c->deadline_s = deadline_s;
    c->drop_rate = drop_rate; c->rng = seed * 0x9E3779B97F4A7C15ull + 7;
    c->log2n = 1; c->gso = 1; c->gso_max = SIZE_MAX;
    while ((1 << c->log2n) < workers) c->log2n++;
    c->limit = (int32_t)((1u << (31 - c->log2n)) - 1);
    c->crypto = dlc_crypto_new();
    c->cap = (size_t)CL_MAX_OUTS * 128 + 8 * 65600;
    c->scratch = malloc(c->cap);
    c->rx = malloc((size_t)RX_BATCH * 65536);
    if (!c->crypto || !c->scratch || !c->rx) {
        dlc_crypto_free(c->crypto); free(c->scratch); free(c->rx); free(c);
        return NULL;
    }
    return c;
}

static void op_free(dlc_client *c) {
    if (c->pos)
        for (int i = 0; i < c->npos; i++) {
            cl_pos *p = &c->pos[i];
            free(p->pkt); free(p->plan_g); free(p->plan_e); free(p->run_g); free(p->run_e);
        }
    free(c->pos); free(c->exps);
    free(c->gmask); free(c->packed); free(c->mine); free(c->mine_off); free(c->mine_cnt);
    free(c->cursor);
    c->pos = NULL; c->exps = NULL; c->npos = 0; c->active = 0; c->sparse = 0;
    c->gmask = NULL; c->packed = NULL; c->mine = c->mine_off = c->mine_cnt = c->cursor = NULL;
}

void dlc_client_free(dlc_client *c) {
    if (!c) return;
    op_free(c);
    for (int s = 0; s < c->nshards; s++) free(c->shards[s].seqs);
    dlc_crypto_free(c->crypto);
    free(c->scratch); free(c->rx); free(c);
}

/* keys: up, down, result (48 bytes; ignored in mode none). */
int dlc_client_shard(dlc_client *c, uint32_t ip, uint16_t port, uint16_t job, int slots,
                     const uint8_t *keys) {
    if (c->nshards >= MAX_SHARDS || slots < 1) return -1;
    cl_shard *s = &c->shards[c->nshards];
    memset(s, 0, sizeof *s);
    s->ip = ip; s->port = port; s->job = job; s->slots = slots;
    s->seqs = calloc((size_t)slots, 8);
    if (!s->seqs) return -1;
    if (c->auth != AUTH_NONE) { memcpy(s->up, keys, 16); memcpy(s->down, keys + 16, 16); memcpy(s->result, keys + 32, 16); }
    return c->nshards++;
}

/* -- quantization (wire/quant.py), written for the vectoriser --------------------------- */
/* The chunk's exponent: max |x| on the float's bits (as unsigned integers they order like the
 * magnitudes; NaN and infinities are those from 0x7f800000 up), so the loop vectorises. */
static int32_t exp_of_bits(uint32_t peak) {   /* the exponent of a peak's bits (wire/quant.py) */
    if (peak >= 0x7f800000u) return EXP_NONFINITE;
    if (peak == 0) return EXP_ZERO;
    float f;
    memcpy(&f, &peak, 4);
    int e;
    frexp((double)f, &e);
    return e;
}

DLC_CLONES
static int32_t chunk_exp(const float *restrict x, size_t n) {
    const uint32_t *restrict b = (const uint32_t *)(const void *)x;
    uint32_t peak = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = b[i] & 0x7fffffffu;
        peak = a > peak ? a : peak;
    }
    return exp_of_bits(peak);
}

/* q = rint(x * 2^s) clamped to +-limit, s = 31 - L - e_max (wire/quant.quantize). In float32
 * when 2^s is a normal float (the product is then exact, as numpy's ldexp): eight lanes; else
 * in double (tiny exponents), where the product is exact too. */
DLC_CLONES
static void quantize_into(int32_t *restrict q, const float *restrict x, size_t n, int e_max,
                          int log2n, int32_t limit) {
    if (e_max == EXP_ZERO) { memset(q, 0, 4 * n); return; }
    int s = 31 - log2n - e_max;
    if (s >= -126 && s <= 127) {
        /* bounded to +-2^(31-L) and NaN to 0 before the conversion, as wire/quant._bound:
         * only a forged exponent below the chunk's own can reach the bound */
        const float scale = ldexpf(1.0f, s), cap = ldexpf(1.0f, 31 - log2n);
        for (size_t i = 0; i < n; i++) {
            float f = x[i] * scale;
            f = f > cap ? cap : f;
            f = f < -cap ? -cap : f;
            f = f == f ? f : 0.0f;
            int32_t v = (int32_t)rintf(f);
            v = v > limit ? limit : v;
            q[i] = v < -limit ? -limit : v;
        }
        return;
    }
    const double scale = ldexp(1.0, s), cap = ldexp(1.0, 31 - log2n);
    const double lim = (double)limit;
    for (size_t i = 0; i < n; i++) {
        double v = (double)x[i] * scale;
        v = v > cap ? cap : v;
        v = v < -cap ? -cap : v;
        v = rint(v == v ? v : 0.0);
        v = v > lim ? lim : v;
        q[i] = (int32_t)(v < -lim ? -lim : v);
    }
}

/* out = float32(t) * 2^-s (wire/quant.dequantize_into): one rounding of the sum to float32,
 * then an exact scaling (or one more rounding where the result is subnormal or overflows, as
 * numpy's ldexp in float32 does). */
DLC_CLONES
static void dequantize_into(float *restrict out, const int32_t *restrict t, size_t n, int e_max,
                            int log2n) {
    if (e_max == EXP_ZERO) { memset(out, 0, 4 * n); return; }
    int s = e_max + log2n - 31;
    if (s >= -126 && s <= 127) {
        const float scale = ldexpf(1.0f, s);
        for (size_t i = 0; i < n; i++) out[i] = (float)t[i] * scale;
        return;
    }
    const double scale = ldexp(1.0, s);
    for (size_t i = 0; i < n; i++) out[i] = (float)((double)(float)t[i] * scale);
}

/* -- sending ---------------------------------------------------------------------------- */
static int flush(dlc_client *c);
static void detach_queued(dlc_client *c, cl_pos *p);

/* Queue an output. The loop sends the queue as soon as it is full, this output included:
 * flushing resets the scratch space, so no queued output may point into it afterwards. */
static void push(dlc_client *c, const cl_shard *s, uint8_t *buf, size_t len) {
    if (c->nouts >= CL_MAX_OUTS) return;   /* the pure machine: the caller takes outputs */
    dlc_out *o = &c->outs[c->nouts++];
    o->ip = s->ip; o->port = s->port; o->niov = 1;
    o->iov[0].iov_base = buf; o->iov[0].iov_len = len;
    if (c->nouts >= CL_MAX_OUTS && c->fd >= 0) flush(c);
}

/* Seal buf (header room, body) into out (== buf but in mode encrypted, whose ciphertext
 * must not overwrite a payload that may be sent again). */
static size_t seal_packet(dlc_client *c, cl_shard *s, uint8_t *buf, dlc_hdr *h, size_t body,
                          uint8_t *out) {
    h->magic = DLC_MAGIC; h->version = DLC_VERSION; h->type = T_DATA; h->job = s->job;
    h->worker = (uint16_t)c->rank; h->resv = 0; h->counter = s->up_next++;
    dlc_hdr_pack(buf, h);
    size_t len = DLC_HDR + body;
    if (c->auth == AUTH_NONE) return len;
    if (out != buf) memcpy(out, buf, DLC_HDR);
    dlc_seal(c->crypto, s->up, c->auth, STREAM_UP, h->counter, buf, len, out, out + len);
    return len + DLC_TAG;
}

static void send_pos(dlc_client *c, cl_pos *p, double now, int probe) {
    cl_shard *s = &c->shards[p->shard];
    p->sent_at = now;
    p->deadline = now + rtt_timeout(c, p->retries);
    dlc_hdr h = {.slot = (uint16_t)p->slot, .numel = p->numel, .seq = (uint32_t)p->seq,
                 .tsi = p->tsi, .exp = p->exp_announced, .flags = p->flags};
    if (probe) {
        p->probed = 1;
        int resend = p->complete_seen;
        h.flags = (uint8_t)(p->flags | F_PROBE | (resend ? F_RESEND : 0));
        /* a RESEND pads to the answer: a sparse result's size is unknown, so the most a
         * datagram carries (sparse_window.SparseAllreduceOp._answer_size) */
        size_t answer = p->flags & F_SPARSE
            ? DLC_MAX_DGRAM - DLC_HDR - (c->auth == AUTH_NONE ? 0 : DLC_TAG) : 4u * p->numel;
        size_t pad = resend ? answer : (size_t)(c->workers + 7) / 8;
        if (c->used + DLC_HDR + pad + DLC_TAG > c->cap - 65600) return;
        uint8_t *buf = c->scratch + c->used;
        memset(buf + DLC_HDR, 0, pad);
        size_t len = seal_packet(c, s, buf, &h, pad, buf);
        c->used += len;
        push(c, s, buf, len);
        return;
    }
    /* the packet's payload is in place; a retransmission is sealed anew (a new counter) */
    uint8_t *out = p->pkt;
    detach_queued(c, p);
    if (c->auth == AUTH_ENCRYPT) {
        if (c->used + DLC_HDR + p->plen + DLC_TAG > c->cap - 65600) return;
        out = c->scratch + c->used;
        c->used += DLC_HDR + p->plen + DLC_TAG;
    } else {
        p->queued = c->epoch + 1;   /* before push: a flush in it empties the queue */
    }
    size_t len = seal_packet(c, s, p->pkt, &h, p->plen, out);
    push(c, s, out, len);
}

static int next_exp(dlc_client *c, int chunk) {
    if (chunk >= c->chunks) return EXP_ZERO;
    if (c->exps[chunk] == EXP_UNKNOWN) {   /* taken when first announced: no pass up front */
        size_t lo = (size_t)chunk * (size_t)c->k, hi = lo + (size_t)c->k;
        c->exps[chunk] = chunk_exp(c->data + lo, (hi > c->n ? c->n : hi) - lo);
    }
    return c->exps[chunk];
}

/* p's packet is about to be written again (a new round, or a retransmission sealed anew)
 * while an output of it still waits in the queue (results of two rounds, or two requests to
 * send again, read in one batch): that output gets a copy of its bytes in scratch space
 * first, as window.py's sends are copies. Where scratch space is short, the queue is sent
 * first (or, in the pure machine, the output is given up: a loss, which probes recover). */
static void detach_queued(dlc_client *c, cl_pos *p) {
    if (p->queued != c->epoch + 1) return;
    p->queued = 0;
    for (int i = 0; i < c->nouts; i++) {
        dlc_out *o = &c->outs[i];
        size_t len = o->iov[0].iov_len;
        if (o->iov[0].iov_base != p->pkt) continue;
        if (c->used + len > c->cap - 65600) {
            if (c->fd >= 0) { flush(c); return; }
            memmove(o, o + 1, sizeof *o * (size_t)(c->nouts - i - 1));
            c->nouts--; i--;
            continue;
        }
        memcpy(c->scratch + c->used, p->pkt, len);
        o->iov[0].iov_base = c->scratch + c->used;
        c->used += len;
    }
}

static void next_round(dlc_client *c, cl_pos *p) {
    cl_shard *s = &c->shards[p->shard];
    detach_queued(c, p);
    p->seq = s->seqs[p->slot]++;
    p->retries = 0; p->has_missing = 0; p->missing = 0; p->complete_seen = 0; p->probed = 0;
    p->waits = 0;
}

/* A dense round of `chunk` (or the exponent round, chunk < 0); `announce` is the exponent
 * it announces (EXP_UNKNOWN: the chunk a window further on, as dense mode does). */
static void arm_with(dlc_client *c, cl_pos *p, int chunk, int e_max, double now,
                     int32_t announce) {
    next_round(c, p);
    p->flags = 0;
    if (chunk < 0) {
        p->chunk = -1; p->numel = 0; p->tsi = (uint32_t)(c->n & 0xFFFFFFFFu);
        p->exp_announced = (int16_t)next_exp(c, p->index);
    } else {
        size_t lo = (size_t)chunk * (size_t)c->k, hi = lo + (size_t)c->k;
        if (hi > c->n) hi = c->n;
        p->chunk = chunk; p->e_used = e_max;
        quantize_into((int32_t *)(void *)(p->pkt + DLC_HDR), c->data + lo, hi - lo, e_max,
                      c->log2n, c->limit);
        p->numel = (uint16_t)(hi - lo); p->tsi = (uint32_t)lo;
        p->exp_announced = (int16_t)(announce == EXP_UNKNOWN ? next_exp(c, chunk + c->npos)
                                                             : announce);
    }
    p->plen = 4u * p->numel;
    send_pos(c, p, now, 0);
}

static void arm(dlc_client *c, cl_pos *p, int chunk, int e_max, double now) {
    arm_with(c, p, chunk, e_max, now, EXP_UNKNOWN);
}

static void sparse_announce(dlc_client *c, cl_pos *p, double now);
static int sparse_result(dlc_client *c, cl_pos *p, const dlc_hdr *h, const uint8_t *payload,
                         size_t plen, double now);

/* The op's window positions, slot by slot over the shards, one per chunk at most (window.py's
 * order), each with a packet buffer of `pkt` bytes. 0, or -1 out of memory. */
static int lay_out(dlc_client *c, size_t pkt) {
    int maxslots = 0;
    for (int s = 0; s < c->nshards; s++) maxslots = c->shards[s].slots > maxslots ? c->shards[s].slots : maxslots;
    c->npos = 0;
    c->pos = calloc((size_t)maxslots * (size_t)c->nshards + 1, sizeof *c->pos);
    if (!c->pos) return -1;
    for (int slot = 0; slot < maxslots && c->npos < c->chunks; slot++)
        for (int s = 0; s < c->nshards && c->npos < c->chunks; s++)
            if (slot < c->shards[s].slots) {
                cl_pos *p = &c->pos[c->npos];
                p->index = c->npos; p->shard = s; p->slot = slot;
                p->pkt = malloc(pkt);
                if (!p->pkt) return -1;
                c->npos++;
            }
    return 0;
}

/* Dense ops from now on count the blocks of `block` elements of their result that hold a
 * value other than +-0 (NaN counts), as they come in, for dlc_client_union_blocks (auto's
 * density; wire/sparse.py's present_blocks, counted); 0: no count. -2 if block does not
 * divide k. */
int dlc_client_count_blocks(dlc_client *c, int block) {
    if (block < 0 || (block && c->k % block)) return -2;
    c->count_block = block;
    return 0;
}

/* x[j] != 0 as bits, without a branch (so that it vectorises): all but the sign bit are 0
 * only for +-0; NaN and denormals count */
DLC_CLONES
static long present_blocks(const float *x, size_t n, size_t b) {
    long count = 0;
    for (size_t i = 0; i < n; i += b) {
        size_t end = n - i < b ? n : i + b;
        uint32_t any = 0;
        for (size_t j = i; j < end; j++) {
            uint32_t v;
            memcpy(&v, x + j, sizeof v);
            any |= v & 0x7FFFFFFFu;
        }
        count += any != 0;
    }
    return count;
}

/* Begin summing data[0:n] into out (which may be data). Outputs: the exponent rounds. */
int dlc_client_begin(dlc_client *c, const float *data, float *out, size_t n, double now) {
    op_free(c);
    c->data = data; c->out = out; c->n = n; c->nouts = 0; c->used = 0; c->epoch++;
    c->union_blocks = 0;
    c->error_kind = E_NONE; c->error_text[0] = 0;
    c->chunks = (int)((n + (size_t)c->k - 1) / (size_t)c->k);
    c->exps = malloc(sizeof(int32_t) * (size_t)(c->chunks ? c->chunks : 1));
    if (!c->exps) return -1;
    for (int j = 0; j < c->chunks; j++) c->exps[j] = EXP_UNKNOWN;
    if (lay_out(c, DLC_HDR + 4u * (size_t)c->k + DLC_TAG)) return -1;
    int np = c->npos;
    size_t need = 2 * (size_t)np * (DLC_HDR + 4u * (size_t)c->k + DLC_TAG) +
                  (size_t)CL_MAX_OUTS * 128 + 2 * 65600;
    if (need > c->cap) {   /* room for every position's packet twice (encrypted copies) */
        uint8_t *bigger = realloc(c->scratch, need);
        if (!bigger) return -1;
        c->scratch = bigger; c->cap = need;
    }
    c->active = 1;
    c->last_progress = now;
    for (int s = 0; s < c->nshards; s++) c->shards[s].holding = 0;
    for (int i = 0; i < c->npos; i++) arm(c, &c->pos[i], -1, EXP_ZERO, now);
    return 0;
}

/* Segmentation offload on (1) or off (0): one datagram per send and receive. */
void dlc_client_set_gso(dlc_client *c, int on) { c->gso = on; }
void dlc_client_set_results_fd(dlc_client *c, int fd) { c->rfd = fd; c->gro_on = 0; }

void dlc_client_allow_skew(dlc_client *c, double seconds) {
    for (int i = 0; i < c->npos; i++) c->pos[i].deadline += seconds;
}

int dlc_client_done(const dlc_client *c) {
    if (c->error_kind != E_NONE) return -1;
    for (int i = 0; i < c->npos; i++) if (!c->pos[i].done) return 0;
    return 1;
}

double dlc_client_next_deadline(const dlc_client *c) {
    double d = INFINITY;
    for (int i = 0; i < c->npos; i++) if (!c->pos[i].done && c->pos[i].deadline < d) d = c->pos[i].deadline;
    return d;
}

static void nonfinite(dlc_client *c) {
    c->error_kind = E_NONFINITE;
    c->error_arg = -1;
    for (int j = 0; j < c->chunks; j++)
        if (next_exp(c, j) == EXP_NONFINITE) { c->error_arg = (long)j * c->k; break; }
}

static void on_packet(dlc_client *c, int si, const dlc_hdr *h, const uint8_t *payload,
                      size_t plen, double now) {
    cl_pos *p = NULL;
    for (int i = 0; i < c->npos; i++)
        if (c->pos[i].shard == si && c->pos[i].slot == h->slot) { p = &c->pos[i]; break; }
    if (!p || p->done || c->error_kind != E_NONE) return;
    if (h->type == T_ERROR) {
        size_t n = plen < sizeof c->error_text - 1 ? plen : sizeof c->error_text - 1;
        memcpy(c->error_text, payload, n);
        c->error_text[n] = 0;
        c->error_arg = (long)n;
        c->error_shard = si;
        c->error_kind = E_SWITCH;
        return;
    }
    if (h->seq != (uint32_t)p->seq) return;
    if (h->type == T_STATUS) {
        uint64_t m = 0;
        memcpy(&m, payload, plen < 8 ? plen : 8);
        p->missing = m; p->has_missing = 1;
        p->complete_seen |= (h->flags & F_COMPLETE) != 0;
        p->retries = 0;
        c->shards[si].holding = 0;
        if ((m >> c->rank) & 1) {
            c->stats[S_RETX]++;
            send_pos(c, p, now, 0);
            return;
        }
        double wait;
        if (p->complete_seen) {
            wait = fmax(c->min_to, c->have_srtt ? c->srtt : 0.0);
        } else {
            p->waits++;
            wait = rtt_timeout(c, p->waits < 2 ? p->waits : 2);
            c->shards[si].holding = 1; c->shards[si].hold = wait;
        }
        p->deadline = now + wait;
        return;
    }
    if (h->type != T_RESULT) return;
    if (h->exp == EXP_NONFINITE) { nonfinite(c); return; }
    double sent_at = p->sent_at;
    int probed = p->probed, nxt;
    if (c->sparse) {
        if (!sparse_result(c, p, h, payload, plen, now)) return;   /* not this round's */
        c->shards[si].holding = 0;
        if (!probed) rtt_sample(c, now - sent_at);
        c->last_progress = now;
        return;
    }
    /* numel values, exactly: on_datagram's length check passes a RESULT flagged PROBE */
    if ((h->flags & F_SPARSE) || h->numel != p->numel || plen != 4u * h->numel) return;
    c->shards[si].holding = 0;
    if (p->chunk >= 0) {
        dequantize_into(c->out + p->tsi, (const int32_t *)(const void *)payload, h->numel,
                        p->e_used, c->log2n);
        if (c->count_block)   /* a chunk starts at a multiple of k, so of the block */
            c->union_blocks += present_blocks(c->out + p->tsi, h->numel, (size_t)c->count_block);
        nxt = p->chunk + c->npos;
    } else {
        nxt = p->index;
    }
    if (nxt >= c->chunks) p->done = 1;
    else arm(c, p, nxt, h->exp, now);
    if (!probed) rtt_sample(c, now - sent_at);
    c->last_progress = now;
}

static const uint8_t *open_datagram(dlc_client *c, cl_shard *s, const dlc_hdr *h,
                                    const uint8_t *buf, size_t len, size_t *plen) {
    if (c->auth == AUTH_NONE) { *plen = len - DLC_HDR; return buf + DLC_HDR; }
    if (h->worker != DLC_SWITCH_RANK) return NULL;
    int result = h->type == T_RESULT;
    uint8_t *plain = c->auth == AUTH_ENCRYPT ? c->scratch + c->cap - 65600 : NULL;
    if (dlc_open(c->crypto, result ? s->result : s->down, c->auth,
                 result ? STREAM_RESULT : STREAM_DOWN, h->counter, buf, len, plain))
        return NULL;
    if (!dlc_window_accept(result ? &s->w_result : &s->w_down, h->counter)) return NULL;
    *plen = len - DLC_HDR - DLC_TAG;
    return plain ? plain : buf + DLC_HDR;
}

/* A datagram from ip:port; what it makes this worker send goes to the outputs. */
void dlc_client_on_datagram(dlc_client *c, const uint8_t *buf, size_t len, uint32_t ip,
                            uint16_t port, double now) {
    dlc_hdr h;
    if (len < DLC_HDR) { c->stats[S_REJECTED]++; return; }
    dlc_hdr_unpack(buf, &h);
    if (h.magic != DLC_MAGIC || h.version != DLC_VERSION || h.type < T_DATA || h.type > T_CHALLENGE) {
        c->stats[S_REJECTED]++;
        return;
    }
    int si = -1;
    for (int s = 0; s < c->nshards; s++)
        if (c->shards[s].ip == ip && c->shards[s].port == port && c->shards[s].job == h.job) { si = s; break; }
    size_t plen = 0;
    const uint8_t *payload = si < 0 ? NULL : open_datagram(c, &c->shards[si], &h, buf, len, &plen);
    if (!payload || ((h.type == T_DATA || h.type == T_RESULT) && !(h.flags & (F_SPARSE | F_PROBE)) &&
                     plen != 4u * h.numel)) {
        c->stats[S_REJECTED]++;
        return;
    }
    on_packet(c, si, &h, payload, plen, now);
}

void dlc_client_on_timeout(dlc_client *c, double now) {
    if (now - c->last_progress > c->deadline_s) {
        c->error_kind = E_NO_ANSWER;
        for (int i = 0; i < c->npos; i++)
            if (!c->pos[i].done && c->pos[i].has_missing && c->pos[i].missing) { c->error_kind = E_STUCK; break; }
        return;
    }
    for (int s = 0; s < c->nshards; s++) c->shards[s].probed = 0;
    for (int i = 0; i < c->npos; i++) {
        cl_pos *p = &c->pos[i];
        if (!p->done && p->deadline <= now) {
            cl_shard *s = &c->shards[p->shard];
            if (s->holding && s->probed) { p->deadline = now + s->hold; continue; }
            s->probed = 1;
            p->retries++;
            c->stats[S_PROBES]++;
            send_pos(c, p, now, 1);
        }
    }
}

/* The error: kind, and its details (the first stuck position's, the switch's text). */
int dlc_client_error(const dlc_client *c, char *text, size_t cap, long *arg, int *shard,
                     uint64_t *missing, int *slot, uint64_t *seq, double *idle, double now) {
    *arg = c->error_arg; *shard = c->error_shard; *missing = 0; *slot = -1; *seq = 0;
    *idle = now - c->last_progress;
    if (c->error_kind == E_STUCK || c->error_kind == E_NO_ANSWER) {
        for (int i = 0; i < c->npos; i++) {
            const cl_pos *p = &c->pos[i];
            if (p->done) continue;
            if (c->error_kind == E_NO_ANSWER) { *shard = p->shard; break; }
            if (p->has_missing && p->missing) {
                *shard = p->shard; *missing = p->missing; *slot = p->slot; *seq = p->seq;
                break;
            }
        }
    }
    size_t n = (size_t)(c->error_kind == E_SWITCH ? c->error_arg : 0);
    if (n >= cap) n = cap - 1;
    memcpy(text, c->error_text, n);
    text[n] = 0;
    return c->error_kind;
}

/* The pure API's outputs, serialised as the switch's (ip, port, length, bytes). */
long dlc_client_take(dlc_client *c, uint8_t *out, size_t cap) {
    size_t w = 0;
    for (int i = 0; i < c->nouts; i++) {
        dlc_out *o = &c->outs[i];
        uint32_t n = (uint32_t)o->iov[0].iov_len;
        if (w + 10 + n > cap) return -1;
        memcpy(out + w, &o->ip, 4); memcpy(out + w + 4, &o->port, 2); memcpy(out + w + 6, &n, 4);
        memcpy(out + w + 10, o->iov[0].iov_base, n);
        w += 10 + n;
    }
    c->nouts = 0; c->used = 0; c->epoch++;
    return (long)w;
}

/* -- state shared with the Python ops of the same transport (sparse rounds) ------------ */
static void window_export(const dlc_window *w, uint64_t *highest, int *any, uint8_t *age_bits) {
    memset(age_bits, 0, DLC_WINDOW_BITS / 8);
    *highest = w->highest; *any = w->any;
    if (!w->any) return;
    for (uint64_t a = 0; a < DLC_WINDOW_BITS && a <= w->highest; a++) {
        uint64_t c = w->highest - a;
        if (w->bits[(c % DLC_WINDOW_BITS) / 64] >> (c % 64) & 1) age_bits[a / 8] |= (uint8_t)(1u << (a % 8));
    }
}

static void window_import(dlc_window *w, uint64_t highest, int any, const uint8_t *age_bits) {
    memset(w, 0, sizeof *w);
    w->highest = highest; w->any = any;
    if (!any) return;
    for (uint64_t a = 0; a < DLC_WINDOW_BITS && a <= highest; a++)
        if (age_bits[a / 8] >> (a % 8) & 1) {
            uint64_t c = highest - a;
            w->bits[(c % DLC_WINDOW_BITS) / 64] |= 1ull << (c % 64);
        }
}

/* which: 0 the up counter (next), 1 the result window, 2 the down window. */
void dlc_client_state_get(const dlc_client *c, int shard, uint64_t *up_next, uint64_t *rh,
                          int *ra, uint8_t *rbits, uint64_t *dh, int *da, uint8_t *dbits,
                          uint64_t *seqs) {
    const cl_shard *s = &c->shards[shard];
    *up_next = s->up_next;
    window_export(&s->w_result, rh, ra, rbits);
    window_export(&s->w_down, dh, da, dbits);
    memcpy(seqs, s->seqs, 8u * (size_t)s->slots);
}

void dlc_client_state_set(dlc_client *c, int shard, uint64_t up_next, uint64_t rh, int ra,
                          const uint8_t *rbits, uint64_t dh, int da, const uint8_t *dbits,
                          const uint64_t *seqs) {
    cl_shard *s = &c->shards[shard];
    s->up_next = up_next;
    window_import(&s->w_result, rh, ra, rbits);
    window_import(&s->w_down, dh, da, dbits);
    memcpy(s->seqs, seqs, 8u * (size_t)s->slots);
}

void dlc_client_stats(const dlc_client *c, uint64_t *out) { memcpy(out, c->stats, sizeof c->stats); }

/* -- the socket loop -------------------------------------------------------------------- */
static int dropped(dlc_client *c) {
    if (!dlc_coin(&c->rng, c->drop_rate)) return 0;
    c->stats[S_DROPS]++;
    return 1;
}

/* Send outputs[from, to) (one address, one size) as one UDP_SEGMENT datagram: 0, 1 (the
 * segments exceed the path's frame: send them plain), 2 (refused: no GSO on this path, or
 * an address the kernel refuses either way; flush tells them apart), or -errno. */
static int send_gso(dlc_client *c, int from, int to) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(c->outs[from].port),
                               .sin_addr.s_addr = htonl(c->outs[from].ip)};
    struct iovec iov[64];
    int n = to - from;
    size_t seg = c->outs[from].iov[0].iov_len, total = 0;
    for (int i = 0; i < n; i++) { iov[i] = c->outs[from + i].iov[0]; total += iov[i].iov_len; }
    char ctrl[DLC_SEG_CTRL];
    struct msghdr m = {.msg_name = &addr, .msg_namelen = sizeof addr, .msg_iov = iov,
                       .msg_iovlen = (size_t)n};
    dlc_segment(&m, ctrl, seg);
    for (;;) {
        ssize_t r = sendmsg(c->fd, &m, 0);
        if (r >= 0) {
            c->stats[S_SENT] += (uint64_t)n; c->stats[S_BSENT] += (uint64_t)r;
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == ENOBUFS) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
            poll(&pfd, 1, 10);
            continue;
        }
        if (errno == EIO || errno == EINVAL) return 2;   /* no GSO here, or a bad address */
        if (errno == EMSGSIZE) { c->gso_max = seg; return 1; }   /* segments beyond a frame */
        return -errno;
    }
}

static int send_plain(dlc_client *c, int from, int to) {
    static _Thread_local struct mmsghdr msgs[CL_MAX_OUTS];
    static _Thread_local struct sockaddr_in addrs[CL_MAX_OUTS];
    int m = 0;
    for (int i = from; i < to; i++) {
        memset(&addrs[m], 0, sizeof addrs[m]);
        addrs[m].sin_family = AF_INET;
        addrs[m].sin_addr.s_addr = htonl(c->outs[i].ip);
        addrs[m].sin_port = htons(c->outs[i].port);
        memset(&msgs[m], 0, sizeof msgs[m]);
        msgs[m].msg_hdr.msg_name = &addrs[m]; msgs[m].msg_hdr.msg_namelen = sizeof addrs[m];
        msgs[m].msg_hdr.msg_iov = c->outs[i].iov; msgs[m].msg_hdr.msg_iovlen = 1;
        m++;
    }
    int done = 0;
    while (done < m) {
        int r = sendmmsg(c->fd, msgs + done, (unsigned)(m - done), 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == ENOBUFS) {   /* the socket buffer is full: wait */
                struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
                poll(&pfd, 1, 10);
                continue;
            }
            return -errno;
        }
        for (int i = done; i < done + r; i++) { c->stats[S_SENT]++; c->stats[S_BSENT] += msgs[i].msg_len; }
        done += r;
    }
    return 0;
}

/* A socket that failed the op (E_SOCKET, its errno): -1, as a failed op. The first error
 * stays (a send error found while flushing a full queue too, whose caller goes on). */
static int socket_error(dlc_client *c, int err, int shard) {
    if (c->error_kind == E_NONE) {
        c->error_kind = E_SOCKET; c->error_arg = err; c->error_shard = shard;
    }
    return -1;
}

/* Send the outputs: runs of one address and one size (up to 64 KB) as one UDP_SEGMENT
 * datagram each, where the kernel takes them; the rest with sendmmsg. */
static int flush(dlc_client *c) {
    int w = 0;
    for (int i = 0; i < c->nouts; i++) if (!dropped(c)) c->outs[w++] = c->outs[i];
    int r = 0, i = 0, at = 0;
    while (i < w && r >= 0) {
        int j = i + 1;
        at = i;
        size_t seg = c->outs[i].iov[0].iov_len, total = seg;
        if (c->gso && seg < c->gso_max)
            while (j < w && j - i < 64 && c->outs[j].ip == c->outs[i].ip &&
                   c->outs[j].port == c->outs[i].port && c->outs[j].iov[0].iov_len == seg &&
                   total + seg <= 65000) { total += seg; j++; }
        if (j - i > 1) {
            r = send_gso(c, i, j);
            if (r == 2) {   /* plain sends that pass mean no GSO on this path */
                r = send_plain(c, i, j);
                if (r >= 0) c->gso = 0;
            } else if (r == 1) {
                r = send_plain(c, i, j);
            }
        } else {
            r = send_plain(c, i, j);
        }
        i = j;
    }
    c->nouts = 0; c->used = 0; c->epoch++;
    if (r >= 0) return 0;
    int shard = 0;   /* the shard of the output that failed (one address per send) */
    for (int s = 0; s < c->nshards; s++)
        if (c->shards[s].ip == c->outs[at].ip && c->shards[s].port == c->outs[at].port) {
            shard = s;
            break;
        }
    return socket_error(c, -r, shard);
}

/* Receive what is waiting on fd (without blocking) and hand it to the op: how many
 * datagrams (GRO batches) were read, or 0. */
static int drain(dlc_client *c, int fd) {
    struct mmsghdr msgs[RX_BATCH];
    struct iovec iovs[RX_BATCH];
    struct sockaddr_in addrs[RX_BATCH];
    char ctrl[RX_BATCH][64];
    dlc_rx_prepare(msgs, iovs, addrs, ctrl, c->rx, 65536, RX_BATCH);
    int n = recvmmsg(fd, msgs, RX_BATCH, MSG_DONTWAIT, NULL);
    if (n <= 0) return 0;
    double now = dlc_now();
    for (int i = 0; i < n; i++) {
        size_t len = msgs[i].msg_len, seg = dlc_gro_segment(&msgs[i].msg_hdr, len);
        uint32_t ip = ntohl(addrs[i].sin_addr.s_addr);
        uint16_t port = ntohs(addrs[i].sin_port);
        for (size_t off = 0; off < len; off += seg) {
            size_t part = len - off < seg ? len - off : seg;
            if (dropped(c)) continue;
            c->stats[S_RECV]++;
            c->stats[S_BRECV] += part;
            dlc_client_on_datagram(c, c->rx + (size_t)i * 65536 + off, part, ip, port, now);
        }
    }
    return n;
}

/* Run the op for up to slice_s: returns dlc_client_done()'s answer (1 done, 0 not yet,
 * -1 failed: a socket's error fails the op as E_SOCKET, with its errno). The caller checks
 * its control channel between slices. Datagrams come on the worker's socket and, where the
 * job's results come to a group of their own, on that one. */
int dlc_client_run(dlc_client *c, double slice_s) {
    int one = 1, fds[2] = {c->fd, c->rfd}, nfds = c->rfd >= 0 ? 2 : 1;
    /* results of a batch arrive whole (UDP_GRO). It stays on after the op: a batch already
     * queued whole would stay whole if it were turned off, so a Python op on the same
     * socket (sparse rounds with a threshold) cuts batches itself (switch/receiver.py) */
    if (c->gso && !c->gro_on) {
        for (int f = 0; f < nfds; f++) setsockopt(fds[f], SOL_UDP, UDP_GRO, &one, sizeof one);
        c->gro_on = 1;
    }
    double until = dlc_now() + slice_s;
    int r = flush(c), state = 0;
    while (r >= 0) {
        state = dlc_client_done(c);
        if (state) break;
        double now = dlc_now();
        if (now >= until) break;
        double wait = dlc_client_next_deadline(c) - now;
        if (wait <= 0) {
            dlc_client_on_timeout(c, now);
            r = flush(c);
            continue;
        }
        if (wait > until - now) wait = until - now;
        int got = 0;
        for (int f = 0; f < nfds && !(f && dlc_client_done(c)); f++) got += drain(c, fds[f]);
        if (!got) {
            struct pollfd pfd[2] = {{.fd = fds[0], .events = POLLIN},
                                    {.fd = fds[1], .events = POLLIN}};
            int ms = (int)ceil(wait * 1000);
            if (poll(pfd, (nfds_t)nfds, ms < 1 ? 1 : ms) > 0 &&
                ((pfd[0].revents | (nfds > 1 ? pfd[1].revents : 0)) & POLLNVAL)) {
                r = socket_error(c, EBADF, 0);   /* a socket closed under the op: never spin */
                break;
            }
            continue;
        }
        r = flush(c);
    }
    return r < 0 ? -1 : state;
}

/* -- the worker's sparse rounds (exchange/switch/sparse_window.py) ---------------------- */
static int log2_workers(int workers) {
    int l = 1;
    while ((1 << l) < workers) l++;
    return l;
}

/* An agreed exponent as an int without overflow: beyond +-1000 every scale is already 0 or
 * infinite (a switch agrees on valid exponents only: wire/quant.valid_exponent). */
static int sane_exp(int64_t e) {
    if (e == EXP_ZERO) return EXP_ZERO;
    return e > 1000 ? 1000 : e < -1000 ? -1000 : (int)e;
}

/* The present blocks (mask: chunks x m, row-major) of the groups `groups`, gathered from x
 * (n floats, the partial last block zero-padded) and quantized, each group with its agreed
 * exponent: into q, b int32 per block. Returns the number of blocks. */
long dlc_sparse_quantize(const float *x, size_t n, int b, int m, const int64_t *groups,
                         int ng, const uint8_t *mask, const int64_t *exps, int workers,
                         int32_t *q) {
    int log2n = log2_workers(workers);
    int32_t limit = (int32_t)((1u << (31 - log2n)) - 1);
    long rows = 0;
    for (int i = 0; i < ng; i++) {
        const uint8_t *row = mask + (size_t)groups[i] * (size_t)m;
        for (int j = 0; j < m; j++) {
            if (!row[j]) continue;
            size_t start = ((size_t)groups[i] * (size_t)m + (size_t)j) * (size_t)b;
            size_t len = start >= n ? 0 : n - start < (size_t)b ? n - start : (size_t)b;
            int32_t *out = q + (size_t)rows * (size_t)b;
            quantize_into(out, x + start, len, sane_exp(exps[i]), log2n, limit);
            if (len < (size_t)b) memset(out + len, 0, 4 * ((size_t)b - len));   /* zeros */
            rows++;
        }
    }
    return rows;
}

/* A result's summed blocks (mask: nseg x m) dequantized into out (n floats), group by
 * group with its agreed exponent, blocks in order; a block past the tensor's last whole
 * block goes to its tail, the first such one only (as the specification writes it). */
void dlc_sparse_dequantize(float *out, size_t n, int b, int m, const int64_t *groups,
                           int nseg, const uint8_t *mask, const int32_t *values,
                           const int64_t *exps, int workers) {
    int log2n = log2_workers(workers);
    size_t full = n / (size_t)b, rows = 0;
    int tail = 0;
    for (int i = 0; i < nseg; i++)
        for (int j = 0; j < m; j++) {
            if (!mask[(size_t)i * (size_t)m + (size_t)j]) continue;
            size_t blk = (size_t)groups[i] * (size_t)m + (size_t)j;
            const int32_t *v = values + rows++ * (size_t)b;
            if (blk < full)
                dequantize_into(out + blk * (size_t)b, v, (size_t)b, sane_exp(exps[i]), log2n);
            else if (!tail++)
                dequantize_into(out + full * (size_t)b, v, n - full * (size_t)b,
                                sane_exp(exps[i]), log2n);
        }
}

/* One pass over x (n floats) per block of b: the block's peak max |x| (its bits: NaN and
 * infinities order above every finite magnitude), whether it holds a value other than +-0
 * (NaN included), and whether it holds only +-0 with at least one -0.0 (wire/sparse.py's
 * present_blocks and block_peaks in one read). The partial last block counts too. */
DLC_CLONES
void dlc_sparse_scan(const float *x, size_t n, int b, uint8_t *present, uint8_t *negative_zero,
                     float *peaks) {
    const uint32_t *restrict u = (const uint32_t *)(const void *)x;
    size_t blocks = (n + (size_t)b - 1) / (size_t)b;
    for (size_t i = 0; i < blocks; i++) {
        size_t lo = i * (size_t)b, hi = lo + (size_t)b < n ? lo + (size_t)b : n;
        uint32_t peak = 0, any = 0;
        for (size_t j = lo; j < hi; j++) {
            uint32_t a = u[j] & 0x7fffffffu;
            peak = a > peak ? a : peak;
            any |= u[j];
        }
        present[i] = peak != 0;
        negative_zero[i] = peak == 0 && any != 0;
        memcpy(&peaks[i], &peak, 4);
    }
}

/* -- the worker's sparse op (sparse_window.SparseAllreduceOp, rule for rule) ------------- */
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* The position's look-ahead (its next LOOKAHEAD groups from the cursor) at `at`: rows of
 * group, exponent, mask words. Returns the bytes written. */
static size_t write_look(const dlc_client *c, int index, uint8_t *at, uint32_t *rows) {
    int from = c->cursor[index], left = c->mine_cnt[index] - from;
    int n = left < DLC_LOOKAHEAD ? left : DLC_LOOKAHEAD;
    const int *g = c->mine + c->mine_off[index] + from;
    uint8_t *p = at;
    for (int i = 0; i < n; i++) {
        wr32(p, (uint32_t)g[i]); wr32(p + 4, (uint32_t)c->exps[g[i]]);
        memcpy(p + 8, c->packed + (size_t)g[i] * (size_t)c->words, 4u * (size_t)c->words);
        p += 8 + 4u * (size_t)c->words;
    }
    *rows = (uint32_t)n;
    return (size_t)(p - at);
}

static void sparse_header(cl_pos *p, uint16_t numel, uint32_t tsi, uint8_t flags) {
    p->numel = numel; p->tsi = tsi; p->exp_announced = EXP_ZERO; p->flags = flags;
}

/* An announce round: no values, this worker's look-ahead. */
static void sparse_announce(dlc_client *c, cl_pos *p, double now) {
    next_round(c, p);
    p->chunk = -1; p->nplan = 0; p->in_run = 0;
    uint8_t *body = p->pkt + DLC_HDR;
    uint32_t rows;
    size_t head = write_look(c, p->index, body + 12, &rows);
    wr32(body, 0); wr32(body + 4, rows); wr32(body + 8, 0);
    p->plen = 12 + head;
    sparse_header(p, 0, (uint32_t)(c->n & 0xFFFFFFFFu), F_SPARSE | F_ANNOUNCE);
    send_pos(c, p, now, 0);
}

static int32_t plan_exp(const cl_pos *p, int64_t g, int *found) {
    int lo = 0, hi = p->nplan;   /* plan_g sorted */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (p->plan_g[mid] < g) lo = mid + 1; else hi = mid;
    }
    *found = lo < p->nplan && p->plan_g[lo] == g;
    return *found ? p->plan_e[lo] : 0;
}

/* This worker's blocks of the planned groups it has (its groups up to the plan's last),
 * quantized each with its group's agreed exponent, and its next look-ahead. */
static void sparse_send_groups(dlc_client *c, cl_pos *p, double now) {
    next_round(c, p);
    int index = p->index, from = c->cursor[index], sel = 0;
    const int *g = c->mine + c->mine_off[index] + from;
    int64_t top = p->plan_g[p->nplan - 1];
    while (from + sel < c->mine_cnt[index] && g[sel] <= top) sel++;
    size_t w = (size_t)c->words, b = (size_t)c->block;
    uint8_t *body = p->pkt + DLC_HDR;
    /* the values first (after room for the largest head: the look-ahead is written last,
     * once the cursor has moved), then everything is laid out in order */
    size_t head_room = 12 + (size_t)DLC_LOOKAHEAD * (8 + 4 * w) + (size_t)sel * (4 + 4 * w);
    int32_t *q = (int32_t *)(void *)(body + head_room);
    size_t rows = 0;
    for (int i = 0; i < sel; i++) {
        int found;
        int32_t e = plan_exp(p, g[i], &found);
        const uint8_t *mask = c->gmask + (size_t)g[i] * (size_t)c->m;
        for (int j = 0; j < c->m; j++) {
            if (!mask[j]) continue;
            size_t start = ((size_t)g[i] * (size_t)c->m + (size_t)j) * b;
            size_t len = start >= c->n ? 0 : c->n - start < b ? c->n - start : b;
            quantize_into(q + rows * b, c->data + start, len, sane_exp(e), c->log2n, c->limit);
            if (len < b) memset(q + rows * b + len, 0, 4 * (b - len));
            rows++;
        }
    }
    c->cursor[index] += sel;
    uint32_t nhead;
    size_t head = write_look(c, index, body + 12, &nhead);
    uint8_t *at = body + 12 + head;
    for (int i = 0; i < sel; i++) wr32(at + 4u * (size_t)i, (uint32_t)g[i]);
    at += 4u * (size_t)sel;
    for (int i = 0; i < sel; i++) memcpy(at + 4 * w * (size_t)i, c->packed + (size_t)g[i] * w, 4 * w);
    at += 4 * w * (size_t)sel;
    memmove(at, q, 4 * rows * b);
    wr32(body, (uint32_t)sel); wr32(body + 4, nhead); wr32(body + 8, sel ? (uint32_t)c->m : 0);
    p->plen = (size_t)(at - body) + 4 * rows * b;
    p->chunk = (int)p->plan_g[0];
    sparse_header(p, (uint16_t)(rows * b), (uint32_t)((uint64_t)p->plan_g[0] * (uint64_t)c->k),
                  F_SPARSE);
    send_pos(c, p, now, 0);
}

/* The next group of a dense run, as a plain dense round announcing the run's next one. */
static void sparse_dense_round(dlc_client *c, cl_pos *p, int e_max, double now) {
    int group = (int)p->run_g[p->run_at++];
    c->cursor[p->index]++;
    int32_t following = p->run_at < p->nrun ? c->exps[p->run_g[p->run_at]] : EXP_ZERO;
    arm_with(c, p, group, e_max, now, following);
}

static int by_group(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A result's plan (group, exponent rows; a group listed twice keeps its last exponent, as
 * a dict does) into the position's sorted plan. 0, or -1 out of memory. */
static int take_plan(cl_pos *p, const dlc_sparse_view *v) {
    int n = (int)v->nhead;
    int64_t *g = realloc(p->plan_g, (size_t)(n ? n : 1) * sizeof *g);
    if (g) p->plan_g = g;
    int32_t *e = realloc(p->plan_e, (size_t)(n ? n : 1) * sizeof *e);
    if (e) p->plan_e = e;
    int64_t *keys = malloc((size_t)(n ? n : 1) * 2 * sizeof *keys);
    if (!g || !e || !keys) { free(keys); return -1; }
    for (int i = 0; i < n; i++) {   /* (group, row): sort, then keep each group's last row */
        keys[2 * i] = (int64_t)rd32(v->head + 8u * (size_t)i);
        keys[2 * i + 1] = i;
    }
    qsort(keys, (size_t)n, 2 * sizeof *keys, by_group);   /* by group, then by row */
    int out = 0;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && keys[2 * (i + 1)] == keys[2 * i]) continue;
        p->plan_g[out] = keys[2 * i];
        p->plan_e[out] = (int32_t)rd32(v->head + 8u * (size_t)keys[2 * i + 1] + 4);
        out++;
    }
    p->nplan = out;
    free(keys);
    return 0;
}

static void plan_error(dlc_client *c, const cl_pos *p) {
    int len = snprintf(c->error_text, sizeof c->error_text, "the switch planned groups [");
    for (int i = 0; i < p->nplan && i < 4; i++)
        len += snprintf(c->error_text + len, sizeof c->error_text - (size_t)len, "%s%lld",
                        i ? ", " : "", (long long)p->plan_g[i]);
    snprintf(c->error_text + len, sizeof c->error_text - (size_t)len,
             "] for window position %d: the workers' tensors differ", p->index);
    c->error_arg = (long)strlen(c->error_text);
    c->error_kind = E_PLAN;
    c->error_shard = p->shard;
}

/* sparse_window._on_result: 0 if the datagram is not this round's result. */
static int sparse_result(dlc_client *c, cl_pos *p, const dlc_hdr *h, const uint8_t *payload,
                         size_t plen, double now) {
    if (!(h->flags & F_SPARSE)) {   /* a dense round of a run */
        if (p->chunk < 0 || !p->in_run || h->numel != p->numel || plen != 4u * h->numel)
            return 0;
        dequantize_into(c->out + (size_t)p->chunk * (size_t)c->k,
                        (const int32_t *)(const void *)payload, h->numel, p->e_used, c->log2n);
        c->union_blocks += c->m;   /* a run's groups are full on every worker */
        if (p->run_at < p->nrun) sparse_dense_round(c, p, h->exp, now);
        else { p->in_run = 0; sparse_announce(c, p, now); }
        return 1;
    }
    dlc_sparse_view v;
    if (dlc_sparse_decode(payload, plen, h->numel, c->block, 2, &v)) return 0;
    if (v.nseg && v.m != (uint32_t)c->m) return 0;
    for (uint32_t i = 0; i < v.nseg; i++) {   /* groups of the round it planned */
        int found;
        plan_exp(p, rd32(v.groups + 4u * i), &found);
        if (!found) return 0;
    }
    size_t b = (size_t)c->block, full = c->n / b, rows = 0;
    int tail = 0;
    for (uint32_t i = 0; i < v.nseg; i++) {   /* the sums, each group with its exponent */
        int found;
        int64_t g = rd32(v.groups + 4u * i);
        int e = sane_exp(plan_exp(p, g, &found));
        for (int j = 0; j < c->m; j++) {
            if (!(rd32(v.masks + 4u * ((size_t)i * (size_t)c->words + (size_t)j / 32)) >> (j % 32) & 1))
                continue;
            size_t blk = (size_t)g * (size_t)c->m + (size_t)j;
            const int32_t *t = (const int32_t *)(const void *)(v.values + 4 * b * rows++);
            if (blk < full) dequantize_into(c->out + blk * b, t, b, e, c->log2n);
            else if (!tail++) dequantize_into(c->out + full * b, t, c->n - full * b, e, c->log2n);
            c->union_blocks++;
        }
    }
    if (take_plan(p, &v)) { p->nplan = 0; c->error_kind = E_NO_ANSWER; return 1; }
    if (!p->nplan) { p->done = 1; return 1; }
    for (int i = 0; i < p->nplan; i++)
        if (p->plan_e[i] == EXP_NONFINITE) { nonfinite(c); return 1; }
    for (int i = 0; i < p->nplan; i++)
        if (p->plan_g[i] >= c->chunks || p->plan_g[i] % c->npos != p->index) {
            plan_error(c, p);
            return 1;
        }
    if (h->flags & F_RUN) {
        int64_t *rg = realloc(p->run_g, (size_t)p->nplan * sizeof *rg);
        if (rg) p->run_g = rg;
        int32_t *re = realloc(p->run_e, (size_t)p->nplan * sizeof *re);
        if (re) p->run_e = re;
        if (!rg || !re) { c->error_kind = E_NO_ANSWER; return 1; }
        memcpy(p->run_g, p->plan_g, (size_t)p->nplan * sizeof *rg);
        memcpy(p->run_e, p->plan_e, (size_t)p->nplan * sizeof *re);
        p->nrun = p->nplan; p->run_at = 0; p->in_run = 1;
        sparse_dense_round(c, p, p->run_e[0], now);
        return 1;
    }
    int index = p->index;   /* every group this worker sends is planned, in one datagram */
    const int *g = c->mine + c->mine_off[index] + c->cursor[index];
    long blocks = 0;
    for (int i = 0; c->cursor[index] + i < c->mine_cnt[index] && g[i] <= p->plan_g[p->nplan - 1]; i++) {
        int found;
        plan_exp(p, g[i], &found);
        for (int j = 0; j < c->m; j++) blocks += c->gmask[(size_t)g[i] * (size_t)c->m + (size_t)j];
        if (!found || blocks > c->m) { plan_error(c, p); return 1; }
    }
    sparse_send_groups(c, p, now);
    return 1;
}

/* Begin summing data[0:n] into out (which may be data) in sparse rounds of blocks of
 * `block` (threshold 0). present/negative_zero (one byte per block, or NULL: this call
 * scans the data) are wire/sparse.present_blocks'. Outputs: the announce rounds. 0, -1
 * out of memory, -2 a block that does not divide k. */
int dlc_client_begin_sparse(dlc_client *c, float *data, float *out, size_t n, int block,
                            const uint8_t *present_in, const uint8_t *negzero_in, double now) {
    if (block < 1 || c->k % block) return -2;
    if (dlc_client_begin(c, data, out, 0, now)) return -1;   /* frees the last op */
    c->nouts = 0; c->used = 0; c->epoch++;
    c->data = data; c->out = out; c->n = n; c->sparse = 1; c->block = block;
    c->m = c->k / block; c->words = (c->m + 31) / 32; c->union_blocks = 0;
    size_t b = (size_t)block, blocks = (n + b - 1) / b;
    c->chunks = (int)((n + (size_t)c->k - 1) / (size_t)c->k);
    size_t chunks = (size_t)c->chunks, m = (size_t)c->m;
    uint8_t *present = malloc(blocks + 1), *negzero = malloc(blocks + 1);
    uint32_t *peaks = malloc(4 * (blocks + 1));
    free(c->exps);
    c->exps = malloc(4 * (chunks + 1));
    c->gmask = calloc(chunks * m + 1, 1);
    c->packed = calloc(chunks * (size_t)c->words + 1, 4);
    if (!present || !negzero || !peaks || !c->exps || !c->gmask || !c->packed) {
        free(present); free(negzero); free(peaks);
        return -1;
    }
    if (present_in) {   /* the caller's pass: the peaks of the present blocks only */
        memcpy(present, present_in, blocks); memcpy(negzero, negzero_in, blocks);
        const uint32_t *u = (const uint32_t *)(const void *)data;
        for (size_t i = 0; i < blocks; i++) {
            uint32_t peak = 0;
            size_t lo = i * b, hi = lo + b < n ? lo + b : n;
            for (size_t j = lo; present[i] && j < hi; j++) {
                uint32_t a = u[j] & 0x7fffffffu;
                peak = a > peak ? a : peak;
            }
            peaks[i] = peak;
        }
    } else {
        dlc_sparse_scan(data, n, block, present, negzero, (float *)(void *)peaks);
    }
    for (size_t i = 0; i < blocks; i++) {   /* absent blocks holding a -0.0 become +0.0 */
        if (!present[i] && negzero[i]) {
            size_t lo = i * b, hi = lo + b < n ? lo + b : n;
            memset(data + lo, 0, 4 * (hi - lo));
        }
        c->gmask[i] = present[i];
    }
    for (size_t g = 0; g < chunks; g++) {
        uint32_t peak = 0;
        for (size_t j = 0; j < m; j++) {
            size_t i = g * m + j;
            if (i < blocks && peaks[i] > peak) peak = peaks[i];
            if (c->gmask[i]) c->packed[g * (size_t)c->words + j / 32] |= 1u << (j % 32);
        }
        c->exps[g] = exp_of_bits(peak);
    }
    free(present); free(negzero); free(peaks);
    /* positions, as dense mode lays them out, and each one's groups with data */
    free(c->pos);
    if (lay_out(c, DLC_MAX_DGRAM + DLC_HDR + DLC_TAG)) return -1;
    int np = c->npos;
    int count = np > 0 ? np : 1;
    c->mine = malloc(sizeof(int) * (chunks + 1));
    c->mine_off = calloc((size_t)count, sizeof(int));
    c->mine_cnt = calloc((size_t)count, sizeof(int));
    c->cursor = calloc((size_t)count, sizeof(int));
    if (!c->mine || !c->mine_off || !c->mine_cnt || !c->cursor) return -1;
    int at = 0;
    for (int i = 0; i < count; i++) {
        c->mine_off[i] = at;
        for (size_t g = (size_t)i; g < chunks; g += (size_t)count) {
            int any = 0;
            for (int w = 0; w < c->words; w++) any |= c->packed[g * (size_t)c->words + (size_t)w] != 0;
            if (any) c->mine[at++] = (int)g;
        }
        c->mine_cnt[i] = at - c->mine_off[i];
    }
    size_t need = 3 * (size_t)np * (DLC_MAX_DGRAM + 64) + (size_t)CL_MAX_OUTS * 128 + 2 * 65600;
    if (need > c->cap) {
        uint8_t *bigger = realloc(c->scratch, need);
        if (!bigger) return -1;
        c->scratch = bigger; c->cap = need;
    }
    c->active = 1;
    c->last_progress = now;
    for (int i = 0; i < c->npos; i++) sparse_announce(c, &c->pos[i], now);
    return 0;
}

long dlc_client_union_blocks(const dlc_client *c) { return c->union_blocks; }
