/* The switch dataplane of dlcomm/switch/dataplane.py for dense jobs, rule for rule, with the
 * same counters and drop reasons. A datagram of a job the Python dataplane serves (sparse
 * jobs, jobs of more than 64 workers) goes to the slow path untouched.
 *
 * Concurrency: the job table is read-locked around a datagram; a slot's two copies are
 * under the slot's mutex; each rank's replay window under its own; send counters are
 * atomic. Tags are checked outside every lock. A completed round's result is sealed in
 * place (its accumulator lives in the frame) and sent at once, under the slot's mutex, so
 * no later round can touch the frame while it is on its way. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "dlc.h"
#include "rx.h"

#define ADD(ctr, n) __atomic_fetch_add(&(ctr), (n), __ATOMIC_RELAXED)
#define ERROR_REPLY_INTERVAL_S 0.1

void dlc_hdr_pack(uint8_t *o, const dlc_hdr *h) {
    memcpy(o, &h->magic, 2); o[2] = h->version; o[3] = h->type;
    memcpy(o + 4, &h->job, 2); memcpy(o + 6, &h->worker, 2); memcpy(o + 8, &h->slot, 2);
    memcpy(o + 10, &h->numel, 2); memcpy(o + 12, &h->seq, 4); memcpy(o + 16, &h->tsi, 4);
    memcpy(o + 20, &h->exp, 2); o[22] = h->flags; o[23] = h->resv; memcpy(o + 24, &h->counter, 8);
}

void dlc_hdr_unpack(const uint8_t *i, dlc_hdr *h) {
    memcpy(&h->magic, i, 2); h->version = i[2]; h->type = i[3];
    memcpy(&h->job, i + 4, 2); memcpy(&h->worker, i + 6, 2); memcpy(&h->slot, i + 8, 2);
    memcpy(&h->numel, i + 10, 2); memcpy(&h->seq, i + 12, 4); memcpy(&h->tsi, i + 16, 4);
    memcpy(&h->exp, i + 20, 2); h->flags = i[22]; h->resv = i[23]; memcpy(&h->counter, i + 24, 8);
}

double dlc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


static int older(uint32_t seq, int64_t current) {
    if (current < 0) return 0;
    uint32_t d = (uint32_t)current - seq;
    return d > 0 && d < (1u << 31);
}

static int64_t next_of(int64_t current, uint32_t seq) {
    if (current < 0) return seq < 2 ? (int64_t)seq : -1;
    return (uint32_t)(current + 2);
}

static int drop(dlc_ctx *ctx, dlc_job *job, int reason) {
    DLC_BUMP(ctx->counters[reason], 1);
    if (job) ADD(job->counters[reason], 1);
    return 0;
}

/* -- outputs ------------------------------------------------------------------------- */
static uint8_t *out_room(dlc_outs *o, size_t n) {
    if (o->n >= DLC_MAX_OUTS || o->used + n > o->cap) return NULL;
    uint8_t *p = o->scratch + o->used;
    o->used += n;
    return p;
}

static int tag_size(const dlc_job *job) { return job->auth == AUTH_NONE ? 0 : DLC_TAG; }

/* Seal header + body into one contiguous datagram at `dst` (room for the tag after it):
 * returns its length. `dst` may hold the body already at dst + 32 (then body == NULL). */
static size_t seal_into(dlc_ctx *ctx, dlc_job *job, dlc_hdr *h, int to, const uint8_t *body,
                        size_t blen, uint8_t *dst, uint8_t *cipher) {
    uint32_t stream = h->type == T_RESULT ? STREAM_RESULT : STREAM_DOWN;
    uint64_t *ctr = stream == STREAM_RESULT ? &job->result_sent : &job->down_sent[to];
    const uint8_t *key = stream == STREAM_RESULT ? job->result : job->down[to];
    h->counter = ADD(*ctr, 1);
    h->magic = DLC_MAGIC; h->version = DLC_VERSION; h->resv = 0;
    dlc_hdr_pack(dst, h);
    if (body && blen) memcpy(dst + DLC_HDR, body, blen);
    size_t len = DLC_HDR + blen;
    if (job->auth == AUTH_NONE) return len;
    uint8_t *out = job->auth == AUTH_ENCRYPT && cipher ? cipher : dst;
    if (out != dst) memcpy(out, dst, DLC_HDR);
    dlc_seal(ctx->crypto, key, job->auth, stream, h->counter, dst, len, out, out + len);
    return len + DLC_TAG;
}

