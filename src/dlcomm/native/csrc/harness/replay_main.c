/* Runs a libFuzzer target (fuzz_target.c or fuzz_socket.c) once on every file named on the
 * command line, and on every regular file of a named directory (in name order): the
 * sanitizer build's corpus replay, and how a crash file is reproduced where no fuzzer is at
 * hand.
 *
 *     dlc_replay [-v] FILE_OR_DIR...      exit 0 once every input ran */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int verbose, inputs;
static size_t bytes;

/* One file, in a buffer of exactly its size (as libFuzzer hands it: ASan sees overreads). */
static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "dlc_replay: cannot read %s\n", path);
        if (f) fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *data = malloc(size ? size : 1);
    if (!data || fread(data, 1, size, f) != size) {
        fprintf(stderr, "dlc_replay: cannot read %s\n", path);
        free(data);
        fclose(f);
        return -1;
    }
    fclose(f);
    if (verbose) fprintf(stderr, "dlc_replay: %s (%zu bytes)\n", path, size);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    inputs++;
    bytes += size;
    return 0;
}

static int keep_entry(const struct dirent *e) { return e->d_name[0] != '.'; }

static int run_dir(const char *dir) {
    struct dirent **names;
    int n = scandir(dir, &names, keep_entry, alphasort), bad = 0;
    if (n < 0) {
        fprintf(stderr, "dlc_replay: cannot list %s\n", dir);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]->d_name) + 2;
        char *path = malloc(len);
        struct stat st;
        if (path) {
            snprintf(path, len, "%s/%s", dir, names[i]->d_name);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && run_file(path)) bad = -1;
        }
        free(path);
        free(names[i]);
    }
    free(names);
    return bad;
}

int main(int argc, char **argv) {
    int bad = 0, first = 1;
    if (argc > 1 && strcmp(argv[1], "-v") == 0) { verbose = 1; first = 2; }
    if (argc <= first) {
        fprintf(stderr, "usage: %s [-v] FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    for (int i = first; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) {
            fprintf(stderr, "dlc_replay: no such file %s\n", argv[i]);
            bad = 1;
        } else if (S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i])) {
            bad = 1;
        }
    }
    fprintf(stderr, "dlc_replay: %d inputs, %zu bytes replayed\n", inputs, bytes);
    return bad;
}
