/* libtether lifecycle calls (docs/API.md): pause, resume and migrate,
 * and the cluster's public keys (GET /v1/keys). Each is one POST to the edge (which proxies it to the
 * control plane) answering the sandbox object, made through client.c's
 * request layer: the server's one-line message as the error, bounded
 * answers, and never repeated (they change state). */
#include "client/tether.h"

#include <stdlib.h>

#include "cleanup.h"
#include "client/internal.h"

/* A waited pause or migrate of a big layer; the control plane fails a
 * pause that is not acknowledged in 30 s, so this only catches a hung
 * server. */
#define LC_TIMEOUT_S 120L

/* lc_post: POST /v1/sandboxes/ID/<suffix> with body (borrowed). */
static json_t *lc_post(struct tether *t, const char *id, const char *suffix,
                       json_t *body, struct tt_err *err)
{
	_cleanup_free_ char *p = NULL;
	struct tether_call c = { .method = "POST", .body = body,
	                         .timeout_s = LC_TIMEOUT_S };

	if (body == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if ((p = tether_id_path(t, id, suffix, err)) == NULL)
		return NULL;
	c.path = p;
	return tether_json_call(t, &c, TETHER_JSON_MAX, err);
}

/* tether_pause: POST …/pause (wait: until paused; else 202 "pausing"). */
json_t *tether_pause(struct tether *t, const char *id, int wait,
                       struct tt_err *err)
{
	json_t *body = json_object();
	json_t *j = lc_post(t, id, wait ? "/pause" : "/pause?wait=0", body, err);

	json_decref(body);
	return j;
}

/* tether_resume: POST …/resume {"worker"?,"force"}. */
json_t *tether_resume(struct tether *t, const char *id, const char *worker,
                        int force, struct tt_err *err)
{
	json_t *body = worker ? json_pack("{s:b,s:s}", "force", force ? 1 : 0,
	                                  "worker", worker)
	                      : json_pack("{s:b}", "force", force ? 1 : 0);
	json_t *j = lc_post(t, id, "/resume", body, err);

	json_decref(body);
	return j;
}

/* tether_migrate: POST …/migrate {"worker"}. */
json_t *tether_migrate(struct tether *t, const char *id, const char *worker,
                         struct tt_err *err)
{
	json_t *body = json_pack("{s:s}", "worker", worker ? worker : "");
	json_t *j = lc_post(t, id, "/migrate", body, err);

	json_decref(body);
	return j;
}

/* tether_keys: GET /v1/keys, the cluster's verification bundle. */
json_t *tether_keys(struct tether *t, struct tt_err *err)
{
	struct tether_call c = { .method = "GET", .path = "/v1/keys",
	                         .timeout_s = LC_TIMEOUT_S };

	return tether_json_call(t, &c, TETHER_JSON_MAX, err);
}
