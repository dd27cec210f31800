/* The native switch: its job table (filled by the Python control plane), the slow path to
 * the Python dataplane, and the packet loop: one thread per socket (SO_REUSEPORT), batched
 * receives (recvmmsg, with UDP_GRO where the kernel has it) and batched sends (sendmmsg). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "dlc.h"
#include "rx.h"

#define BATCH 32
#define RXBUF 65536


static const char *names[] = {
#define DLC_NAME(n) #n,
    DLC_COUNTERS(DLC_NAME)
};

const char *dlc_counter_names(void) {
    static char all[2048];
    if (!all[0]) {
        for (int i = 0; i < C_COUNT; i++) {
            strcat(all, names[i]);
            if (i + 1 < C_COUNT) strcat(all, ",");
        }
    }
    return all;
}

int dlc_counter_count(void) { return C_COUNT; }

dlc_switch *dlc_switch_new(void) {
    dlc_switch *sw = calloc(1, sizeof *sw);
    if (!sw) return NULL;
    pthread_rwlockattr_t attr;   /* writers first: control never waits behind packets */
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sw->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&sw->ctx_mu, NULL);
    pthread_mutex_init(&sw->fail_mu, NULL);
    pthread_cond_init(&sw->fail_cv, NULL);
    pthread_mutex_init(&sw->slow_mu, NULL);
    pthread_cond_init(&sw->slow_cv, NULL);
    return sw;
}

static void job_free(dlc_job *j) {
    if (!j) return;
    if (j->slots) {
        for (int s = 0; s < j->slot_count; s++) {
            pthread_mutex_destroy(&j->slots[s].mu);
            for (int i = 0; i < 2; i++) { free(j->slots[s].c[i].frame); free(j->slots[s].c[i].cipher); }
        }
    }
    dlc_sparse_free(j);
    if (j->window_mu)
        for (int r = 0; r < j->workers; r++) pthread_mutex_destroy(&j->window_mu[r]);
    pthread_mutex_destroy(&j->mu);
    free(j->slots); free(j->ips); free(j->ports); free(j->up); free(j->down);
    free(j->windows); free(j->window_mu); free(j->down_sent); free(j->error_replies);
    free(j);
}

void dlc_switch_free(dlc_switch *sw) {
    if (!sw) return;
    for (int i = 0; i < 65536; i++) job_free(sw->jobs[i]);
    dlc_slow_clear(sw);
    free(sw);
}

/* keys: up[0..n), down[0..n), result: (2n + 1) x 16 bytes (derived in Python, HKDF). */
int dlc_job_add(dlc_switch *sw, int id, int workers, const uint32_t *ips, const uint16_t *ports,
                int slot_count, int k, int32_t limit, int auth, const uint8_t *keys,
                uint32_t group_ip, uint16_t group_port, int python) {
    if (id < 1 || id > 0xFFFE || workers < 1 || slot_count < 1 || k < 1) return -1;
    dlc_job *j = calloc(1, sizeof *j);
    if (!j) return -2;
    j->id = (uint16_t)id; j->workers = workers; j->slot_count = slot_count; j->k = k;
    j->auth = auth; j->python = python; j->limit = limit;
    j->group_ip = group_ip; j->group_port = group_port;
    pthread_mutex_init(&j->mu, NULL);
    if (!python) {
        if (workers > DLC_MAX_WORKERS) { job_free(j); return -1; }
        j->ips = calloc((size_t)workers, 4); j->ports = calloc((size_t)workers, 2);
        j->up = calloc((size_t)workers, 16); j->down = calloc((size_t)workers, 16);
        j->windows = calloc((size_t)workers, sizeof *j->windows);
        j->window_mu = calloc((size_t)workers, sizeof *j->window_mu);
        j->down_sent = calloc((size_t)workers, 8);
        j->error_replies = calloc((size_t)workers, sizeof(double));
        j->slots = calloc((size_t)slot_count, sizeof *j->slots);
        if (!j->ips || !j->ports || !j->up || !j->down || !j->windows || !j->window_mu ||
            !j->down_sent || !j->error_replies || !j->slots) { job_free(j); return -2; }
        for (int r = 0; r < workers; r++) {
            j->ips[r] = ips[r]; j->ports[r] = ports[r];
            pthread_mutex_init(&j->window_mu[r], NULL);
            j->error_replies[r] = -1e9;
            if (auth != AUTH_NONE) {
                memcpy(j->up[r], keys + 16 * r, 16);
                memcpy(j->down[r], keys + 16 * (workers + r), 16);
            }
        }
        if (auth != AUTH_NONE) memcpy(j->result, keys + 32 * workers, 16);
        size_t frame = DLC_HDR + 4u * (size_t)k + DLC_TAG;
        for (int s = 0; s < slot_count; s++) {
            pthread_mutex_init(&j->slots[s].mu, NULL);
            for (int i = 0; i < 2; i++) {
                dlc_copy *c = &j->slots[s].c[i];
                c->seq = -1; c->exp = EXP_ZERO;
                c->frame = calloc(1, frame);
                c->cipher = auth == AUTH_ENCRYPT ? calloc(1, frame) : NULL;
                if (!c->frame || (auth == AUTH_ENCRYPT && !c->cipher)) {
                    j->slot_count = s + 1; job_free(j); return -2;
                }
            }
        }
    }
    pthread_rwlock_wrlock(&sw->lock);
    dlc_job *old = sw->jobs[id];
    sw->jobs[id] = j;
    pthread_rwlock_unlock(&sw->lock);
    job_free(old);
    return 0;
}

