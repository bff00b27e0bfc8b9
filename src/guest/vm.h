/* tether-guest as PID 1 of a microVM (the `microvm` substrate, SPEC §9):
 * the kernel runs it as /init of the initramfs with no arguments. It
 * brings the VM up (vm.c: /proc, /sys, /dev, the virtio modules in order,
 * the read-only root and the writable layer from virtio block devices,
 * then the switch into that root) and serves the host over the one
 * virtio-serial port (vmchan.c: lib/mux.h streams, each served as one
 * connection by guest_serve in a handler process of its own). */
#ifndef TT_GUEST_VM_H
#define TT_GUEST_VM_H

#include <stdbool.h>

#include "guest/guest.h"

/* Name of the virtio-serial port the host opens (QEMU virtserialport
 * name=...; src/substrate/microvm/microvm.c uses the same). */
#define GUEST_VM_PORT_NAME "tether.0"
/* Inside the initramfs: the modules and the order to load them in
 * (one file name per line, written by the asset builder). */
#define GUEST_VM_MODULES_DIR "/lib/tether-modules"
#define GUEST_VM_MODULES_LIST "/lib/tether-modules/order"

/* guest_vm_wanted: we are PID 1 started by a kernel as /init with no
 * arguments (a microVM), not PID 1 of an `ns` sandbox (which always has
 * --listen). */
bool guest_vm_wanted(int argc, char **argv);
/* guest_vm_main: brings the VM up and serves; returns only on a failure
 * before serving (the kernel then panics and QEMU exits: the manager sees
 * the execution lost). */
int guest_vm_main(void);

/* vmchan_serve: serves the host on the open port fd (non-blocking) until
 * a fatal error; g carries root_fd and idle_timeout_s, the identity comes
 * with each session's ASSIGN. */
int vmchan_serve(int port, struct guest_ctx *g);

#endif
