/* Helpers every tether CLI verb shares (src/cli/common.c): the one-line
 * error, opening a client from the configuration, reading and printing
 * the JSON answers of libtether. */
#ifndef TT_CLI_CLI_H
#define TT_CLI_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "client/tether.h"

/* cli_fail: "tether: <message>" as one line on stderr; returns 1, the exit
 * status of a usage or operational error. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cli_open: a client for the configured cluster (caller frees with
 * tether_free), or NULL after printing why. */
struct tether *cli_open(void);
/* cli_str: a string member of obj, or dflt. */
const char *cli_str(json_t *obj, const char *key, const char *dflt);
/* cli_int: an integer member of obj (0 when absent). */
json_int_t cli_int(json_t *obj, const char *key);
/* cli_print_json: pretty, key-sorted JSON and a newline on stdout. */
void cli_print_json(json_t *j);
/* cli_resolve: the whole sandbox id for arg, a whole id or a unique
 * prefix of one (with or without "sbx_"), via the list; into out. 0, or
 * -1 after printing why (unknown, ambiguous, the list failed). */
#define CLI_ID_MAX 64
int cli_resolve(struct tether *t, const char *arg, char *out, size_t cap);
/* cli_size: bytes for people ("512 B", "3.4 KiB", "10.0 MiB") into buf. */
const char *cli_size(uint64_t bytes, char *buf, size_t cap);

/* cli_write_all: all of buf to fd; -1 (errno set) when it cannot. */
int cli_write_all(int fd, const void *buf, size_t len);

/* A progress line on stderr (bytes, rate, ETA), rewritten in place; shown
 * only on a terminal, not with -q, and only once a transfer takes longer
 * than a moment. */
struct cli_meter {
	const char *what;  /* e.g. "upload" (borrowed) */
	int on;
	int shown;
	int64_t t0_ms;
	int64_t last_ms;
};
/* cli_now_ms: monotonic milliseconds. */
int64_t cli_now_ms(void);
/* cli_meter_start: a meter for what, off when quiet or stderr is no tty. */
void cli_meter_start(struct cli_meter *m, const char *what, int quiet);
/* cli_meter_show: done of total bytes (total 0: unknown), at most 5 times
 * a second; note (may be NULL) follows the figures. With nothing counted
 * (both 0), the note and the time so far. */
void cli_meter_show(struct cli_meter *m, uint64_t done, uint64_t total,
                    const char *note);
/* cli_meter_end: clears the line if one was shown. */
void cli_meter_end(struct cli_meter *m);

#endif
