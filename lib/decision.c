/* Admission decision (see decision.h, SPEC §4): checks 2..7 in table order,
 * as one pure function of (claims, request, installed record, now). */
#include "decision.h"

#include <jansson.h>
#include <string.h>

#include "keyring.h"

/* deny: a Deny never carries an installed generation (it would leak the
 * identity of a sandbox the caller may not be authorized for). */
static struct tt_decision deny(enum tt_reason r)
{
	return (struct tt_decision){ .verdict = TT_DENY, .reason = r,
	                             .installed_generation = 0 };
}

/* refresh: RefreshRoute with the generation this receiver has installed. */
static struct tt_decision refresh(enum tt_reason r, uint64_t gen)
{
	return (struct tt_decision){ .verdict = TT_REFRESH_ROUTE, .reason = r,
	                             .installed_generation = gen };
}

/* beyond: whether a > b + slack, without overflow for any int64 values
 * (now is the caller's clock, the claims may be hand-built). */
static bool beyond(int64_t a, int64_t b, int64_t slack)
{
	return a > b && (uint64_t)a - (uint64_t)b > (uint64_t)slack;
}

/* decision_decide: checks 2..7 of the SPEC §4 table, in order. */
struct tt_decision decision_decide(const struct tt_claims *claims,
                                   const struct tt_request *req,
                                   const struct tt_installed *rec, int64_t now)
{
	const struct tt_identity *cid;

	if (claims == NULL || req == NULL)
		return deny(TT_R_MALFORMED);
	cid = &claims->id;

	/* 2: lifetime, with the allowed skew on both ends: exp + 15 is the
	 * last second accepted, iat may be at most 15 s ahead of our clock. */
	if (beyond(now, claims->exp, TT_CAP_SKEW))
		return deny(TT_R_EXPIRED);
	if (beyond(claims->iat, now, TT_CAP_SKEW))
		return deny(TT_R_NOT_YET_VALID);

	/* 3: audience. The bridge sits behind node admission and accepts node
	 * capabilities; only the gateway takes gateway ones. */
	if ((req->receiver == TT_RCV_GATEWAY && claims->aud != TT_AUD_GATEWAY) ||
	    ((req->receiver == TT_RCV_NODE || req->receiver == TT_RCV_BRIDGE) &&
	     claims->aud != TT_AUD_NODE) ||
	    (req->receiver != TT_RCV_NODE && req->receiver != TT_RCV_GATEWAY &&
	     req->receiver != TT_RCV_BRIDGE))
		return deny(TT_R_WRONG_AUDIENCE);

	/* 4: purpose and permission. A control request names exactly one
	 * operation, which must be among the granted ones. */
	if (req->op != 0) {
		if (claims->pur != TT_PUR_CONTROL ||
		    (req->op & (req->op - 1)) != 0 || (claims->ops & req->op) == 0)
			return deny(TT_R_OP_NOT_PERMITTED);
	} else {
		if (claims->pur != TT_PUR_PORT || req->port == 0 ||
		    claims->port != req->port || req->proto == TT_PROTO_NONE ||
		    claims->proto != req->proto)
			return deny(TT_R_PORT_NOT_PERMITTED);
	}

	/* 5: the sandbox. A request that names no sandbox at all, on a
	 * receiver that serves none in particular, is bound to nothing:
	 * refuse it rather than guess. */
	if (req->sbx == NULL && req->served_sbx == NULL)
		return deny(TT_R_OTHER_SANDBOX);
	if ((req->sbx != NULL && strcmp(cid->sbx, req->sbx) != 0) ||
	    (req->served_sbx != NULL && strcmp(cid->sbx, req->served_sbx) != 0))
		return deny(TT_R_OTHER_SANDBOX);

	/* 6: the installed execution. A record for another sandbox is treated
	 * as none: it says nothing about this one. */
	if (rec == NULL || !rec->present || strcmp(rec->id.sbx, cid->sbx) != 0)
		return refresh(TT_R_NOT_INSTALLED, 0);
	if (rec->id.gen != cid->gen)
		return refresh(TT_R_STALE_EXECUTION, rec->id.gen);
	if (rec->retired)
		return refresh(TT_R_RETIRED, rec->id.gen);
	if (strcmp(rec->id.wrk, cid->wrk) != 0)
		return refresh(TT_R_WRONG_WORKER, rec->id.gen);
	if (strcmp(rec->id.sst, cid->sst) != 0)
		return refresh(TT_R_WRONG_SUBSTRATE, rec->id.gen);
	if (strcmp(rec->id.pod, cid->pod) != 0)
		return refresh(TT_R_WRONG_POD, rec->id.gen);
	/* Established streams survive an activation-only change (SPEC §6);
	 * new opens need the current activation. */
	if (rec->id.att != cid->att && req->new_open)
		return refresh(TT_R_STALE_ACTIVATION, rec->id.gen);

	/* 7: all equal. */
	return (struct tt_decision){ .verdict = TT_ALLOW, .reason = TT_R_OK,
	                             .installed_generation = rec->id.gen };
}

