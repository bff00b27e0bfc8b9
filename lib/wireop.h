/* The operations, one table (lib/wireop.c): each name that travels in a
 * REQUEST's "op" (docs/ARCHITECTURE.md, "Wire protocol") or in a control
 * capability's "ops" claim (SPEC §3), with what it is: the capability bit
 * it names in a token, the capability a data operation needs, whether its
 * opener sends input, whether it is a control request to the sbx-manager.
 * The cp (capability ops), node-api (routes), the manager (admission and
 * its control requests) and the guest (dispatch) all read it. No libuv, no
 * jansson: the guest links it statically. */
#ifndef TT_WIREOP_H
#define TT_WIREOP_H

#include <stdbool.h>
#include <stdint.h>

/* Operations a control capability may permit (bit set in its ops). Unknown
 * names in a token are ignored: they grant nothing. */
enum tt_op {
	TT_OP_EXEC = 1u << 0,     /* "exec" */
	TT_OP_FS_READ = 1u << 1,  /* "fs.read" */
	TT_OP_FS_WRITE = 1u << 2, /* "fs.write" */
	TT_OP_PTY = 1u << 3,      /* "pty" */
	TT_OP_WATCH = 1u << 4,    /* "watch" */
};

enum wire_op {
	WIRE_OP_UNKNOWN = 0,  /* a name the table does not know */
	WIRE_OP_EXEC,         /* data operations: admitted, run by the guest */
	WIRE_OP_FS_READ,
	WIRE_OP_FS_WRITE,
	WIRE_OP_FS_STAT,
	WIRE_OP_FS_LIST,
	WIRE_OP_FS_MKDIR,
	WIRE_OP_FS_REMOVE,
	WIRE_OP_PTY,          /* a capability name only (not served yet) */
	WIRE_OP_WATCH,        /* a capability name; to the manager: node-api's
	                       * watch of lost executions (control) */
	WIRE_OP_STATUS,       /* control requests, node-api -> manager */
	WIRE_OP_FEED_APPLY,
	WIRE_OP_COUNT,
};

/* wireop_parse: the operation named s (NULL or unknown: WIRE_OP_UNKNOWN). */
enum wire_op wireop_parse(const char *s);
/* wireop_name: its name; NULL for WIRE_OP_UNKNOWN or out of range. */
const char *wireop_name(enum wire_op op);
/* wireop_cap: the tt_op bit the name stands for in a capability's ops
 * claim, 0 when it is not one. */
uint32_t wireop_cap(enum wire_op op);
/* wireop_of_cap: the operation whose capability bit is bit (exactly one
 * bit), else WIRE_OP_UNKNOWN. */
enum wire_op wireop_of_cap(uint32_t bit);
/* wireop_needs: the tt_op bit a data operation needs; 0 when op is not a
 * data operation. */
uint32_t wireop_needs(enum wire_op op);
/* wireop_input: its opener may send DATA_IN (exec's stdin, fs.write). */
bool wireop_input(enum wire_op op);
/* wireop_control: a control request the sbx-manager answers itself. */
bool wireop_control(enum wire_op op);

#endif
