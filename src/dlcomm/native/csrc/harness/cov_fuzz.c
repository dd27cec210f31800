/* A small coverage-guided fuzzer for gcc, where there is no libFuzzer: it drives the same
 * LLVMFuzzerTestOneInput (fuzz_target.c or fuzz_socket.c) that clang -fsanitize=fuzzer
 * links with.
 *
 * Coverage: the target and the library are built with -fsanitize-coverage=trace-pc, so gcc
 * calls __sanitizer_cov_trace_pc() at every basic block; this file (built without it) hashes
 * the caller's return address into an edge bitmap, AFL's way. An input whose run reaches an
 * edge, or an edge's hit-count bucket, not seen before joins the corpus (and -o DIR). Inputs
 * are mutated with a few generic moves and a few that know the targets' records (u8
 * selector, u16 length, bytes; records.h) and the 32-byte header inside them.
 *
 * A crash (abort, a fault, or a sanitizer report: its death callback) writes the input to
 * DIR/crash-<execs> first; a run past -T seconds to DIR/timeout-<execs>. Exit: 0, or not 0
 * after a crash.
 *
 * -H N: the records begin after N bytes (fuzz_socket.c's configuration byte: -H 1).
 *
 *     dlc_fuzz [-t SECONDS] [-n RUNS] [-s SEED] [-m MAX_LEN] [-T TIMEOUT] [-o DIR] [-H N]
 *              [SEEDS...]
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* the sanitizers' hook before they exit on a report (absent without them: weak) */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

#define MAP_SIZE (1u << 16)
#define MAX_CORPUS 16384
#define MAX_RECORDS 512
#define MAX_LEN_LIMIT (1u << 20)

/* -- coverage -------------------------------------------------------------------------- */
static uint8_t trace[MAP_SIZE];    /* this run's hit counts per edge (saturating) */
static uint8_t virgin[MAP_SIZE];   /* hit-count buckets seen so far per edge */
static uintptr_t prev_block;
static unsigned edges;

/* Not instrumented by the sanitizers: it runs before they are set up too (the ifunc
 * resolvers of target_clones run while the program is being relocated). */
__attribute__((no_sanitize("address", "undefined")))
void __sanitizer_cov_trace_pc(void) {
    uintptr_t block = (uintptr_t)(((uint64_t)(uintptr_t)__builtin_return_address(0) *
                                   0x9E3779B97F4A7C15ull) >> 48);
    uint8_t *t = &trace[(block ^ prev_block) & (MAP_SIZE - 1)];
    *t += *t != 255;          /* wrapping to 0 would hide the edge */
    prev_block = block >> 1;  /* so that A->B and B->A are different edges */
}

/* AFL's buckets: 1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+ hits are different coverage. */
static uint8_t bucket(uint8_t n) {
    if (n <= 2) return n;
    if (n == 3) return 4;
    if (n < 8) return 8;
    if (n < 16) return 16;
    if (n < 32) return 32;
    return n < 128 ? 64 : 128;
}

/* Whether the last run reached anything new (and note it). */
static int new_coverage(void) {
    int fresh = 0;
    for (size_t i = 0; i < MAP_SIZE; i += 8) {
        uint64_t word;
        memcpy(&word, trace + i, 8);
        if (!word) continue;
        for (size_t j = i; j < i + 8; j++) {
            uint8_t b = trace[j] ? bucket(trace[j]) : 0;
            if (b & ~virgin[j]) {
                edges += !virgin[j];
                virgin[j] |= b;
                fresh = 1;
            }
        }
    }
    return fresh;
}

/* -- crashes --------------------------------------------------------------------------- */
static const char *out_dir = ".";
static const uint8_t *current;
static size_t current_size;
static unsigned long execs;
static volatile sig_atomic_t crashed;
static struct sigaction old_actions[32];

