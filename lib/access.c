/* Access records (access.h): the edge's and node-api's access log lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "access.h"
#include "log.h"

/* put_str: obj[key] = s unless s is NULL or empty. */
static void put_str(json_t *obj, const char *key, const char *s)
{
	if (s != NULL && s[0] != '\0')
		json_object_set_new(obj, key, json_string(s));
}

/* access_log: see access.h. */
void access_log(const struct tt_access *a)
{
	json_t *o = json_object();
	char *line;

	if (o == NULL)
		return;
	put_str(o, "rid", a->rid);
	put_str(o, "method", a->method);
	put_str(o, "route", a->route);
	put_str(o, "path", a->path);
	put_str(o, "sandbox", a->sbx);
	json_object_set_new(o, "status", json_integer(a->status));
	put_str(o, "result", a->result);
	put_str(o, "decision", a->decision);
	put_str(o, "reason", a->reason);
	if (a->rebuilt)
		json_object_set_new(o, "rebuilt", json_true());
	if (a->generation > 0)
		json_object_set_new(o, "generation", json_integer((json_int_t)a->generation));
	json_object_set_new(o, "duration_ms", json_real((double)a->dur_us / 1000.0));
	json_object_set_new(o, "bytes_in", json_integer((json_int_t)a->bytes_in));
	json_object_set_new(o, "bytes_out", json_integer((json_int_t)a->bytes_out));
	/* ENSURE_ASCII: a path is the caller's text; escaped, it cannot
	 * break the line or drive a terminal */
	line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(6));
	json_decref(o);
	if (line != NULL)
		tt_log_access(line, strlen(line));
	free(line);
}

/* access_refusal_note: see access.h. */
void access_refusal_note(const char *body, size_t len, char *dec, size_t dcap,
                       char *reason, size_t rcap)
{
	json_t *j = body ? json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL) : NULL;
	const char *d = json_string_value(json_object_get(j, "decision"));
	const char *r = json_string_value(json_object_get(j, "reason"));

	snprintf(dec, dcap, "%s", d ? d : "");
	snprintf(reason, rcap, "%s", d && r ? r : "");
	json_decref(j);
}
