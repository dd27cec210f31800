/* A load generator for `dlcomm bench switch`: one thread plays n workers of one job, each
 * from its own UDP socket, keeping every slot of the job busy: a slot's next round starts
 * once all n have its result. Payloads are sealed as a worker seals them (the switch checks
 * every tag); results are counted, not checked (the switch is what is measured). With gso,
 * a worker's packets of one batch leave in one sendmsg (UDP_SEGMENT). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "dlc.h"
#include "rx.h"

#define LG_RX 32
#define LG_MAX_SEGS 64

enum { LG_ROUNDS, LG_PACKETS, LG_BYTES, LG_RESULTS, LG_RBYTES, LG_RESENDS, LG_SEND_ERRORS,
       LG_SEND_CALLS, LG_COUNT };

typedef struct {
    uint64_t seq; uint64_t got;   /* bitmap of workers that have this round's result */
    double sent_at; int pending;  /* waiting to be sent */
} lg_slot;

static size_t seal_data(dlc_crypto *cr, int auth, const uint8_t *key, uint64_t counter,
                        uint8_t *buf, uint16_t job, int rank, int slot, uint64_t seq, int k,
                        const uint8_t *payload) {
    dlc_hdr h = {.magic = DLC_MAGIC, .version = DLC_VERSION, .type = T_DATA, .job = job,
                 .worker = (uint16_t)rank, .slot = (uint16_t)slot, .numel = (uint16_t)k,
                 .seq = (uint32_t)seq, .tsi = (uint32_t)slot * (uint32_t)k, .exp = 0,
                 .counter = counter};
    dlc_hdr_pack(buf, &h);
    memcpy(buf + DLC_HDR, payload, 4u * (size_t)k);
    size_t len = DLC_HDR + 4u * (size_t)k;
    if (auth == AUTH_NONE) return len;
    dlc_seal(cr, key, auth, STREAM_UP, counter, buf, len, buf, buf + len);
    return len + DLC_TAG;
}

static int send_batch(int fd, const struct sockaddr_in *to, uint8_t *buf, size_t seg, int count,
                      int gso, uint64_t *stats) {
    int sent = 0;
    while (sent < count) {
        int now = gso ? count - sent : 1;
        if (gso && now > LG_MAX_SEGS) now = LG_MAX_SEGS;
        if (gso && (size_t)now * seg > 65000) now = (int)(65000 / seg);
        if (now < 1) now = 1;
        struct iovec iov = {.iov_base = buf + (size_t)sent * seg, .iov_len = (size_t)now * seg};
        char ctrl[DLC_SEG_CTRL];
        struct msghdr m = {.msg_name = (void *)to, .msg_namelen = sizeof *to, .msg_iov = &iov,
                           .msg_iovlen = 1};
        if (gso && now > 1) dlc_segment(&m, ctrl, seg);
        stats[LG_SEND_CALLS]++;
        ssize_t r = sendmsg(fd, &m, 0);
        if (r < 0) {
            if (errno == EAGAIN || errno == ENOBUFS || errno == EINTR) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                poll(&p, 1, 5);
                continue;
            }
            if (errno == EIO || errno == EINVAL) { if (gso) { gso = 0; continue; } }  /* no GSO here */
            stats[LG_SEND_ERRORS]++;
            sent += now;
            continue;
        }
        stats[LG_PACKETS] += (uint64_t)now;
        stats[LG_BYTES] += (uint64_t)r;
        sent += now;
    }
    return gso;
}

/* Play workers 0..n-1 (fds[r], up keys keys[16r..]) of job `job` for `seconds`. stats: see
 * LG_*. Returns 0, or -1 if nothing could be allocated. */
