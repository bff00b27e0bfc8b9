/* The bridge's transport to a microVM's guest (the `microvm` substrate,
 * SPEC §5, §9): one connection to the VMM's chardev socket (QEMU listens;
 * the guest keeps its virtio-serial port open), carrying lib/mux.h
 * streams. Each guest connection the bridge would open on the `ns`
 * substrate is a stream here: the caller gets one end of a socketpair and
 * runs the same HELLO handshake and relay on it as on a unix connection,
 * while this module pumps the other end through the channel under the
 * stream's credit.
 *
 * Verification: the caller checks the listener (file, sock_diag, owner =
 * the pinned QEMU) before every open, as for a unix guest socket; this
 * module checks the channel's peer (SO_PEERCRED/pidfd, start time,
 * executable: the pinned QEMU) when it connects and again before every
 * stream it opens, and a session is only used once the guest answered its
 * SYNC and took this activation's ASSIGN. A dropped channel fails every
 * stream on it; the next open connects again, verified in full. */
#ifndef TETHER_BRIDGE_VMCHAN_H
#define TETHER_BRIDGE_VMCHAN_H

#include <stdint.h>
#include <uv.h>

#include "err.h"
#include "hello.h"
#include "procid.h"
#include "refusal.h"

/* A session waits this long for the guest's answer (a TCG boot: 2-10 s). */
#define VMCHAN_SESSION_MS 60000

struct vmchan;

/* vmchan_open_cb: a stream is open (fd: the bridge's end, owned by the
 * callee, non-blocking) or not (fd -1, with the refusal reason — REFUSAL_NONE
 * for a transport failure — and a message). */
typedef void (*vmchan_open_cb)(void *arg, int fd, enum refusal reason, const char *msg);

/* vmchan_new: the channel of one activation; nothing is connected yet.
 * owner: the pinned VMM (kept by reference: the caller's); secret
 * HELLO_SECRET_LEN bytes (copied, zeroed at free). */
struct vmchan *vmchan_new(uv_loop_t *loop, const struct proc_identity *owner,
                          const char *sbx, uint64_t gen, uint32_t att,
                          const uint8_t secret[HELLO_SECRET_LEN]);
/* vmchan_open: a new stream. path names the chardev socket the caller
 * verified (a "/proc/self/fd/N" alias: used within this call only, when a
 * connection must be made). cb runs later, exactly once. */
void vmchan_open(struct vmchan *v, const char *path, vmchan_open_cb cb, void *arg);
/* vmchan_free: ends the channel (its streams fail). */
void vmchan_free(struct vmchan *v);

#endif