static int emit(dlc_ctx *ctx, dlc_job *job, dlc_hdr *h, int to, const uint8_t *body,
                size_t blen, uint32_t ip, uint16_t port) {
    uint8_t *dst = out_room(&ctx->outs, DLC_HDR + blen + DLC_TAG);
    if (!dst) return drop(ctx, job, C_send_errors);
    dlc_out *o = &ctx->outs.out[ctx->outs.n++];
    o->ip = ip; o->port = port; o->niov = 1;
    o->iov[0].iov_base = dst;
    o->iov[0].iov_len = seal_into(ctx, job, h, to, body, blen, dst, dst);
    return 1;
}

/* One answer to the packet of `size` bytes, if it is no larger (a probe pads itself). */
static int answer(dlc_ctx *ctx, dlc_job *job, dlc_hdr *h, int to, const uint8_t *body,
                  size_t blen, size_t size, uint32_t ip, uint16_t port) {
    if (DLC_HDR + blen + (size_t)tag_size(job) > size)
        return drop(ctx, job, C_drop_answer_too_large);
    return emit(ctx, job, h, to, body, blen, ip, port);
}

static int status(dlc_ctx *ctx, dlc_job *job, int slot, uint32_t seq, uint64_t waiting,
                  int complete, int to, size_t size, uint32_t ip, uint16_t port) {
    dlc_hdr h = {.type = T_STATUS, .job = job->id, .worker = DLC_SWITCH_RANK,
                 .slot = (uint16_t)slot, .seq = seq, .flags = complete ? F_COMPLETE : 0};
    uint8_t bits[8];
    memcpy(bits, &waiting, 8);
    return answer(ctx, job, &h, to, bits, (size_t)(job->workers + 7) / 8, size, ip, port);
}

static dlc_hdr result_header(dlc_job *job, int slot, const dlc_copy *c) {
    dlc_hdr h = {.type = T_RESULT, .job = job->id, .worker = DLC_SWITCH_RANK,
                 .slot = (uint16_t)slot, .numel = c->numel, .seq = (uint32_t)c->seq,
                 .tsi = c->tsi, .exp = (int16_t)c->exp,
                 .flags = c->sparse ? F_SPARSE | (c->run ? F_RUN : 0) : 0};
    return h;
}

/* A result's frame (header room, body, tag room), its ciphertext frame and body length:
 * a dense result's body is its accumulator, a sparse one's its encoded payload. */
static uint8_t *result_frame(dlc_copy *c, uint8_t **cipher, size_t *blen) {
    if (c->sparse) { *cipher = c->sp->cipher; *blen = c->sp->len; return c->sp->frame; }
    *cipher = c->cipher; *blen = 4u * c->numel;
    return c->frame;
}

/* A result sent again to one rank: a copy (the frame may be on its way elsewhere). */
static int resend(dlc_ctx *ctx, dlc_job *job, int slot, dlc_copy *c, int to, size_t size,
                  uint32_t ip, uint16_t port) {
    dlc_hdr h = result_header(job, slot, c);
    uint8_t *cipher;
    size_t blen;
    uint8_t *frame = result_frame(c, &cipher, &blen);
    return answer(ctx, job, &h, to, frame + DLC_HDR, blen, size, ip, port);
}

static int injected_drop(dlc_ctx *ctx) {
    if (!dlc_coin(&ctx->rng, ctx->drop_rate)) return 0;
    DLC_BUMP(ctx->counters[C_drop_injected_out], 1);
    return 1;
}

