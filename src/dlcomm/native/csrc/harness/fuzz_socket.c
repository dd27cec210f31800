/* A libFuzzer target for the worker's socket loop (client.c's dlc_client_run and drain, rx.h's
 * cutting of GRO batches, the output queue and its flushes): a real client (rank 0 of a job of
 * three) on loopback sockets, fed attacker datagrams by the harness, which plays its switch.
 * fuzz_target.c drives the same state machine through its socket-free calls; this one drives
 * what those calls leave out. Every socket is bound to 127.0.0.1: nothing leaves the host.
 *
 * Input: one configuration byte, then records  u8 selector, u16 little-endian length, bytes
 * (a record cut short by the end of the input takes what is left).
 *   configuration  0x01 encrypted job (else MAC), 0x02 results on a socket of their own,
 *                  0x04 SLOTS_MANY slots (every op begins with over twice the outputs the
 *                  client's queue holds), 0x08 segmentation offload off (dlc_client_set_gso(c, 0)),
 *                  0x10 sparse rounds (blocks of SPARSE_BLOCK of SPARSE_ELEMENTS floats: every
 *                  third block present, as testing/socket_corpus.sparse_data(0) writes them)
 *   selector  0x80  seal each datagram as the switch would (the result key for a RESULT,
 *                   else the down key; the header's counter is the nonce)
 *             0x40  send from a stranger's socket instead of the switch's
 *             0x20  send to the results socket (where the configuration has one)
 *             0x10  run the client's loop for a slice after sending (the last record always
 *                   does); without it datagrams queue up and the next run drains them in
 *                   batches
 *             0x0F  how many datagrams: 0 none (a slice of time passes: with 0x10 the
 *                   worker's loop runs it, without it the worker does not run, so that
 *                   timeouts fall due together), 1 the bytes as one,
 *                   2-15 the bytes cut into pieces of ceil(n / count) bytes (the last
 *                   shorter; so count pieces at most), each
 *                   sealed alone, sent as one UDP_SEGMENT batch: with UDP_GRO on, the client
 *                   receives it whole and must cut it back
 * Invariants (a broken one abort()s): every datagram the client sends reaches the switch's
 * socket only (never the stranger's), is a DATA of its job and rank, and its tag verifies
 * with the rank's up key (an output overwritten in the queue before it was sent would not);
 * no socket error (E_SOCKET) fails an op on loopback (ops may fail otherwise); and once the input is done and its sockets drained, the
 * client has counted every non-empty datagram sent to it, exactly once.
 *
 * The client runs on the real clock (timeouts of 5-50 ms, it gives up after 0.1 s without
 * progress), so a run's path depends a little on timing; each input starts from a fresh
 * client and drained sockets. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../dlc.h"
#include "api.h"
#include "keys.h"
#include "records.h"
#include "../rx.h"

#define CFG_ENCRYPT 0x01
#define CFG_RESULTS 0x02
#define CFG_MANY 0x04
#define CFG_NO_GSO 0x08
#define CFG_SPARSE 0x10
#define SEL_SEAL 0x80
#define SEL_STRANGER 0x40
#define SEL_RESULTS 0x20
#define SEL_RUN 0x10
#define SEL_COUNT 0x0F

#define JOB 1
#define WORKERS 3
#define K 16
#define SLOTS_FEW 2
#define SLOTS_MANY 2100   /* over twice client.c's queue of 1,024 outputs */
#define ELEMENTS_FEW 40
#define ELEMENTS_MANY (2 * SLOTS_MANY * K)
#define SPARSE_BLOCK 4
#define SPARSE_ELEMENTS 160
#define SLICE_S 0.001
#define PENDING_MAX (96 * 1024)   /* unread bytes before a run is forced: no socket overflows */
#define PENDING_SENDS 48

static uint8_t KEYS[48];   /* rank 0's up, down and result keys: KEYS_MAC[0], [3] and [6] */

enum { F_CLIENT, F_RESULTS, F_SWITCH, F_STRANGER, NFDS };

