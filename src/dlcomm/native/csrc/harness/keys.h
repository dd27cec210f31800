/* The fuzz targets' fixed keys, mirrored in src/dlcomm/testing/native_corpus.py (FIXED_KEYS),
 * which writes seeds sealed with them: the two must match (tests/native/test_sanitized.py
 * compares them). */
#ifndef DLC_HARNESS_KEYS_H
#define DLC_HARNESS_KEYS_H

/* dlc_job_add's layout: up[0..n), down[0..n), result; 16 bytes each (the NUL is not used). */
static const char KEYS_MAC[7][17] = {
    "fuzz j1 up 0....", "fuzz j1 up 1....", "fuzz j1 up 2....",
    "fuzz j1 down 0..", "fuzz j1 down 1..", "fuzz j1 down 2..", "fuzz j1 result..",
};
static const char KEYS_ENC[7][17] = {
    "fuzz j3 up 0....", "fuzz j3 up 1....", "fuzz j3 up 2....",
    "fuzz j3 down 0..", "fuzz j3 down 1..", "fuzz j3 down 2..", "fuzz j3 result..",
};

static const char KEYS_SPARSE[7][17] = {
    "fuzz j6 up 0....", "fuzz j6 up 1....", "fuzz j6 up 2....",
    "fuzz j6 down 0..", "fuzz j6 down 1..", "fuzz j6 down 2..", "fuzz j6 result..",
};

#endif
