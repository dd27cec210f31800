/* The kernel's UDP offloads, as the switch's loop, the client's and the load generator's
 * use them: batched receives (recvmmsg's headers, and the segment size of a datagram the
 * kernel handed over whole: UDP_GRO, a run of same-size datagrams from one sender in one
 * buffer), and segmented sends (UDP_SEGMENT: one sendmsg, datagrams of one size). */
#ifndef DLC_RX_H
#define DLC_RX_H

#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define DLC_SEG_CTRL CMSG_SPACE(sizeof(uint16_t))   /* room for dlc_segment's message */

/* Headers for n buffers of `size` bytes from buf, each with its sender's address (addrs,
 * or NULL) and room for a control message (ctrl, or NULL where GRO is off). */
static inline void dlc_rx_prepare(struct mmsghdr *msgs, struct iovec *iovs,
                                  struct sockaddr_in *addrs, char (*ctrl)[64], uint8_t *buf,
                                  size_t size, int n) {
    for (int i = 0; i < n; i++) {
        iovs[i].iov_base = buf + (size_t)i * size; iovs[i].iov_len = size;
        memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
        if (addrs) {
            msgs[i].msg_hdr.msg_name = &addrs[i];
            msgs[i].msg_hdr.msg_namelen = sizeof addrs[i];
        }
        msgs[i].msg_hdr.msg_iov = &iovs[i]; msgs[i].msg_hdr.msg_iovlen = 1;
        if (ctrl) { msgs[i].msg_hdr.msg_control = ctrl[i]; msgs[i].msg_hdr.msg_controllen = 64; }
    }
}

/* The size of the datagrams a received buffer of `len` bytes holds: the UDP_GRO segment
 * size its control message gives, else the buffer is one datagram. */
static inline size_t dlc_gro_segment(struct msghdr *m, size_t len) {
    size_t seg = len;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm; cm = CMSG_NXTHDR(m, cm))
        if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
            int g;
            memcpy(&g, CMSG_DATA(cm), sizeof g);
            if (g > 0) seg = (size_t)g;
        }
    return seg;
}

/* m's payload goes out as datagrams of `seg` bytes (the last may be shorter): a UDP_SEGMENT
 * control message in ctrl, DLC_SEG_CTRL bytes. */
static inline void dlc_segment(struct msghdr *m, char *ctrl, size_t seg) {
    memset(ctrl, 0, DLC_SEG_CTRL);
    m->msg_control = ctrl; m->msg_controllen = DLC_SEG_CTRL;
    struct cmsghdr *cm = CMSG_FIRSTHDR(m);
    cm->cmsg_level = SOL_UDP; cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t g = (uint16_t)seg;
    memcpy(CMSG_DATA(cm), &g, sizeof g);
}

#endif