/* Async-signal-safe: open, write, close, and no stdio. */
static void write_input(const char *kind) {
    char path[4096], digits[24];
    size_t n = 0, d = 0;
    unsigned long v = execs;
    do { digits[d++] = (char)('0' + v % 10); v /= 10; } while (v);
    for (const char *s = out_dir; *s && n < 4000; s++) path[n++] = *s;
    path[n++] = '/';
    for (const char *s = kind; *s; s++) path[n++] = *s;
    while (d) path[n++] = digits[--d];
    path[n] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t at = 0; fd >= 0 && at < current_size;) {
        ssize_t w = write(fd, current + at, current_size - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    if (fd >= 0) close(fd);
    const char *msg = "\ncov_fuzz: the input is in ";
    if (write(2, msg, strlen(msg)) < 0 || write(2, path, n) < 0 || write(2, "\n", 1) < 0) {}
}

static void on_death(void) {
    if (crashed || !current) return;   /* e.g. LeakSanitizer at exit: no input to blame */
    crashed = 1;
    write_input("crash-");
}

/* Write the input, then let the signal do what it did before: a fault happens again on
 * return (and reaches, say, ASan's handler); an abort() goes on to die. */
static void on_signal(int sig) {
    on_death();
    sigaction(sig, &old_actions[sig], NULL);
    if (sig == SIGABRT) raise(sig);
}

static void on_alarm(int sig) {
    (void)sig;
    write_input("timeout-");
    _exit(70);
}

static void install_handlers(void) {
    static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, &old_actions[sigs[i]]);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(on_death);
}

/* -- random numbers and inputs --------------------------------------------------------- */
static uint64_t rng_state = 1;