static struct {
    int fd[NFDS]; uint16_t port[NFDS];
    dlc_client *client; dlc_crypto *crypto;
    uint8_t *buf, *plain, *batch;
    float *data, *out, sparse[SPARSE_ELEMENTS], work[SPARSE_ELEMENTS];
    int cfg, auth; size_t elements;
    unsigned long sent;      /* non-empty datagrams sent to the client in this input */
    size_t pending; int pending_sends;
    unsigned long checked, ops_done, ops_failed, records;
} S;

static void fail(const char *what, long a, long b) {
    fprintf(stderr, "fuzz_socket: invariant broken at record %lu: %s (%ld, %ld)\n", S.records,
            what, a, b);
    abort();
}

static int udp_socket(uint16_t *port) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int size = 4 << 20;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        fail("cannot open a loopback UDP socket", errno, 0);
    /* room for a whole op's outputs (as root past rmem_max; else the kernel's cap) */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size))
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    *port = ntohs(a.sin_port);
    return fd;
}

static void teardown(void) {
    dlc_client_free(S.client);
    dlc_crypto_free(S.crypto);
    for (int i = 0; i < NFDS; i++) if (S.fd[i] > 0) close(S.fd[i]);
    free(S.buf); free(S.plain); free(S.batch); free(S.data); free(S.out);
    memset(&S, 0, sizeof S);
}

static void init(void) {
    for (int i = 0; i < NFDS; i++) S.fd[i] = udp_socket(&S.port[i]);
    memcpy(KEYS, KEYS_MAC[0], 16); memcpy(KEYS + 16, KEYS_MAC[3], 16);
    memcpy(KEYS + 32, KEYS_MAC[6], 16);
    S.crypto = dlc_crypto_new();
    S.buf = malloc(65536); S.plain = malloc(65536); S.batch = malloc(65536);
    S.data = malloc(sizeof(float) * ELEMENTS_MANY);
    S.out = malloc(sizeof(float) * ELEMENTS_MANY);
    if (!S.crypto || !S.buf || !S.plain || !S.batch || !S.data || !S.out)
        fail("out of memory", 0, 0);
    for (int i = 0; i < ELEMENTS_MANY; i++) S.data[i] = (float)(i % 7 - 3) * 0.25f;
    for (int i = 0; i < SPARSE_ELEMENTS; i++)   /* socket_corpus.sparse_data(0) */
        S.sparse[i] = (i / SPARSE_BLOCK) % 3 == 0 ? (float)(i % 7 - 3) * 0.25f : 0.0f;
    atexit(teardown);
}

/* -- the client's outputs, as its switch receives them --------------------------------- */
static void check_output(const uint8_t *d, size_t len) {
    dlc_hdr h;
    if (len < DLC_HDR + DLC_TAG) fail("a datagram from the client shorter than a header", (long)len, 0);
    dlc_hdr_unpack(d, &h);
    if (h.magic != DLC_MAGIC || h.version != DLC_VERSION || h.type != T_DATA || h.job != JOB ||
        h.worker != 0)
        fail("a datagram from the client with a bad header", h.type, h.job);
    if (dlc_open(S.crypto, KEYS, S.auth, STREAM_UP, h.counter, d, len, S.plain))
        fail("a datagram from the client whose tag does not verify", (long)h.counter,
             (long)len);
    S.checked++;
}

/* Read what waits on the switch's socket and check it; the stranger's must stay empty. */
static void switch_reads(void) {
    ssize_t n;
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    while ((n = recvfrom(S.fd[F_SWITCH], S.buf, 65536, 0, (struct sockaddr *)&from, &flen)) >= 0) {
        if (ntohs(from.sin_port) != S.port[F_CLIENT])
            fail("a datagram at the switch from a socket that is not the client's",
                 ntohs(from.sin_port), 0);
        check_output(S.buf, (size_t)n);
        flen = sizeof from;
    }
    if (recv(S.fd[F_STRANGER], S.buf, 65536, 0) >= 0)
        fail("the client sent a datagram to a stranger", 0, 0);
}

