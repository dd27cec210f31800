/* The fuzz targets' inputs: records of  u8 selector, u16 little-endian length, that many
 * bytes; a record cut short by the end of the input takes what is left. */
#ifndef DLC_RECORDS_H
#define DLC_RECORDS_H

#include <stddef.h>
#include <stdint.h>

/* The record at data[at] (at < size): where its bytes begin and how many there are (*n);
 * returns where the next record begins (size at the end). */
static inline size_t dlc_record(const uint8_t *data, size_t size, size_t at, size_t *body,
                                size_t *n) {
    *body = at + 3 <= size ? at + 3 : size;
    *n = at + 3 <= size ? (size_t)(data[at + 1] | data[at + 2] << 8) : 0;
    if (*n > size - *body) *n = size - *body;
    return *body + *n;
}

/* one(selector, bytes, n) for each record of data[at:size], in order. */
static inline void dlc_each_record(const uint8_t *data, size_t size, size_t at,
                                   void (*one)(uint8_t, const uint8_t *, size_t)) {
    while (at < size) {
        size_t body, n, next = dlc_record(data, size, at, &body, &n);
        one(data[at], data + body, n);
        at = next;
    }
}

#endif