void dlc_sendmmsg_all(dlc_ctx *ctx, int fd, dlc_out *outs, int n) {
    struct mmsghdr msgs[DLC_MAX_OUTS];
    struct sockaddr_in addrs[DLC_MAX_OUTS];
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (injected_drop(ctx)) continue;
        memset(&addrs[m], 0, sizeof addrs[m]);
        addrs[m].sin_family = AF_INET;
        addrs[m].sin_addr.s_addr = htonl(outs[i].ip);
        addrs[m].sin_port = htons(outs[i].port);
        memset(&msgs[m], 0, sizeof msgs[m]);
        msgs[m].msg_hdr.msg_name = &addrs[m];
        msgs[m].msg_hdr.msg_namelen = sizeof addrs[m];
        msgs[m].msg_hdr.msg_iov = outs[i].iov;
        msgs[m].msg_hdr.msg_iovlen = (size_t)outs[i].niov;
        m++;
    }
    int done = 0;
    while (done < m) {
        DLC_BUMP(ctx->counters[C_send_calls], 1);
        int r = sendmmsg(fd, msgs + done, (unsigned)(m - done), 0);
        if (r <= 0) {   /* the message at `done` failed: count it and go on with the rest */
            DLC_BUMP(ctx->counters[C_send_errors], 1);
            done++;
            continue;
        }
        for (int i = done; i < done + r; i++) {
            DLC_BUMP(ctx->counters[C_packets_out], 1);
            DLC_BUMP(ctx->counters[C_bytes_out], msgs[i].msg_len);
        }
        done += r;
    }
}

static void gso_send(dlc_ctx *ctx, dlc_gso *b) {
    if (!b->count) return;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(b->port),
                             .sin_addr.s_addr = htonl(b->ip)};
    struct iovec iov = {.iov_base = b->buf, .iov_len = b->used};
    char ctrl[DLC_SEG_CTRL];
    struct msghdr m = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov,
                       .msg_iovlen = 1};
    if (b->count > 1) dlc_segment(&m, ctrl, b->seg);
    DLC_BUMP(ctx->counters[C_send_calls], 1);
    ssize_t r = sendmsg(ctx->send_fd, &m, 0);
    if (r < 0 && b->count > 1 && errno == EMSGSIZE) {   /* segments beyond the path's frame */
        m.msg_control = NULL; m.msg_controllen = 0;
        size_t sent = 0;
        for (int i = 0; i < b->count; i++) {   /* one datagram each, as without GSO */
            iov.iov_base = b->buf + (size_t)i * b->seg; iov.iov_len = b->seg;
            DLC_BUMP(ctx->counters[C_send_calls], 1);
            ssize_t one = sendmsg(ctx->send_fd, &m, 0);
            if (one < 0) DLC_BUMP(ctx->counters[C_send_errors], 1);
            else { DLC_BUMP(ctx->counters[C_packets_out], 1); sent += (size_t)one; }
        }
        DLC_BUMP(ctx->counters[C_bytes_out], sent);
        b->count = 0; b->used = 0;
        return;
    }
    if (r < 0) {
        DLC_BUMP(ctx->counters[C_send_errors], (uint64_t)b->count);
        if (b->count > 1 && (errno == EIO || errno == EINVAL)) ctx->gso = 0;   /* no GSO */
    } else {
        DLC_BUMP(ctx->counters[C_packets_out], (uint64_t)b->count);
        DLC_BUMP(ctx->counters[C_bytes_out], (uint64_t)r);
        if (b->count > 1) DLC_BUMP(ctx->counters[C_gso_segments], (uint64_t)b->count);
    }
    b->count = 0; b->used = 0;
}

void dlc_gso_flush(dlc_ctx *ctx) {
    for (int i = 0; i < ctx->nbuckets; i++) gso_send(ctx, &ctx->buckets[i]);
    ctx->nbuckets = 0;
}