static int waiting(int fd) {   /* a datagram waits (an empty one too): the sockets never block */
    return recv(fd, S.buf, 1, MSG_PEEK) >= 0;
}

/* -- the client ------------------------------------------------------------------------ */
static void client_begin(void) {
    if (S.cfg & CFG_SPARSE) {   /* on a copy: the op clears signed zeros of absent blocks */
        memcpy(S.work, S.sparse, sizeof S.work);
        if (dlc_client_begin_sparse(S.client, S.work, S.out, SPARSE_ELEMENTS, SPARSE_BLOCK,
                                    NULL, NULL, dlc_now()))
            fail("dlc_client_begin_sparse failed", 0, 0);
    } else if (dlc_client_count_blocks(S.client, SPARSE_BLOCK) ||   /* auto's dense rounds */
               dlc_client_begin(S.client, S.data, S.out, S.elements, dlc_now())) {
        fail("dlc_client_begin failed", 0, 0);
    }
}

static void client_new(int cfg) {
    S.cfg = cfg;
    S.auth = cfg & CFG_ENCRYPT ? AUTH_ENCRYPT : AUTH_MAC;
    S.elements = cfg & CFG_MANY ? ELEMENTS_MANY : ELEMENTS_FEW;
    S.client = dlc_client_new(S.fd[F_CLIENT], 0, WORKERS, K, S.auth, 0.02, 0.005, 0.05, 0.1,
                              0.0, 0);
    if (!S.client ||
        dlc_client_shard(S.client, INADDR_LOOPBACK, S.port[F_SWITCH], JOB,
                         cfg & CFG_MANY ? SLOTS_MANY : SLOTS_FEW, KEYS) < 0)
        fail("cannot make the client", 0, 0);
    if (cfg & CFG_RESULTS) dlc_client_set_results_fd(S.client, S.fd[F_RESULTS]);
    if (cfg & CFG_NO_GSO) dlc_client_set_gso(S.client, 0);
    client_begin();
    switch_reads();
}

/* One slice of the client's loop; an op that ended (done or failed) makes way for the next. */
static void run_slice(void) {
    int r = dlc_client_run(S.client, SLICE_S);
    if (r < 0) {
        char text[512];
        long arg;
        int shard, slot;
        uint64_t missing, seq;
        double idle;
        if (dlc_client_error(S.client, text, sizeof text, &arg, &shard, &missing, &slot, &seq,
                             &idle, dlc_now()) == E_SOCKET)
            fail("the client's loop failed on loopback (errno)", arg, 0);
    }
    if (r) {
        if (r > 0) S.ops_done++; else S.ops_failed++;
        client_begin();
    }
    S.pending = 0; S.pending_sends = 0;
    switch_reads();
}

/* -- sending to the client ------------------------------------------------------------- */
/* pieces[i] of `size` bytes (the last shorter) at `from`, each sealed alone if asked: the
 * batch's bytes and the size of its segments (what a sealed piece became). */
static size_t make_batch(uint8_t sel, const uint8_t *from, size_t n, size_t size, size_t *seg) {
    size_t at = 0;
    *seg = 0;
    for (size_t off = 0; off < n; off += size) {
        size_t part = n - off < size ? n - off : size;
        memcpy(S.batch + at, from + off, part);
        if ((sel & SEL_SEAL) && part >= DLC_HDR) {
            dlc_hdr h;
            dlc_hdr_unpack(S.batch + at, &h);
            int result = h.type == T_RESULT;
            if (dlc_seal(S.crypto, KEYS + (result ? 32 : 16), S.auth,
                         result ? STREAM_RESULT : STREAM_DOWN, h.counter, S.batch + at, part,
                         S.batch + at, S.batch + at + part))
                fail("dlc_seal failed", (long)part, S.auth);
            part += DLC_TAG;
        }
        if (!*seg) *seg = part;
        at += part;
    }
    return at;
}

