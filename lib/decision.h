/* Admission (SPEC §4): the installed identity record a receiver keeps, and
 * the decision as one pure function of (claims, request, record, now).
 * Implementation: lib/decision.c. Signature checking is not in here: see
 * capcache.h, which verifies (or finds a cached verification) and then
 * calls decision_decide. */
#ifndef TT_DECISION_H
#define TT_DECISION_H

#include <stdbool.h>
#include <stdint.h>

#include "claims.h"
#include "err.h"

enum tt_receiver { TT_RCV_NODE = 1, TT_RCV_GATEWAY, TT_RCV_BRIDGE };
enum tt_verdict { TT_ALLOW = 0, TT_REFRESH_ROUTE, TT_DENY };

enum tt_reason {
	TT_R_OK = 0,
	/* Deny */
	TT_R_MALFORMED, TT_R_BAD_SIGNATURE, TT_R_UNKNOWN_KEY,
	TT_R_EXPIRED, TT_R_NOT_YET_VALID, TT_R_WRONG_AUDIENCE,
	TT_R_OP_NOT_PERMITTED, TT_R_PORT_NOT_PERMITTED, TT_R_OTHER_SANDBOX,
	/* RefreshRoute */
	TT_R_STALE_EXECUTION,  /* generation differs */
	TT_R_WRONG_WORKER, TT_R_WRONG_SUBSTRATE, TT_R_WRONG_POD,
	TT_R_STALE_ACTIVATION, /* activation differs on a new open */
	TT_R_RETIRED,          /* this receiver retired that execution */
	TT_R_NOT_INSTALLED,    /* this receiver never installed it */
};

/* The receiver's durable record of the execution it serves for one sandbox
 * (persisted before it is acknowledged; SPEC §10). */
struct tt_installed {
	bool present;          /* false: nothing installed for this sandbox */
	struct tt_identity id;
	bool retired;
	uint64_t epoch;        /* identity epoch (SPEC §6) */
};

struct tt_request {
	enum tt_receiver receiver;
	const char *sbx;        /* sandbox the request names */
	const char *served_sbx; /* gateway/bridge: the one sandbox served; else NULL */
	uint32_t op;            /* one enum tt_op bit (control) */
	uint16_t port;          /* port purpose */
	enum tt_proto proto;
	bool new_open;          /* new request or stream (activation must match) */
};

struct tt_decision {
	enum tt_verdict verdict;
	enum tt_reason reason;
	uint64_t installed_generation; /* 0 when none, or when denying */
};

/* decision_decide: checks 2..7 of the SPEC §4 table, in order. Pure: no
 * I/O, no clock, no globals. */
struct tt_decision decision_decide(const struct tt_claims *claims,
                                   const struct tt_request *req,
                                   const struct tt_installed *rec, int64_t now);
/* decision_from_error: check 1 (token, kid, signature) as a Deny. */
struct tt_decision decision_from_error(const struct tt_err *err);

const char *decision_verdict_name(enum tt_verdict v); /* "allow", "refresh_route", "deny" */
const char *decision_reason_name(enum tt_reason r);   /* "stale_execution", ... */
/* decision_http_status: 200, 409 or 403. */
int decision_http_status(enum tt_verdict v);
/* decision_body_json: the §4 body {"decision","reason","sandbox",
 * "installed_generation"} (generation omitted on Deny); caller frees. */
char *decision_body_json(const struct tt_decision *d, const char *sandbox);

#endif
