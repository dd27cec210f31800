/* The entry points of switch.c, client.c and loadgen.c that dlc.h leaves to the ctypes
 * binding (the modules of src/dlcomm/native), for the harness's programs. */
#ifndef DLC_HARNESS_API_H
#define DLC_HARNESS_API_H

#include <stddef.h>
#include <stdint.h>

#include "../dlc.h"

/* switch.c */
int dlc_job_add(dlc_switch *sw, int id, int workers, const uint32_t *ips, const uint16_t *ports,
                int slot_count, int k, int32_t limit, int auth, const uint8_t *keys,
                uint32_t group_ip, uint16_t group_port, int python);
int dlc_job_remove(dlc_switch *sw, int id);
int dlc_job_set_live(dlc_switch *sw, int id, int live);
int dlc_job_sparse(dlc_switch *sw, int id, int block);
int dlc_job_info(dlc_switch *sw, int id, uint64_t *counters, double *last_packet,
                 char *failure, size_t cap, double now, uint64_t *waiting, double *since,
                 int *slot, int64_t *round);
int dlc_take_failures(dlc_switch *sw, uint16_t *ids, int cap, int timeout_ms);
const char *dlc_counter_names(void);
void dlc_counters(dlc_switch *sw, uint64_t *out);
void dlc_stop(dlc_switch *sw);
long dlc_slow_next(dlc_switch *sw, uint8_t *buf, size_t cap, uint32_t *ip, uint16_t *port,
                   int timeout_ms);
int dlc_serve(dlc_switch *sw, int fd, double drop_rate, uint64_t seed, int use_gro,
              int64_t *cpu_ns_out);

/* client.c: opaque here, client.c holds its layout */
typedef struct dlc_client dlc_client;
dlc_client *dlc_client_new(int fd, int rank, int workers, int k, int auth, double init_to,
                           double min_to, double max_to, double deadline_s, double drop_rate,
                           uint64_t seed);
void dlc_client_free(dlc_client *c);
int dlc_client_shard(dlc_client *c, uint32_t ip, uint16_t port, uint16_t job, int slots,
                     const uint8_t *keys);
int dlc_client_begin(dlc_client *c, const float *data, float *out, size_t n, double now);
int dlc_client_begin_sparse(dlc_client *c, float *data, float *out, size_t n, int block,
                            const uint8_t *present_in, const uint8_t *negzero_in, double now);
void dlc_client_set_gso(dlc_client *c, int on);
int dlc_client_count_blocks(dlc_client *c, int block);
void dlc_client_set_results_fd(dlc_client *c, int fd);
void dlc_client_on_datagram(dlc_client *c, const uint8_t *buf, size_t len, uint32_t ip,
                            uint16_t port, double now);
void dlc_client_on_timeout(dlc_client *c, double now);
int dlc_client_done(const dlc_client *c);
double dlc_client_next_deadline(const dlc_client *c);
long dlc_client_take(dlc_client *c, uint8_t *out, size_t cap);
int dlc_client_run(dlc_client *c, double slice_s);
void dlc_client_stats(const dlc_client *c, uint64_t *out);
int dlc_client_error(const dlc_client *c, char *text, size_t cap, long *arg, int *shard,
                     uint64_t *missing, int *slot, uint64_t *seq, double *idle, double now);

/* loadgen.c */
int dlc_loadgen(const int *fds, int n, uint32_t sw_ip, uint16_t sw_port, uint16_t job, int k,
                int slots, int auth, const uint8_t *keys, double seconds, int gso,
                uint64_t *stats);

/* wire/quant.value_limit: n workers of |q| <= limit never overflow int32 (a job's limit). */
static inline int32_t dlc_value_limit(int workers) {
    int log2n = 1;
    while ((1 << log2n) < workers) log2n++;
    return (int32_t)((1u << (31 - log2n)) - 1);
}

#endif