/* A copy of a small result for one address, to leave with the batch's others to it. */
static void gso_add(dlc_ctx *ctx, uint32_t ip, uint16_t port, const uint8_t *frame, size_t len) {
    if (injected_drop(ctx)) return;
    dlc_gso *b = NULL;
    for (int i = 0; i < ctx->nbuckets; i++)
        if (ctx->buckets[i].ip == ip && ctx->buckets[i].port == port) { b = &ctx->buckets[i]; break; }
    if (!b) {
        if (ctx->nbuckets == DLC_GSO_BUCKETS) dlc_gso_flush(ctx);
        b = &ctx->buckets[ctx->nbuckets++];
        b->ip = ip; b->port = port; b->count = 0; b->used = 0;
    }
    if (b->count && (b->seg != len || b->count == 64 || b->used + len > 65000)) gso_send(ctx, b);
    b->seg = len;
    memcpy(b->buf + b->used, frame, len);
    b->used += len;
    b->count++;
}

/* Every contribution is in: the result to every worker (or the job's group), sealed in
 * place. With a socket, sent now (the slot's mutex is held), or copied for one
 * UDP_SEGMENT send per address at the end of the batch (small results); else copied to
 * the outputs (the pure API). */
static int complete(dlc_ctx *ctx, dlc_job *job, int slot, dlc_copy *c) {
    DLC_BUMP(ctx->counters[C_completions], 1);
    ADD(job->counters[C_completions], 1);
    if (c->sparse && dlc_sparse_finish(job, &job->slots[slot], c))
        return drop(ctx, job, C_send_errors);   /* out of memory */
    dlc_hdr h = result_header(job, slot, c);
    uint8_t *cipher;
    size_t blen;
    uint8_t *plain = result_frame(c, &cipher, &blen);
    size_t len = seal_into(ctx, job, &h, -1, NULL, blen, plain, cipher);
    const uint8_t *frame = job->auth == AUTH_ENCRYPT ? cipher : plain;
    int n = job->group_port ? 1 : job->workers;
    dlc_out outs[DLC_MAX_WORKERS];
    for (int i = 0; i < n; i++) {
        outs[i].ip = job->group_port ? job->group_ip : job->ips[i];
        outs[i].port = job->group_port ? job->group_port : job->ports[i];
        outs[i].niov = 1;
        outs[i].iov[0].iov_base = (void *)frame;
        outs[i].iov[0].iov_len = len;
    }
    if (ctx->send_fd >= 0 && ctx->gso && len <= DLC_GSO_MAX_SEG) {   /* a group too */
        for (int i = 0; i < n; i++) gso_add(ctx, outs[i].ip, outs[i].port, frame, len);
        return n;
    }
    if (ctx->send_fd >= 0) {
        dlc_sendmmsg_all(ctx, ctx->send_fd, outs, n);
        return n;
    }
    for (int i = 0; i < n; i++) {
        uint8_t *dst = out_room(&ctx->outs, len);
        if (!dst) { drop(ctx, job, C_send_errors); continue; }
        memcpy(dst, frame, len);
        outs[i].iov[0].iov_base = dst;
        ctx->outs.out[ctx->outs.n++] = outs[i];
    }
    return n;
}

static int error_reply(dlc_ctx *ctx, dlc_job *job, const dlc_hdr *hdr, size_t size,
                       uint32_t ip, uint16_t port, double now) {
    char text[512];
    size_t tlen;
    pthread_mutex_lock(&job->mu);
    double last = job->error_replies[hdr->worker];
    if (now - last < ERROR_REPLY_INTERVAL_S) {
        pthread_mutex_unlock(&job->mu);
        return drop(ctx, job, C_drop_error_limited);
    }
    job->error_replies[hdr->worker] = now;
    tlen = strlen(job->failure);
    memcpy(text, job->failure, tlen);
    pthread_mutex_unlock(&job->mu);
    long room = (long)size - DLC_HDR - tag_size(job);
    if (room < 0) room = 0;
    if ((long)tlen > room) tlen = (size_t)room;
    dlc_hdr err = {.type = T_ERROR, .job = job->id, .worker = DLC_SWITCH_RANK,
                   .slot = hdr->slot, .seq = hdr->seq, .tsi = hdr->tsi};
    DLC_BUMP(ctx->counters[C_errors_sent], 1);
    return emit(ctx, job, &err, hdr->worker, (const uint8_t *)text, tlen, ip, port);
}