/* Sparse rounds for a native job not yet live (blocks of `block` elements, k % block == 0). */
int dlc_job_sparse(dlc_switch *sw, int id, int block) {
    if (id < 0 || id > 0xFFFF) return -1;
    pthread_rwlock_wrlock(&sw->lock);
    dlc_job *j = sw->jobs[id];
    int rc = 0;
    if (!j || j->python || j->live || block < 1 || j->k % block || j->block) rc = -1;
    else {
        j->block = block; j->m = j->k / block;
        rc = dlc_sparse_alloc(j);
        if (rc) { dlc_sparse_free(j); j->block = 0; j->m = 0; }
    }
    pthread_rwlock_unlock(&sw->lock);
    return rc;
}

int dlc_job_remove(dlc_switch *sw, int id) {
    if (id < 0 || id > 0xFFFF) return -1;
    pthread_rwlock_wrlock(&sw->lock);
    dlc_job *j = sw->jobs[id];
    sw->jobs[id] = NULL;
    pthread_rwlock_unlock(&sw->lock);
    job_free(j);
    return j ? 0 : -1;
}

int dlc_job_set_live(dlc_switch *sw, int id, int live) {
    pthread_rwlock_rdlock(&sw->lock);
    dlc_job *j = id >= 0 && id <= 0xFFFF ? sw->jobs[id] : NULL;
    if (j) __atomic_store_n(&j->live, live, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&sw->lock);
    return j ? 0 : -1;
}

/* The job's counters, last packet (monotonic s), failure text; its oldest open round. */
int dlc_job_info(dlc_switch *sw, int id, uint64_t *counters, double *last_packet,
                 char *failure, size_t cap, double now, uint64_t *waiting, double *since,
                 int *slot, int64_t *round) {
    pthread_rwlock_rdlock(&sw->lock);
    dlc_job *j = id >= 0 && id <= 0xFFFF ? sw->jobs[id] : NULL;
    if (!j || j->python) { pthread_rwlock_unlock(&sw->lock); return -1; }
    for (int i = 0; i < C_COUNT; i++) counters[i] = __atomic_load_n(&j->counters[i], __ATOMIC_RELAXED);
    *last_packet = (double)__atomic_load_n(&j->last_packet_ns, __ATOMIC_RELAXED) * 1e-9;
    pthread_mutex_lock(&j->mu);
    snprintf(failure, cap, "%s", j->failure);
    pthread_mutex_unlock(&j->mu);
    *waiting = 0; *slot = -1;
    double oldest = 0;
    for (int s = 0; s < j->slot_count; s++) {
        pthread_mutex_lock(&j->slots[s].mu);
        for (int i = 0; i < 2; i++) {
            dlc_copy *c = &j->slots[s].c[i];
            if (c->remaining && c->bitmap && (*slot < 0 || c->started < oldest)) {
                oldest = c->started; *slot = s; *round = c->seq;
                *waiting = c->expected & ~c->bitmap;
            }
        }
        pthread_mutex_unlock(&j->slots[s].mu);
    }
    *since = *slot >= 0 ? now - oldest : 0;
    pthread_rwlock_unlock(&sw->lock);
    return 0;
}

