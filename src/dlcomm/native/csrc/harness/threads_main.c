/* The native switch's threads at work together, for ThreadSanitizer (built with
 * -fsanitize=thread by src/dlcomm/native/harness.py): what `dlcomm switch serve` runs, in C.
 *
 *   - SERVERS threads serve one loopback port (SO_REUSEPORT sockets), as the switch's
 *     threads do (dlc_serve);
 *   - four load generators play the workers of four jobs at once (dlc_loadgen, as `dlcomm
 *     bench switch` does): job 1, 4 workers, MAC; job 3, 2 workers, encrypted; job 9, 3
 *     workers, a job of sparse rounds sent dense rounds (as `auto`'s dense runs are);
 *     job 7, 2 workers, a job of the Python dataplane, whose datagrams the loops queue for
 *     a reader thread (dlc_slow_next, as the Python dataplane's thread reads them);
 *   - a control thread does what the Python control plane does meanwhile: counters, job
 *     info, failures taken, a job added, made live and removed again, and job 3 removed
 *     while its workers still send (its packets then meet no job).
 *
 *     dlc_threads [SECONDS]     exit 0 once every thread stopped; prints the rounds done
 *
 * Every socket is bound to 127.0.0.1. ThreadSanitizer reports any data race it sees. */
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../dlc.h"
#include "api.h"

#define SERVERS 2
#define K 256
#define SLOTS 16
#define LOOPBACK 0x7F000001u

typedef struct {
    int id, workers, auth, python, block; int fds[8]; uint16_t ports[8];
    uint8_t keys[17 * 16];   /* dlc_job_add's: up[0..n), down[0..n), result */
} job_t;

static dlc_switch *SW;
static uint16_t SW_PORT;
static double SECONDS;
static int DONE;   /* the load generators have finished (atomic) */

static int udp(uint16_t port, int reuse, uint16_t *bound) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || (reuse && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one)) ||
        bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        perror("dlc_threads: a loopback socket");
        exit(2);
    }
    if (bound) *bound = ntohs(a.sin_port);
    return fd;
}

static void add_job(const job_t *j) {
    uint32_t ips[8];
    for (int r = 0; r < j->workers; r++) ips[r] = LOOPBACK;
    if (dlc_job_add(SW, j->id, j->workers, ips, j->ports, SLOTS, K, dlc_value_limit(j->workers),
                    j->auth, j->keys, 0, 0, j->python) ||
        (j->block && dlc_job_sparse(SW, j->id, j->block)) || dlc_job_set_live(SW, j->id, 1)) {
        fprintf(stderr, "dlc_threads: cannot add job %d\n", j->id);
        exit(2);
    }
}

static void make_job(job_t *j, int id, int workers, int auth) {
    j->id = id; j->workers = workers; j->auth = auth;
    for (int r = 0; r < workers; r++) j->fds[r] = udp(0, 0, &j->ports[r]);
    for (int i = 0; i < (2 * workers + 1) * 16; i++) j->keys[i] = (uint8_t)(id * 31 + i);
}

/* The Python dataplane's side of the slow path: reads what the loops queue, until stopped. */
static void *slow_reader(void *arg) {
    static uint8_t buf[65536];
    long *taken = arg, r;
    uint32_t ip;
    uint16_t port;
    while ((r = dlc_slow_next(SW, buf, sizeof buf, &ip, &port, 50)) >= 0) *taken += r > 0;
    return NULL;
}

static void *serve(void *arg) {
    int64_t cpu;
    dlc_serve(SW, *(int *)arg, 0.0, 0, 1, &cpu);
    return NULL;
}

static void *load(void *arg) {
    job_t *j = arg;
    uint64_t stats[16];
    if (dlc_loadgen(j->fds, j->workers, LOOPBACK, SW_PORT, (uint16_t)j->id, K, SLOTS, j->auth,
                    j->keys, SECONDS, 1, stats)) {
        fprintf(stderr, "dlc_threads: the load generator of job %d failed\n", j->id);
        exit(2);
    }
    printf("job %d: %llu rounds\n", j->id, (unsigned long long)stats[0]);
    return NULL;
}