static int mismatch(dlc_ctx *ctx, dlc_job *job, const dlc_hdr *hdr, const dlc_copy *c,
                    size_t size, uint32_t ip, uint16_t port, double now, const char *why) {
    char text[512];
    drop(ctx, job, C_drop_mismatch);
    if (why)
        snprintf(text, sizeof text, "rank %u %s (slot %u, round %u): the workers disagree "
                 "about the tensor or its sparsity", hdr->worker, why, hdr->slot, hdr->seq);
    else if (hdr->numel == 0 && c->numel == 0)
        snprintf(text, sizeof text, "rank %u all-reduces %u elements, other ranks %u: the "
                 "workers' tensors differ", hdr->worker, hdr->tsi, c->tsi);
    else
        snprintf(text, sizeof text, "rank %u sent chunk at element %u with %u elements for "
                 "slot %u round %u, but other ranks sent element %u with %u: the workers' "
                 "tensors differ", hdr->worker, hdr->tsi, hdr->numel, hdr->slot, hdr->seq,
                 c->tsi, c->numel);
    pthread_mutex_lock(&job->mu);
    int first = !job->failed;
    if (first) {
        job->failed = 1;
        snprintf(job->failure, sizeof job->failure, "%s", text);
    }
    pthread_mutex_unlock(&job->mu);
    if (first) {
        dlc_switch *sw = ctx->sw;
        pthread_mutex_lock(&sw->fail_mu);
        if (sw->nfail < 1024) sw->fail_ids[sw->nfail++] = job->id;
        pthread_cond_broadcast(&sw->fail_cv);
        pthread_mutex_unlock(&sw->fail_mu);
    }
    return error_reply(ctx, job, hdr, size, ip, port, now);
}

/* A dense payload's values, checked against the job's limit, then added (or copied). Built
 * for AVX2 too where the CPU has it (one binary, chosen at load: target_clones). */
DLC_CLONES
static int check_add(uint32_t *restrict acc, const int32_t *restrict v, int n, int32_t limit,
                     int first) {
    int32_t hi = 0, lo = 0;
    for (int i = 0; i < n; i++) {
        hi = v[i] > hi ? v[i] : hi;
        lo = v[i] < lo ? v[i] : lo;
    }
    if (hi > limit || lo < -limit) return -1;
    if (first) {
        memcpy(acc, v, 4u * (unsigned)n);
    } else {   /* no overflow: n workers of |q| <= limit fit int32 (wire/quant.py) */
        const uint32_t *restrict u = (const uint32_t *)v;
        for (int i = 0; i < n; i++) acc[i] += u[i];
    }
    return 0;
}

static int add_dense(dlc_copy *c, const uint8_t *payload, int n, int32_t limit, int first) {
    return check_add((uint32_t *)(void *)(c->frame + DLC_HDR),
                     (const int32_t *)(const void *)payload, n, limit, first);
}

static int probe(dlc_ctx *ctx, dlc_job *job, const dlc_hdr *hdr, dlc_copy *c, size_t size,
                 uint32_t ip, uint16_t port) {
    uint64_t all = job->workers == 64 ? ~0ull : (1ull << job->workers) - 1;
    DLC_BUMP(ctx->counters[C_probes], 1);
    if ((int64_t)hdr->seq != c->seq) {
        if ((int64_t)hdr->seq != next_of(c->seq, hdr->seq))
            return drop(ctx, job, C_drop_out_of_order);
        return status(ctx, job, hdr->slot, hdr->seq, all, 0, hdr->worker, size, ip, port);
    }
    int done = c->remaining == 0;
    if (done && (hdr->flags & F_RESEND)) {
        DLC_BUMP(ctx->counters[C_resent_results], 1);
        return resend(ctx, job, hdr->slot, c, hdr->worker, size, ip, port);
    }
    return status(ctx, job, hdr->slot, (uint32_t)c->seq, c->expected & ~c->bitmap, done,
                  hdr->worker, size, ip, port);
}