/* Ids of jobs that failed since the last call (waits up to timeout_ms for one). */
int dlc_take_failures(dlc_switch *sw, uint16_t *ids, int cap, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&sw->fail_mu);
    while (!sw->nfail && !__atomic_load_n(&sw->stopping, __ATOMIC_ACQUIRE) &&
           pthread_cond_timedwait(&sw->fail_cv, &sw->fail_mu, &until) == 0) {}
    int n = sw->nfail < cap ? sw->nfail : cap;
    memcpy(ids, sw->fail_ids, (size_t)n * 2);
    memmove(sw->fail_ids, sw->fail_ids + n, (size_t)(sw->nfail - n) * 2);
    sw->nfail -= n;
    pthread_mutex_unlock(&sw->fail_mu);
    return n;
}

/* -- contexts and counters -------------------------------------------------------------- */
dlc_ctx *dlc_ctx_new(dlc_switch *sw, int send_fd, double drop_rate, uint64_t seed) {
    dlc_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->sw = sw; ctx->send_fd = send_fd; ctx->drop_rate = drop_rate;
    ctx->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    ctx->crypto = dlc_crypto_new();
    ctx->plain = malloc(RXBUF);
    ctx->outs.cap = (size_t)BATCH * (RXBUF + 64) + 8 * (RXBUF + 64);
    ctx->outs.scratch = malloc(ctx->outs.cap);
    if (!ctx->crypto || !ctx->plain || !ctx->outs.scratch) { dlc_ctx_free(ctx); return NULL; }
    if (send_fd >= 0) {
        for (int i = 0; i < DLC_GSO_BUCKETS; i++) {
            ctx->buckets[i].buf = malloc(65536);
            if (!ctx->buckets[i].buf) { dlc_ctx_free(ctx); return NULL; }
        }
    }
    pthread_mutex_lock(&sw->ctx_mu);
    if (sw->nctx < 64) sw->ctxs[sw->nctx++] = ctx;
    pthread_mutex_unlock(&sw->ctx_mu);
    return ctx;
}

void dlc_ctx_free(dlc_ctx *ctx) {
    if (!ctx) return;
    dlc_switch *sw = ctx->sw;
    pthread_mutex_lock(&sw->ctx_mu);
    for (int i = 0; i < sw->nctx; i++) {
        if (sw->ctxs[i] == ctx) {
            for (int c = 0; c < C_COUNT; c++) sw->base_counters[c] += ctx->counters[c];
            sw->ctxs[i] = sw->ctxs[--sw->nctx];
            break;
        }
    }
    pthread_mutex_unlock(&sw->ctx_mu);
    dlc_crypto_free(ctx->crypto);
    for (int i = 0; i < DLC_GSO_BUCKETS; i++) free(ctx->buckets[i].buf);
    free(ctx->plain); free(ctx->outs.scratch); free(ctx);
}

void dlc_counters(dlc_switch *sw, uint64_t *out) {
    pthread_mutex_lock(&sw->ctx_mu);
    for (int c = 0; c < C_COUNT; c++) {
        uint64_t v = sw->base_counters[c];
        for (int i = 0; i < sw->nctx; i++) v += __atomic_load_n(&sw->ctxs[i]->counters[c], __ATOMIC_RELAXED);
        out[c] = v;
    }
    pthread_mutex_unlock(&sw->ctx_mu);
}

void dlc_stop(dlc_switch *sw) {
    pthread_mutex_lock(&sw->slow_mu);
    __atomic_store_n(&sw->stopping, 1, __ATOMIC_RELEASE);   /* the loops read it unlocked */
    pthread_cond_broadcast(&sw->slow_cv);
    pthread_mutex_unlock(&sw->slow_mu);
    pthread_mutex_lock(&sw->fail_mu);
    pthread_cond_broadcast(&sw->fail_cv);
    pthread_mutex_unlock(&sw->fail_mu);
}

/* The pure API (tests): process one datagram; outputs serialised into out as records of
 * ip u32, port u16, length u32, bytes. Returns the bytes written, or -1 (slow path). */
