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

#endif