/* An authentic DATA packet of a live job: its part in a slot round (slot mutex held). */
static int round_of(dlc_ctx *ctx, dlc_job *job, const dlc_hdr *hdr, const uint8_t *payload,
                    size_t plen, size_t size, uint32_t ip, uint16_t port, double now) {
    dlc_slot *s = &job->slots[hdr->slot];
    dlc_copy *c = &s->c[hdr->seq & 1];
    uint64_t all = job->workers == 64 ? ~0ull : (1ull << job->workers) - 1;
    if (older(hdr->seq, c->seq)) return drop(ctx, job, C_drop_stale);
    if (hdr->flags & F_PROBE) return probe(ctx, job, hdr, c, size, ip, port);
    int sparse = (hdr->flags & F_SPARSE) != 0;
    if ((int64_t)hdr->seq != c->seq) {
        if ((int64_t)hdr->seq != next_of(c->seq, hdr->seq) || c->remaining)
            return drop(ctx, job, C_drop_out_of_order);
        if (sparse && dlc_sparse_start(job, s, c, hdr) != 1)   /* not a round it planned */
            return drop(ctx, job, C_drop_out_of_order);
        c->seq = hdr->seq; c->bitmap = 0; c->exp = EXP_ZERO; c->tsi = hdr->tsi;
        c->started = now; c->numel = hdr->numel; c->expected = all;
        c->remaining = job->workers; c->sparse = sparse; c->run = 0;
    }
    uint64_t bit = 1ull << hdr->worker;
    if (c->bitmap & bit) {
        DLC_BUMP(ctx->counters[C_retransmissions], 1);
        ADD(job->counters[C_retransmissions], 1);
        if (c->remaining == 0) return resend(ctx, job, hdr->slot, c, hdr->worker, size, ip, port);
        return status(ctx, job, hdr->slot, (uint32_t)c->seq, c->expected & ~c->bitmap, 0,
                      hdr->worker, size, ip, port);
    }
    if (c->remaining == 0) return drop(ctx, job, C_drop_stale);
    if (!(c->expected & bit) || sparse != c->sparse)
        return mismatch(ctx, job, hdr, c, size, ip, port, now, "sent a packet out of turn");
    if (hdr->tsi != c->tsi || (!sparse && hdr->numel != c->numel))
        return mismatch(ctx, job, hdr, c, size, ip, port, now, NULL);
    if (sparse) {
        int reason = dlc_sparse_add(job, s, c, hdr, payload, plen);
        if (reason >= 0) return drop(ctx, job, reason);
    } else {
        if (add_dense(c, payload, hdr->numel, job->limit, c->bitmap == 0))
            return drop(ctx, job, C_drop_bad_value);
        if (hdr->exp > c->exp) c->exp = hdr->exp;
    }
    c->bitmap |= bit;
    s->c[1 - (hdr->seq & 1)].bitmap &= ~bit;
    c->remaining--;
    return c->remaining ? 0 : complete(ctx, job, hdr->slot, c);
}

static int refusal(const dlc_job *job, const dlc_hdr *h, uint32_t ip, uint16_t port) {
    if (h->worker >= job->workers || job->ips[h->worker] != ip || job->ports[h->worker] != port)
        return C_drop_bad_source;
    if (h->slot >= job->slot_count) return C_drop_bad_slot;
    if (h->numel > job->k) return C_drop_too_large;
    if ((h->flags & F_SPARSE) && !job->block) return C_drop_not_sparse;
    if (!dlc_valid_exponent(h->exp)) return C_drop_bad_exponent;
    return -1;
}