long dlc_process_copy(dlc_ctx *ctx, uint8_t *data, size_t len, uint32_t ip, uint16_t port,
                      double now, uint8_t *out, size_t cap) {
    ctx->outs.n = 0; ctx->outs.used = 0;
    int r = dlc_process(ctx, data, len, ip, port, now);
    if (r < 0) return -1;
    size_t w = 0;
    for (int i = 0; i < ctx->outs.n; i++) {
        dlc_out *o = &ctx->outs.out[i];
        size_t n = 0;
        for (int v = 0; v < o->niov; v++) n += o->iov[v].iov_len;
        if (w + 10 + n > cap) return -2;
        uint32_t n32 = (uint32_t)n;
        memcpy(out + w, &o->ip, 4); memcpy(out + w + 4, &o->port, 2); memcpy(out + w + 6, &n32, 4);
        w += 10;
        for (int v = 0; v < o->niov; v++) { memcpy(out + w, o->iov[v].iov_base, o->iov[v].iov_len); w += o->iov[v].iov_len; }
    }
    return (long)w;
}

/* -- the packet loop -------------------------------------------------------------------- */
static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Serve datagrams on fd until dlc_stop (the calling thread is the loop; the GIL is not
 * held: ctypes releases it). Returns 0, or -1 if the context could not be made. */
int dlc_serve(dlc_switch *sw, int fd, double drop_rate, uint64_t seed, int use_gro,
              int64_t *cpu_ns_out) {
    dlc_ctx *ctx = dlc_ctx_new(sw, fd, drop_rate, seed);
    if (!ctx) return -1;
    ctx->gso = use_gro;   /* segmentation offload both ways, or neither */
    int gro = 0;
    if (use_gro) {
        int one = 1;
        gro = setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
    }
    uint8_t *bufs = malloc((size_t)BATCH * RXBUF);
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    struct sockaddr_in addrs[BATCH];
    char ctrl[BATCH][64];
    if (!bufs) { dlc_ctx_free(ctx); return -1; }
    int64_t cpu0 = thread_cpu_ns();
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    for (;;) {
        if (__atomic_load_n(&sw->stopping, __ATOMIC_ACQUIRE)) break;
        dlc_rx_prepare(msgs, iovs, addrs, gro ? ctrl : NULL, bufs, RXBUF, BATCH);
        DLC_BUMP(ctx->counters[C_recv_calls], 1);
        int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                poll(&pfd, 1, 100);
                continue;
            }
            if (errno == EBADF || errno == ENOTSOCK) break;
            DLC_BUMP(ctx->counters[C_recv_errors], 1);
            poll(&pfd, 1, 10);
            continue;
        }
        ctx->outs.n = 0; ctx->outs.used = 0;
        double now = dlc_now();
        for (int i = 0; i < n; i++) {
            uint32_t ip = ntohl(addrs[i].sin_addr.s_addr);
            uint16_t port = ntohs(addrs[i].sin_port);
            size_t len = msgs[i].msg_len, seg = dlc_gro_segment(&msgs[i].msg_hdr, len);
            uint8_t *base = bufs + (size_t)i * RXBUF;
            for (size_t off = 0; off < len; off += seg) {
                size_t part = len - off < seg ? len - off : seg;
                if (seg < len) DLC_BUMP(ctx->counters[C_gro_segments], 1);
                if (dlc_coin(&ctx->rng, drop_rate)) {
                    DLC_BUMP(ctx->counters[C_drop_injected_in], 1);
                    continue;
                }
                if (ctx->outs.n >= DLC_MAX_OUTS - 1 || ctx->outs.used + RXBUF + 64 > ctx->outs.cap) {
                    dlc_sendmmsg_all(ctx, fd, ctx->outs.out, ctx->outs.n);
                    ctx->outs.n = 0; ctx->outs.used = 0;
                }
                dlc_process(ctx, base + off, part, ip, port, now);
            }
        }
        if (ctx->outs.n) dlc_sendmmsg_all(ctx, fd, ctx->outs.out, ctx->outs.n);
        dlc_gso_flush(ctx);
    }
    int64_t used = thread_cpu_ns() - cpu0;
    if (cpu_ns_out) *cpu_ns_out = used;
    free(bufs);
    dlc_ctx_free(ctx);
    return 0;
}
