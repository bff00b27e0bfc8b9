/* The operations table (see wireop.h). */
#include "wireop.h"

#include <string.h>

static const struct {
	const char *name;
	uint32_t cap;   /* the bit it names in a token's ops */
	uint32_t needs; /* the bit a data operation needs */
	bool input;
	bool control;
} wireops[WIRE_OP_COUNT] = {
	[WIRE_OP_EXEC] = { "exec", TT_OP_EXEC, TT_OP_EXEC, true, false },
	[WIRE_OP_FS_READ] = { "fs.read", TT_OP_FS_READ, TT_OP_FS_READ, false, false },
	[WIRE_OP_FS_WRITE] = { "fs.write", TT_OP_FS_WRITE, TT_OP_FS_WRITE, true, false },
	[WIRE_OP_FS_STAT] = { "fs.stat", 0, TT_OP_FS_READ, false, false },
	[WIRE_OP_FS_LIST] = { "fs.list", 0, TT_OP_FS_READ, false, false },
	[WIRE_OP_FS_MKDIR] = { "fs.mkdir", 0, TT_OP_FS_WRITE, false, false },
	[WIRE_OP_FS_REMOVE] = { "fs.remove", 0, TT_OP_FS_WRITE, false, false },
	[WIRE_OP_PTY] = { "pty", TT_OP_PTY, 0, false, false },
	[WIRE_OP_WATCH] = { "watch", TT_OP_WATCH, 0, false, true },
	[WIRE_OP_STATUS] = { "status", 0, 0, false, true },
	[WIRE_OP_FEED_APPLY] = { "feed.apply", 0, 0, false, true },
};

/* wireop_known: op is a row of the table. */
static bool wireop_known(enum wire_op op)
{
	return (unsigned)op < WIRE_OP_COUNT && op != WIRE_OP_UNKNOWN;
}

/* wireop_parse: see wireop.h. */
enum wire_op wireop_parse(const char *s)
{
	for (unsigned i = 1; s != NULL && i < WIRE_OP_COUNT; i++)
		if (strcmp(s, wireops[i].name) == 0)
			return (enum wire_op)i;
	return WIRE_OP_UNKNOWN;
}

/* wireop_name: see wireop.h. */
const char *wireop_name(enum wire_op op)
{
	return wireop_known(op) ? wireops[op].name : NULL;
}

/* wireop_cap: see wireop.h. */
uint32_t wireop_cap(enum wire_op op)
{
	return wireop_known(op) ? wireops[op].cap : 0;
}

/* wireop_of_cap: see wireop.h. */
enum wire_op wireop_of_cap(uint32_t bit)
{
	for (unsigned i = 1; bit != 0 && i < WIRE_OP_COUNT; i++)
		if (wireops[i].cap == bit)
			return (enum wire_op)i;
	return WIRE_OP_UNKNOWN;
}

/* wireop_needs: see wireop.h. */
uint32_t wireop_needs(enum wire_op op)
{
	return wireop_known(op) ? wireops[op].needs : 0;
}

/* wireop_input: see wireop.h. */
bool wireop_input(enum wire_op op)
{
	return wireop_known(op) && wireops[op].input;
}

/* wireop_control: see wireop.h. */
bool wireop_control(enum wire_op op)
{
	return wireop_known(op) && wireops[op].control;
}