static uint64_t rnd64(void) {   /* xorshift64* */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static size_t rnd(size_t n) { return n ? (size_t)(rnd64() % n) : 0; }

typedef struct { uint8_t *d; size_t n; } input;

static input corpus[MAX_CORPUS];
static int ncorpus;
static size_t max_len = 8192;

/* Insert `len` bytes (`src`, or zeros) at `at`, as far as max_len lets. */
static void insert(input *b, size_t at, const uint8_t *src, size_t len) {
    if (b->n + len > max_len) len = max_len - b->n;
    memmove(b->d + at + len, b->d + at, b->n - at);
    if (src) memcpy(b->d + at, src, len); else memset(b->d + at, 0, len);
    b->n += len;
}

static void erase(input *b, size_t at, size_t len) {
    if (at + len > b->n) len = b->n - at;
    memmove(b->d + at, b->d + at + len, b->n - at - len);
    b->n -= len;
}

static void put(input *b, size_t at, uint64_t v, size_t width) {
    for (size_t i = 0; i < width && at + i < b->n; i++) b->d[at + i] = (uint8_t)(v >> (8 * i));
}

static size_t header_bytes;   /* -H: bytes before the first record (fuzz_socket.c: 1) */

/* Where each record of an input begins (its selector), as the targets read them. */
static int records(const input *b, size_t *at) {
    int n = 0;
    size_t body, len;
    for (size_t p = header_bytes; p < b->n && n < MAX_RECORDS;
         p = dlc_record(b->d, b->n, p, &body, &len))
        at[n++] = p;
    return n;
}

/* Where the record at `at` ends. */
static size_t record_end(const input *b, size_t at) {
    size_t body, len;
    return at < b->n ? dlc_record(b->d, b->n, at, &body, &len) : b->n;
}

/* -- mutations ------------------------------------------------------------------------- */
static const uint64_t INTERESTING[] = {
    0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 64, 4095, 4096, 0x7FFF, 0x8000 /* -32768 */, 0xFFFF,
    0xD1C0 /* magic */, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFFull,
    (uint64_t)-149 & 0xFFFF, 128, 129,
};
#define NINTERESTING (sizeof INTERESTING / sizeof INTERESTING[0])
/* header fields inside a record's bytes: offset, width (job .. counter; wire/packet.py) */
static const uint8_t FIELDS[][2] = {{2, 1}, {3, 1}, {4, 2}, {6, 2}, {8, 2}, {10, 2}, {12, 4},
                                    {16, 4}, {20, 2}, {22, 1}, {24, 8}};
#define NFIELDS (sizeof FIELDS / sizeof FIELDS[0])

/* A fresh record: a plausible DATA header of one of the target's jobs, numel int32 after it. */
static void new_record(input *b, size_t at) {
    uint8_t rec[3 + 32 + 4 * 16] = {0};
    size_t numel = rnd(2) ? 16 : rnd(17), len = 32 + 4 * numel;
    rec[0] = (uint8_t)rnd(256);
    rec[1] = (uint8_t)len; rec[2] = 0;
    uint8_t *h = rec + 3;
    h[0] = 0xC0; h[1] = 0xD1; h[2] = 2; h[3] = rnd(8) ? 1 : (uint8_t)rnd(6);
    h[4] = (uint8_t)(1 + rnd(5));
    h[6] = (uint8_t)rnd(3); h[8] = (uint8_t)rnd(4); h[10] = (uint8_t)numel;
    h[12] = (uint8_t)rnd(4); h[16] = (uint8_t)(16 * h[8]); h[24] = (uint8_t)rnd(64);
    for (size_t i = 0; i < numel; i++) h[32 + 4 * i] = (uint8_t)rnd(256);
    insert(b, at, rec, 3 + len);
}

/* A header field of the record at r (ending at end): an interesting value, or (arith) its
 * value a little up or down: seq + 1, counter - 1, ... */
static void mutate_field(input *b, size_t r, size_t end, int arith) {
    size_t f = rnd(NFIELDS), p = r + 3 + FIELDS[f][0], w = FIELDS[f][1];
    uint64_t v = 0, delta = 1 + rnd(16);
    if (p + w > end) return;
    for (size_t i = 0; i < w; i++) v |= (uint64_t)b->d[p + i] << (8 * i);
    v = !arith ? INTERESTING[rnd(NINTERESTING)] : rnd(2) ? v + delta : v - delta;
    put(b, p, v, w);
}

/* The record's length field: the body follows (half the time), or the records desync. */
static void mutate_length(input *b, size_t r, size_t end) {
    if (end - r < 3) return;
    size_t old = end - r - 3, len, before = b->n;
    switch (rnd(4)) {
    case 0: len = old + 1 + rnd(8); break;
    case 1: len = old - rnd(old < 8 ? old + 1 : 9); break;
    case 2: len = rnd(2) ? 0 : 0xFFFF; break;
    default: len = rnd(0x10000); break;
    }
    if (len > 0xFFFF) len = 0xFFFF;
    if (rnd(2)) {
        if (len > old) insert(b, end, NULL, len - old); else erase(b, r + 3 + len, old - len);
        len = b->n + old - before;   /* what insert() had room for */
    }
    put(b, r + 1, len, 2);
}

/* A record of another corpus input, inserted at `at`. */
static void splice_record(input *b, size_t at) {
    const input *o = &corpus[rnd((size_t)ncorpus)];
    size_t oat[MAX_RECORDS];
    int n = records(o, oat);
    if (!n) return;
    size_t s = oat[rnd((size_t)n)];
    insert(b, at, o->d + s, record_end(o, s) - s);
}

static void mutate_one(input *b) {
    size_t at[MAX_RECORDS];
    int nrec = records(b, at);
    size_t r = nrec ? at[rnd((size_t)nrec)] : 0, end = nrec ? record_end(b, r) : 0;
    uint8_t junk[8];
    switch (b->n ? rnd(12) : 7) {   /* an empty input can only grow */
    case 0: b->d[rnd(b->n)] ^= (uint8_t)(1u << rnd(8)); break;
    case 1: b->d[rnd(b->n)] = (uint8_t)(rnd(2) ? rnd(256) : INTERESTING[rnd(NINTERESTING)]); break;
    case 2: mutate_field(b, r, end, 0); break;
    case 3: mutate_field(b, r, end, 1); break;
    case 4: insert(b, end, b->d + r, end - r); break;        /* a record twice */
    case 5: if (nrec > 1) erase(b, r, end - r); break;       /* a record less */
    case 6: b->n = rnd(b->n); break;                         /* cut short */
    case 7: new_record(b, nrec && rnd(2) ? r : b->n); break;
    case 8: splice_record(b, r); break;
    case 9: b->d[r] = (uint8_t)rnd(256); break;              /* another selector */
    case 10: mutate_length(b, r, end); break;
    default:                                                 /* random bytes in or out */
        for (int i = 0; i < 8; i++) junk[i] = (uint8_t)rnd(256);
        if (rnd(2)) erase(b, rnd(b->n), 1 + rnd(8));
        else insert(b, rnd(b->n + 1), junk, 1 + rnd(8));
        break;
    }
}

/* -- the loop -------------------------------------------------------------------------- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned timeout_s = 10;

/* One run of the target on a copy of exactly the input's size; 1 if it found new coverage. */
static int run(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) { perror("cov_fuzz"); exit(1); }
    if (size) memcpy(copy, data, size);
    memset(trace, 0, sizeof trace);
    prev_block = 0;
    current = copy; current_size = size;
    alarm(timeout_s);
    LLVMFuzzerTestOneInput(copy, size);
    alarm(0);
    execs++;
    free(copy);
    current = NULL; current_size = 0;
    return new_coverage();
}