/* The control plane's calls, over and over, while the packets flow. */
static void *control(void *arg) {
    const job_t *spare = arg;
    uint64_t counters[C_COUNT], waiting;
    double last, since, t0 = dlc_now();
    char failure[256];
    int slot, removed = 0;
    int64_t round;
    uint16_t ids[64];
    while (!__atomic_load_n(&DONE, __ATOMIC_ACQUIRE)) {
        dlc_counters(SW, counters);
        dlc_job_info(SW, 1, counters, &last, failure, sizeof failure, dlc_now(), &waiting,
                     &since, &slot, &round);
        dlc_job_info(SW, 3, counters, &last, failure, sizeof failure, dlc_now(), &waiting,
                     &since, &slot, &round);
        dlc_take_failures(SW, ids, 64, 1);
        add_job(spare);
        dlc_job_remove(SW, spare->id);
        if (!removed && dlc_now() - t0 > SECONDS / 2) removed = !dlc_job_remove(SW, 3);
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    SECONDS = argc > 1 ? atof(argv[1]) : 1.0;
    if (!(SECONDS > 0 && SECONDS <= 60)) {
        fprintf(stderr, "usage: %s [SECONDS in (0, 60]]\n", argv[0]);
        return 2;
    }
    SW = dlc_switch_new();
    if (!SW) return 2;
    int sfd[SERVERS];
    sfd[0] = udp(0, 1, &SW_PORT);
    for (int i = 1; i < SERVERS; i++) sfd[i] = udp(SW_PORT, 1, NULL);
    static job_t big, small, sparse, slow, spare;
    make_job(&big, 1, 4, AUTH_MAC);
    make_job(&small, 3, 2, AUTH_ENCRYPT);
    make_job(&sparse, 9, 3, AUTH_MAC);
    sparse.block = 32;
    make_job(&slow, 7, 2, AUTH_MAC);
    slow.python = 1;
    make_job(&spare, 5, 2, AUTH_MAC);
    add_job(&big);
    add_job(&small);
    add_job(&sparse);
    add_job(&slow);
    long slow_taken = 0;
    pthread_t servers[SERVERS], loads[4], ctl, reader;
    for (int i = 0; i < SERVERS; i++) pthread_create(&servers[i], NULL, serve, &sfd[i]);
    pthread_create(&reader, NULL, slow_reader, &slow_taken);
    pthread_create(&ctl, NULL, control, &spare);
    pthread_create(&loads[0], NULL, load, &big);
    pthread_create(&loads[1], NULL, load, &small);
    pthread_create(&loads[2], NULL, load, &slow);
    pthread_create(&loads[3], NULL, load, &sparse);
    for (int i = 0; i < 4; i++) pthread_join(loads[i], NULL);
    __atomic_store_n(&DONE, 1, __ATOMIC_RELEASE);
    pthread_join(ctl, NULL);
    dlc_stop(SW);
    for (int i = 0; i < SERVERS; i++) pthread_join(servers[i], NULL);
    pthread_join(reader, NULL);
    uint64_t counters[C_COUNT];
    dlc_counters(SW, counters);
    printf("switch: %llu packets in, %ld to the slow path\n",
           (unsigned long long)counters[C_packets_in], slow_taken);
    for (int i = 0; i < SERVERS; i++) close(sfd[i]);
    for (int r = 0; r < 4; r++) close(big.fds[r]);
    for (int r = 0; r < 3; r++) close(sparse.fds[r]);
    for (int r = 0; r < 2; r++) { close(small.fds[r]); close(slow.fds[r]); close(spare.fds[r]); }
    dlc_switch_free(SW);
    return 0;
}