/* decision_from_error: check 1 failures as a Deny. */
struct tt_decision decision_from_error(const struct tt_err *err)
{
	if (err != NULL && err->code == TT_ERR_SIGNATURE)
		return deny(TT_R_BAD_SIGNATURE);
	if (err != NULL && err->code == TT_ERR_UNKNOWN_KEY)
		return deny(TT_R_UNKNOWN_KEY);
	return deny(TT_R_MALFORMED);
}

/* decision_verdict_name: wire name of a verdict. */
const char *decision_verdict_name(enum tt_verdict v)
{
	switch (v) {
	case TT_ALLOW:
		return "allow";
	case TT_REFRESH_ROUTE:
		return "refresh_route";
	case TT_DENY:
		return "deny";
	}
	return "deny";
}

/* decision_reason_name: wire name of a reason. */
const char *decision_reason_name(enum tt_reason r)
{
	switch (r) {
	case TT_R_OK: return "ok";
	case TT_R_MALFORMED: return "malformed";
	case TT_R_BAD_SIGNATURE: return "bad_signature";
	case TT_R_UNKNOWN_KEY: return "unknown_key";
	case TT_R_EXPIRED: return "expired";
	case TT_R_NOT_YET_VALID: return "not_yet_valid";
	case TT_R_WRONG_AUDIENCE: return "wrong_audience";
	case TT_R_OP_NOT_PERMITTED: return "op_not_permitted";
	case TT_R_PORT_NOT_PERMITTED: return "port_not_permitted";
	case TT_R_OTHER_SANDBOX: return "other_sandbox";
	case TT_R_STALE_EXECUTION: return "stale_execution";
	case TT_R_WRONG_WORKER: return "wrong_worker";
	case TT_R_WRONG_SUBSTRATE: return "wrong_substrate";
	case TT_R_WRONG_POD: return "wrong_pod";
	case TT_R_STALE_ACTIVATION: return "stale_activation";
	case TT_R_RETIRED: return "retired";
	case TT_R_NOT_INSTALLED: return "not_installed";
	}
	return "malformed";
}

/* decision_http_status: 200 Allow, 409 RefreshRoute, 403 Deny. */
int decision_http_status(enum tt_verdict v)
{
	switch (v) {
	case TT_ALLOW:
		return 200;
	case TT_REFRESH_ROUTE:
		return 409;
	case TT_DENY:
		return 403;
	}
	return 403;
}

/* decision_body_json: the §4 response body; sandbox (may be NULL, then
 * omitted) is the one the request named. Caller frees; NULL on ENOMEM or
 * a sandbox string that is not UTF-8. */
char *decision_body_json(const struct tt_decision *d, const char *sandbox)
{
	json_t *o;
	char *s;
	int bad = 0;

	if (d == NULL)
		return NULL;
	o = json_object();
	if (o == NULL)
		return NULL;
	bad |= json_object_set_new(o, "decision",
	                           json_string(decision_verdict_name(d->verdict)));
	bad |= json_object_set_new(o, "reason",
	                           json_string(decision_reason_name(d->reason)));
	if (sandbox != NULL)
		bad |= json_object_set_new(o, "sandbox", json_string(sandbox));
	if (d->verdict != TT_DENY)
		bad |= json_object_set_new(
			o, "installed_generation",
			json_integer((json_int_t)d->installed_generation));
	s = bad ? NULL : json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}