/* The batch's len bytes, datagrams of seg bytes (the last shorter; none if len is 0: one
 * empty datagram, which the client does not count), from socket `from` to socket `to`. */
static void send_batch(int from, int to, size_t len, size_t seg) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(S.port[to]),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct iovec iov = {.iov_base = S.batch, .iov_len = len};
    char ctrl[DLC_SEG_CTRL];
    struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = &iov, .msg_iovlen = 1};
    size_t count = seg ? (len + seg - 1) / seg : 0;
    if (count > 1) dlc_segment(&m, ctrl, seg);   /* GRO hands it to the client whole */
    if (sendmsg(S.fd[from], &m, 0) < 0) {
        if (count <= 1) fail("cannot send to the client", errno, (long)len);
        for (size_t off = 0; off < len; off += seg) {   /* no GSO here: one by one */
            iov.iov_base = S.batch + off;
            iov.iov_len = len - off < seg ? len - off : seg;
            m.msg_control = NULL; m.msg_controllen = 0;
            if (sendmsg(S.fd[from], &m, 0) < 0) fail("cannot send to the client", errno, 0);
        }
    }
    S.sent += count;
    S.pending += len; S.pending_sends++;
}

static void one_record(uint8_t sel, const uint8_t *bytes, size_t n) {
    int count = sel & SEL_COUNT;
    S.records++;
    if (count) {
        if (n > 65507 - 15 * DLC_TAG) n = 65507 - 15 * DLC_TAG;   /* room for the tags */
        size_t seg, len = make_batch(sel, bytes, n, (n + (size_t)count - 1) / (size_t)count,
                                     &seg);
        int to = (sel & SEL_RESULTS) && (S.cfg & CFG_RESULTS) ? F_RESULTS : F_CLIENT;
        send_batch(sel & SEL_STRANGER ? F_STRANGER : F_SWITCH, to, len, seg);
    }
    if (!count && !(sel & SEL_RUN)) {   /* time passes; the worker does not run */
        struct timespec pause = {0, (long)(SLICE_S * 1e9)};
        nanosleep(&pause, NULL);
    } else if ((sel & SEL_RUN) || S.pending > PENDING_MAX || S.pending_sends > PENDING_SENDS) {
        run_slice();
    }
}

/* At the end: run until nothing waits at the client's sockets, then every datagram sent was
 * counted once (the client counts what it read, before it refuses anything). */
static void settle(void) {
    uint64_t stats[8];
    for (int tries = 0; tries < 1000; tries++) {
        run_slice();
        if (!waiting(S.fd[F_CLIENT]) && !waiting(S.fd[F_RESULTS])) break;
    }
    dlc_client_stats(S.client, stats);
    if (stats[S_RECV] != S.sent)
        fail("the client counted another number of datagrams than it was sent",
             (long)stats[S_RECV], (long)S.sent);
}

static void drain_all(void) {
    for (int i = 0; i < NFDS; i++)
        while (recv(S.fd[i], S.buf, 65536, 0) >= 0) {}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!S.crypto) init();
    drain_all();
    S.records = 0; S.sent = 0; S.pending = 0; S.pending_sends = 0;
    S.checked = 0; S.ops_done = 0; S.ops_failed = 0;
    client_new(size ? data[0] : 0);
    dlc_each_record(data, size, size ? 1 : 0, one_record);
    settle();
    if (getenv("DLC_FUZZ_STATS")) {
        uint64_t stats[8];
        dlc_client_stats(S.client, stats);
        fprintf(stderr, "fuzz_socket: %lu records, %lu datagrams to the client, %lu from it "
                "checked, ops done %lu, failed %lu, refused %llu\n", S.records, S.sent,
                S.checked, S.ops_done, S.ops_failed, (unsigned long long)stats[S_REJECTED]);
    }
    dlc_client_free(S.client);
    S.client = NULL;
    return 0;
}
