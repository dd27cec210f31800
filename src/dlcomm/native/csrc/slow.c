/* The slow path: datagrams of the jobs the Python dataplane serves (sparse jobs, jobs of
 * more than 64 workers), handed from the packet loops to Python through a bounded queue. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dlc.h"

#define SLOW_MAX_BYTES (16u << 20)

struct dlc_slow { struct dlc_slow *next; uint32_t ip; uint16_t port; size_t len; uint8_t data[]; };

void dlc_slow_clear(dlc_switch *sw) {
    for (struct dlc_slow *s = sw->slow_head, *n; s; s = n) { n = s->next; free(s); }
    sw->slow_head = sw->slow_tail = NULL;
    sw->slow_bytes = 0;
}

int dlc_slow_push(dlc_switch *sw, const uint8_t *data, size_t len, uint32_t ip, uint16_t port) {
    pthread_mutex_lock(&sw->slow_mu);
    if (sw->slow_bytes + len > SLOW_MAX_BYTES) {
        pthread_mutex_unlock(&sw->slow_mu);
        return -1;   /* the Python dataplane is behind: a drop, as a full socket buffer */
    }
    struct dlc_slow *s = malloc(sizeof *s + len);
    if (s) {
        s->next = NULL; s->ip = ip; s->port = port; s->len = len;
        memcpy(s->data, data, len);
        if (sw->slow_tail) sw->slow_tail->next = s; else sw->slow_head = s;
        sw->slow_tail = s;
        sw->slow_bytes += len;
        pthread_cond_signal(&sw->slow_cv);
    }
    pthread_mutex_unlock(&sw->slow_mu);
    return s ? 0 : -1;
}

/* The next slow-path datagram (its length), 0 after timeout_ms, -1 once stopping. */
long dlc_slow_next(dlc_switch *sw, uint8_t *buf, size_t cap, uint32_t *ip, uint16_t *port,
                   int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)timeout_ms * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&sw->slow_mu);
    while (!sw->slow_head && !__atomic_load_n(&sw->stopping, __ATOMIC_ACQUIRE) &&
           pthread_cond_timedwait(&sw->slow_cv, &sw->slow_mu, &until) == 0) {}
    struct dlc_slow *s = sw->slow_head;
    long r = __atomic_load_n(&sw->stopping, __ATOMIC_ACQUIRE) ? -1 : 0;
    if (s) {
        sw->slow_head = s->next;
        if (!sw->slow_head) sw->slow_tail = NULL;
        sw->slow_bytes -= s->len;
        size_t n = s->len < cap ? s->len : cap;
        memcpy(buf, s->data, n);
        *ip = s->ip; *port = s->port;
        r = (long)n;
        free(s);
    }
    pthread_mutex_unlock(&sw->slow_mu);
    return r;
}