static uint64_t fnv1a(const uint8_t *d, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 0x100000001b3ull;
    return h;
}

static void keep(const uint8_t *data, size_t size, int save) {
    if (ncorpus == MAX_CORPUS) return;
    input *in = &corpus[ncorpus++];
    in->d = malloc(size ? size : 1);
    if (!in->d) { perror("cov_fuzz"); exit(1); }
    if (size) memcpy(in->d, data, size);
    in->n = size;
    if (!save) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/cov-%016llx", out_dir, (unsigned long long)fnv1a(data, size));
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(data, 1, size, f); fclose(f); }
}

static int max_len_given;

/* A seed, whole: unless -m was given, max_len grows to the largest seed (as libFuzzer's). */
static void load_file(const char *path) {
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f || fstat(fileno(f), &st)) { if (f) fclose(f); return; }
    if (!max_len_given && (size_t)st.st_size > max_len)
        max_len = (size_t)st.st_size < MAX_LEN_LIMIT ? (size_t)st.st_size : MAX_LEN_LIMIT;
    uint8_t *d = malloc(max_len);
    size_t n = d ? fread(d, 1, max_len, f) : 0;
    fclose(f);
    if (d && (run(d, n) || ncorpus == 0)) keep(d, n, 0);
    free(d);
}

static void load_seeds(const char *path) {
    struct stat st;
    if (stat(path, &st)) { fprintf(stderr, "cov_fuzz: no such file %s\n", path); return; }
    if (!S_ISDIR(st.st_mode)) { load_file(path); return; }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(file, &st) == 0 && S_ISREG(st.st_mode))
            load_file(file);
        free(names[i]);
    }
    if (n >= 0) free(names);
}

static void report(const char *what, double t0) {
    double dt = now_s() - t0;
    fprintf(stderr, "cov_fuzz: %s: execs %lu in %.1f s (%.0f exec/s), edges %u, corpus %d\n",
            what, execs, dt, dt > 0 ? (double)execs / dt : 0.0, edges, ncorpus);
}

int main(int argc, char **argv) {
    double seconds = 0;
    unsigned long runs = 0;
    int opt, save = 0;
    while ((opt = getopt(argc, argv, "t:n:s:m:T:o:H:")) != -1) {
        switch (opt) {
        case 't': seconds = atof(optarg); break;
        case 'n': runs = strtoul(optarg, NULL, 10); break;
        case 's': rng_state = strtoull(optarg, NULL, 10) * 0x9E3779B97F4A7C15ull | 1; break;
        case 'm': max_len = strtoul(optarg, NULL, 10); max_len_given = 1; break;
        case 'T': timeout_s = (unsigned)atoi(optarg); break;
        case 'o': out_dir = optarg; save = 1; break;
        case 'H': header_bytes = strtoul(optarg, NULL, 10); break;
        default:
            fprintf(stderr, "usage: %s [-t SECONDS] [-n RUNS] [-s SEED] [-m MAX_LEN] "
                    "[-T TIMEOUT] [-o DIR] [-H HEADER_BYTES] [SEED_FILES_OR_DIRS...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!seconds && !runs) seconds = 10;
    if (max_len < 16) max_len = 16;
    if (max_len > MAX_LEN_LIMIT) max_len = MAX_LEN_LIMIT;
    install_handlers();
    double t0 = now_s();
    run(NULL, 0);   /* the empty input: the baseline every other input is measured against */
    keep(NULL, 0, 0);
    fprintf(stderr, "cov_fuzz: first execution: edges %u\n", edges);
    for (int i = optind; i < argc; i++) load_seeds(argv[i]);
    report("seeds loaded", t0);
    input work = {malloc(max_len), 0};
    if (!work.d) { perror("cov_fuzz"); return 1; }
    double last_report = now_s();
    while ((!runs || execs < runs) && (!seconds || now_s() - t0 < seconds)) {
        const input *parent = &corpus[rnd((size_t)ncorpus)];
        work.n = parent->n < max_len ? parent->n : max_len;
        memcpy(work.d, parent->d, work.n);
        for (size_t m = 1 + rnd(4); m; m--) mutate_one(&work);
        if (run(work.d, work.n)) keep(work.d, work.n, save);
        if (now_s() - last_report >= 1.0) { report("running", t0); last_report = now_s(); }
    }
    report("done", t0);
    free(work.d);
    for (int i = 0; i < ncorpus; i++) free(corpus[i].d);
    return 0;
}
