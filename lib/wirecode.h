/* The error codes of wire ERROR frames ({"error":code,"message":…},
 * lib/wire.h), one enum with its strings and HTTP statuses in one table
 * (lib/wirecode.c). Senders name a code by its enum value; receivers parse
 * the string through the table, and a code the table does not know is
 * WIRE_E_INTERNAL, never undefined. node-api answers HTTP with the status
 * the table gives (docs/API.md), with the same codes. No libuv, no jansson: the guest links it
 * statically. */
#ifndef TT_WIRECODE_H
#define TT_WIRECODE_H

enum wire_code {
	WIRE_E_INTERNAL = 0,     /* the sender failed (also: an unknown code) */
	WIRE_E_BAD_REQUEST,      /* the REQUEST (or a frame in it) is malformed */
	WIRE_E_TRANSPORT,        /* a hop went away or broke the protocol */
	WIRE_E_REFRESH_ROUTE,    /* the execution was replaced or retired */
	WIRE_E_UNAVAILABLE,      /* the next hop is not reachable */
	WIRE_E_VERIFY_FAILED,    /* the bridge refused its guest (SPEC §5) */
	WIRE_E_OTHER_SANDBOX,    /* the bridge serves another sandbox */
	WIRE_E_NOT_FOUND,        /* file operations, from errno (guest) */
	WIRE_E_PATH_INVALID,
	WIRE_E_EXISTS,
	WIRE_E_NOT_DIR,
	WIRE_E_IS_DIR,
	WIRE_E_PERMISSION,
	WIRE_E_TOO_LARGE,
	WIRE_E_NO_SPACE,
	WIRE_E_CHANGED,          /* a file shrank during fs.read */
	WIRE_E_PEER_REFUSED,     /* guest handshake (src/guest/serve.c) */
	WIRE_E_HANDSHAKE_REQUIRED,
	WIRE_E_WRONG_ACTIVATION,
	WIRE_E_NO_SECRET,
	WIRE_E_INVALID_CLAIMS,   /* the signer refused a claim set */
	WIRE_E_LENGTH_REQUIRED,  /* node-api's HTTP answers only */
	WIRE_E_METHOD_NOT_ALLOWED,
	WIRE_E_COUNT,
};

/* wirecode_name: the code's string ("transport", ...); an out-of-range
 * value is "internal". */
const char *wirecode_name(enum wire_code c);
/* wirecode_parse: the code named s; NULL or a name not in the table is
 * WIRE_E_INTERNAL. */
enum wire_code wirecode_parse(const char *s);
/* wirecode_status: the HTTP status node-api answers for c. */
unsigned wirecode_status(enum wire_code c);

#endif