static int data_of_job(dlc_ctx *ctx, dlc_job *job, const dlc_hdr *hdr, uint8_t *data,
                       size_t len, uint32_t ip, uint16_t port, double now) {
    if (!__atomic_load_n(&job->live, __ATOMIC_ACQUIRE)) return drop(ctx, job, C_drop_not_live);
    int refused = refusal(job, hdr, ip, port);
    if (refused >= 0) return drop(ctx, job, refused);
    const uint8_t *payload = data + DLC_HDR;
    size_t plen = len - DLC_HDR;
    if (job->auth != AUTH_NONE) {
        if (dlc_open(ctx->crypto, job->up[hdr->worker], job->auth, STREAM_UP, hdr->counter,
                     data, len, ctx->plain))
            return drop(ctx, job, C_drop_bad_tag);
        pthread_mutex_lock(&job->window_mu[hdr->worker]);
        int fresh = dlc_window_accept(&job->windows[hdr->worker], hdr->counter);
        pthread_mutex_unlock(&job->window_mu[hdr->worker]);
        if (!fresh) return drop(ctx, job, C_drop_replay);
        plen -= DLC_TAG;
        if (job->auth == AUTH_ENCRYPT) payload = ctx->plain;
    }
    if (!(hdr->flags & (F_SPARSE | F_PROBE)) && plen != 4u * hdr->numel)
        return drop(ctx, job, C_drop_length);
    int64_t ns = (int64_t)(now * 1e9);
    __atomic_store_n(&job->last_packet_ns, ns, __ATOMIC_RELAXED);
    ADD(job->counters[C_packets_in], 1);
    ADD(job->counters[C_bytes_in], len);
    if (__atomic_load_n(&job->failed, __ATOMIC_ACQUIRE))
        return error_reply(ctx, job, hdr, len, ip, port, now);
    dlc_slot *s = &job->slots[hdr->slot];
    pthread_mutex_lock(&s->mu);
    int r = round_of(ctx, job, hdr, payload, plen, len, ip, port, now);
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* Process one received datagram: outputs go to ctx->outs (results at once, see above).
 * Returns the number of outputs, 0 for a drop, -1 for a datagram handed to the slow path. */
int dlc_process(dlc_ctx *ctx, uint8_t *data, size_t len, uint32_t ip, uint16_t port,
                double now) {
    dlc_hdr hdr;
    if (len < DLC_HDR) {
        DLC_BUMP(ctx->counters[C_packets_in], 1); DLC_BUMP(ctx->counters[C_bytes_in], len);
        return drop(ctx, NULL, C_drop_truncated);
    }
    dlc_hdr_unpack(data, &hdr);
    dlc_switch *sw = ctx->sw;
    pthread_rwlock_rdlock(&sw->lock);
    dlc_job *job = hdr.magic == DLC_MAGIC ? sw->jobs[hdr.job] : NULL;
    if (job && job->python) {
        int full = dlc_slow_push(sw, data, len, ip, port);
        pthread_rwlock_unlock(&sw->lock);
        DLC_BUMP(ctx->counters[full ? C_drop_slow_full : C_slow_path], 1);
        return -1;
    }
    DLC_BUMP(ctx->counters[C_packets_in], 1);
    DLC_BUMP(ctx->counters[C_bytes_in], len);
    int r;
    if (hdr.magic != DLC_MAGIC) r = drop(ctx, NULL, C_drop_foreign);
    else if (hdr.version != DLC_VERSION) r = drop(ctx, NULL, C_drop_version);
    else if (hdr.type < T_DATA || hdr.type > T_CHALLENGE) r = drop(ctx, NULL, C_drop_type);
    else if (hdr.type != T_DATA) r = drop(ctx, NULL, C_drop_type);
    else if (!job) r = drop(ctx, NULL, C_drop_unknown_job);
    else r = data_of_job(ctx, job, &hdr, data, len, ip, port, now);
    pthread_rwlock_unlock(&sw->lock);
    return r;
}