int dlc_loadgen(const int *fds, int n, uint32_t sw_ip, uint16_t sw_port, uint16_t job, int k,
                int slots, int auth, const uint8_t *keys, double seconds, int gso,
                uint64_t *stats) {
    if (n < 1 || n > DLC_MAX_WORKERS || slots < 1 || k < 1) return -1;
    memset(stats, 0, sizeof(uint64_t) * LG_COUNT);
    size_t seg = DLC_HDR + 4u * (size_t)k + (auth == AUTH_NONE ? 0 : DLC_TAG);
    lg_slot *st = calloc((size_t)slots, sizeof *st);
    uint8_t *payload = malloc(4u * (size_t)k);
    uint8_t *txbuf = malloc((size_t)slots * seg);
    uint8_t *rx = malloc((size_t)LG_RX * 65536);
    uint64_t *counter = calloc((size_t)n, 8);
    int *order = malloc(sizeof(int) * (size_t)slots);
    dlc_crypto *cr = dlc_crypto_new();
    struct pollfd *pfds = calloc((size_t)n, sizeof *pfds);
    if (!st || !payload || !txbuf || !rx || !counter || !order || !cr || !pfds) {
        free(st); free(payload); free(txbuf); free(rx); free(counter); free(order); free(pfds);
        dlc_crypto_free(cr);
        return -1;
    }
    for (int i = 0; i < k; i++) { int32_t v = (i % 7) - 3; memcpy(payload + 4 * i, &v, 4); }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(sw_port),
                             .sin_addr.s_addr = htonl(sw_ip)};
    for (int r = 0; r < n; r++) {
        int one = 1;
        pfds[r].fd = fds[r]; pfds[r].events = POLLIN;
        if (gso) setsockopt(fds[r], SOL_UDP, UDP_GRO, &one, sizeof one);  /* results whole */
    }
    char ctrl[LG_RX][64];
    uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
    for (int s = 0; s < slots; s++) st[s].pending = 1;
    double start = dlc_now(), end = start + seconds;
    struct mmsghdr msgs[LG_RX];
    struct iovec iovs[LG_RX];
    for (;;) {
        double now = dlc_now();
        if (now >= end) break;
        /* send the slots whose round is ready, every worker in turn */
        int ready = 0;
        for (int s = 0; s < slots; s++) {
            if (!st[s].pending && st[s].got != all && now - st[s].sent_at > 0.2) {
                st[s].pending = 1;   /* lost: send the round again (the switch answers) */
                stats[LG_RESENDS]++;
            }
            if (st[s].pending) order[ready++] = s;
        }
        if (ready) {
            for (int r = 0; r < n; r++) {
                int m = 0;
                for (int i = 0; i < ready; i++) {
                    int s = order[i];
                    if (st[s].got >> r & 1) continue;   /* this worker has the result */
                    seal_data(cr, auth, keys + 16 * r, counter[r]++, txbuf + (size_t)m * seg,
                              job, r, s, st[s].seq, k, payload);
                    m++;
                }
                if (m) gso = send_batch(fds[r], &to, txbuf, seg, m, gso, stats);
            }
            for (int i = 0; i < ready; i++) { st[order[i]].pending = 0; st[order[i]].sent_at = now; }
        }
        /* collect results */
        int got_any = 0;
        for (int r = 0; r < n; r++) {
            dlc_rx_prepare(msgs, iovs, NULL, ctrl, rx, 65536, LG_RX);
            int got = recvmmsg(fds[r], msgs, LG_RX, MSG_DONTWAIT, NULL);
            for (int i = 0; i < got; i++) {
                size_t len = msgs[i].msg_len, seg = dlc_gro_segment(&msgs[i].msg_hdr, len);
                for (size_t off = 0; off < len; off += seg) {
                    dlc_hdr h;
                    size_t part = len - off < seg ? len - off : seg;
                    if (part < DLC_HDR) continue;
                    dlc_hdr_unpack(rx + (size_t)i * 65536 + off, &h);
                    if (h.type != T_RESULT || h.slot >= slots || h.seq != (uint32_t)st[h.slot].seq)
                        continue;
                    stats[LG_RESULTS]++;
                    stats[LG_RBYTES] += part;
                    lg_slot *sl = &st[h.slot];
                    sl->got |= 1ull << r;
                    if (sl->got == all) {
                        sl->seq++; sl->got = 0; sl->pending = 1;
                        stats[LG_ROUNDS]++;
                    }
                    got_any = 1;
                }
            }
        }
        if (!got_any && !ready) poll(pfds, (nfds_t)n, 1);
    }
    free(st); free(payload); free(txbuf); free(rx); free(counter); free(order); free(pfds);
    dlc_crypto_free(cr);
    return 0;
}
