/* Admission decision (lib/decision.c): one case per row of the SPEC §4
 * table and per boundary, each starting from an exact match (Allow) and
 * changing one thing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "decision.h"
#include "keyring.h"
#include "testutil.h"

#define SBX   "sbx_abcdefghijklmnopqrstuvwxyz"
#define OTHER "sbx_zyxwvutsrqponmlkjihgfedcba"
#define NOW   1795993752

struct fixture {
	struct tt_claims c;
	struct tt_request req;
	struct tt_installed rec;
	const struct tt_installed *recp; /* what decide sees (may be NULL) */
	int64_t now;
};

/* fixture_base: a gen-7 control capability, a matching record, an exec
 * request at the node, issued 10 s ago. */
static void fixture_base(struct fixture *f)
{
	memset(f, 0, sizeof(*f));
	tu_claims_control(&f->c, SBX, NOW, 7, 2, TT_OP_EXEC | TT_OP_FS_READ);
	tu_request_exec(&f->req, SBX);
	f->rec.present = true;
	f->rec.id = f->c.id;
	f->rec.epoch = 3;
	f->recp = &f->rec;
	f->now = NOW;
}

/* as_port: turns the fixture into a port capability at the gateway. */
static void as_port(struct fixture *f)
{
	f->c.aud = TT_AUD_GATEWAY;
	f->c.pur = TT_PUR_PORT;
	f->c.ops = 0;
	f->c.port = 8080;
	f->c.proto = TT_PROTO_HTTP;
	f->req.receiver = TT_RCV_GATEWAY;
	f->req.served_sbx = SBX;
	f->req.op = 0;
	f->req.port = 8080;
	f->req.proto = TT_PROTO_HTTP;
}

/* m_none: no change: the exact match. */
static void m_none(struct fixture *f) { (void)f; }
/* m_exp_plus_15: now at the last second of the expiry skew. */
static void m_exp_plus_15(struct fixture *f) { f->now = f->c.exp + 15; }
/* m_exp_plus_16: now one second past the expiry skew. */
static void m_exp_plus_16(struct fixture *f) { f->now = f->c.exp + 16; }
/* m_iat_plus_15: issued at the far edge of the future skew. */
static void m_iat_plus_15(struct fixture *f)
{
	f->c.iat = f->now + 15;
	f->c.exp = f->c.iat + 120;
}
/* m_iat_plus_16: issued one second beyond the future skew. */
static void m_iat_plus_16(struct fixture *f)
{
	f->c.iat = f->now + 16;
	f->c.exp = f->c.iat + 120;
}
/* m_cap_gen_older: the capability names an older generation. */
static void m_cap_gen_older(struct fixture *f) { f->c.id.gen = 6; }
/* m_installed_next: the receiver installed generation N+1. */
static void m_installed_next(struct fixture *f) { f->rec.id.gen = 8; }
/* m_cap_gen_newer: the capability names a generation not yet installed here. */
static void m_cap_gen_newer(struct fixture *f) { f->c.id.gen = 8; }
/* m_wrk: the record is on another worker. */
static void m_wrk(struct fixture *f) { strcpy(f->rec.id.wrk, "w2"); }
/* m_sst: the record is on another substrate. */
static void m_sst(struct fixture *f) { strcpy(f->rec.id.sst, "microvm"); }
/* m_pod: the record has another pod uid. */
static void m_pod(struct fixture *f) { strcpy(f->rec.id.pod, "pod-9"); }
/* m_att_new: activation differs on a new open. */
static void m_att_new(struct fixture *f) { f->rec.id.att = 3; }
/* m_att_established: activation differs on an established stream. */
static void m_att_established(struct fixture *f)
{
	f->rec.id.att = 3;
	f->req.new_open = false;
}
/* m_cap_wrk: the capability names another worker than installed. */
static void m_cap_wrk(struct fixture *f) { strcpy(f->c.id.wrk, "w9"); }
/* m_cap_sst: the capability names another substrate. */
static void m_cap_sst(struct fixture *f) { strcpy(f->c.id.sst, "microvm"); }
/* m_cap_pod: the capability names a pod uid where none is installed. */
static void m_cap_pod(struct fixture *f) { strcpy(f->c.id.pod, "pod-1"); }
/* m_cap_att_old: the capability names an older activation, new open. */
static void m_cap_att_old(struct fixture *f) { f->c.id.att = 1; }
/* m_now_max: a receiver clock at INT64_MAX: expired, and no overflow. */
static void m_now_max(struct fixture *f) { f->now = INT64_MAX; }
/* m_now_min: a receiver clock at INT64_MIN: not yet valid, no overflow. */
static void m_now_min(struct fixture *f) { f->now = INT64_MIN; }
/* m_exp_far: hand-built claims with extreme times: no overflow either. */
static void m_exp_far(struct fixture *f)
{
	f->c.iat = INT64_MIN;
	f->c.exp = INT64_MAX;
}
/* m_retired: the receiver retired the execution. */
static void m_retired(struct fixture *f) { f->rec.retired = true; }
/* m_retired_and_wrk: retired and moved: retired is reported. */
static void m_retired_and_wrk(struct fixture *f)
{
	f->rec.retired = true;
	strcpy(f->rec.id.wrk, "w2");
}
/* m_not_present: nothing installed for the sandbox. */
static void m_not_present(struct fixture *f) { f->rec.present = false; }
/* m_no_record: no record passed at all. */
static void m_no_record(struct fixture *f) { f->recp = NULL; }
/* m_record_other_sbx: the record belongs to another sandbox. */
static void m_record_other_sbx(struct fixture *f)
{
	strcpy(f->rec.id.sbx, OTHER);
}
/* m_aud_gw_at_node: a gateway capability presented at a node. */
static void m_aud_gw_at_node(struct fixture *f) { f->c.aud = TT_AUD_GATEWAY; }
/* m_aud_node_at_gw: a node capability presented at a gateway. */
static void m_aud_node_at_gw(struct fixture *f)
{
	as_port(f);
	f->c.aud = TT_AUD_NODE;
}
/* m_aud_gw_at_bridge: a gateway capability presented at a bridge. */
static void m_aud_gw_at_bridge(struct fixture *f)
{
	f->c.aud = TT_AUD_GATEWAY;
	f->req.receiver = TT_RCV_BRIDGE;
	f->req.served_sbx = SBX;
}
/* m_bridge_ok: a node capability at the bridge serving its sandbox. */
static void m_bridge_ok(struct fixture *f)
{
	f->req.receiver = TT_RCV_BRIDGE;
	f->req.served_sbx = SBX;
}
/* m_bad_receiver: an unknown receiver kind. */
static void m_bad_receiver(struct fixture *f)
{
	f->req.receiver = (enum tt_receiver)0;
}
/* m_op_missing: an operation the capability does not grant. */
static void m_op_missing(struct fixture *f) { f->req.op = TT_OP_PTY; }
/* m_op_multi: two operations in one request. */
static void m_op_multi(struct fixture *f)
{
	f->req.op = TT_OP_EXEC | TT_OP_FS_READ;
}
/* m_ctl_req_port_cap: a control request with a port capability. */
static void m_ctl_req_port_cap(struct fixture *f)
{
	as_port(f);
	f->c.aud = TT_AUD_GATEWAY;
	f->req.op = TT_OP_EXEC;
}
/* m_port_req_ctl_cap: a port request with a control capability. */
static void m_port_req_ctl_cap(struct fixture *f)
{
	f->req.op = 0;
	f->req.port = 8080;
	f->req.proto = TT_PROTO_HTTP;
}
/* m_port_ok: a matching port request. */
static void m_port_ok(struct fixture *f) { as_port(f); }
/* m_port_tcp_ok: a matching tcp port request. */
static void m_port_tcp_ok(struct fixture *f)
{
	as_port(f);
	f->c.proto = TT_PROTO_TCP;
	f->req.proto = TT_PROTO_TCP;
}
/* m_port_mismatch: another port than granted. */
static void m_port_mismatch(struct fixture *f)
{
	as_port(f);
	f->req.port = 8081;
}
/* m_proto_mismatch: another protocol than granted. */
static void m_proto_mismatch(struct fixture *f)
{
	as_port(f);
	f->req.proto = TT_PROTO_TCP;
}
/* m_port_att_established: activation change on an established gateway stream. */
static void m_port_att_established(struct fixture *f)
{
	as_port(f);
	f->rec.id.att = 3;
	f->req.new_open = false;
}
/* m_other_request: the request names another sandbox. */
static void m_other_request(struct fixture *f) { f->req.sbx = OTHER; }
/* m_other_served: the gateway serves another sandbox. */
static void m_other_served(struct fixture *f)
{
	as_port(f);
	f->req.served_sbx = OTHER;
}
/* m_other_served_no_sbx: no sandbox in the request, gateway serves another. */
static void m_other_served_no_sbx(struct fixture *f)
{
	as_port(f);
	f->req.sbx = NULL;
	f->req.served_sbx = OTHER;
}
/* m_served_only_ok: no sandbox in the request, gateway serves this one. */
static void m_served_only_ok(struct fixture *f)
{
	as_port(f);
	f->req.sbx = NULL;
}
/* m_no_sandbox_named: no sandbox named anywhere. */
static void m_no_sandbox_named(struct fixture *f) { f->req.sbx = NULL; }
/* m_other_with_record: another sandbox the receiver serves, named by the caller. */
static void m_other_with_record(struct fixture *f)
{
	/* The caller names another sandbox that this receiver does serve at
	 * gen 9: the Deny must not reveal that. */
	f->req.sbx = OTHER;
	strcpy(f->rec.id.sbx, OTHER);
	f->rec.id.gen = 9;
}
/* m_expired_and_other: expired and for another sandbox: expiry first. */
static void m_expired_and_other(struct fixture *f)
{
	f->now = f->c.exp + 16;
	f->req.sbx = OTHER;
}
/* m_audience_and_stale: wrong audience and stale: audience first. */
static void m_audience_and_stale(struct fixture *f)
{
	f->c.aud = TT_AUD_GATEWAY;
	f->rec.id.gen = 8;
}
/* m_op_and_other: op not permitted and other sandbox: op first. */
static void m_op_and_other(struct fixture *f)
{
	f->req.op = TT_OP_WATCH;
	f->req.sbx = OTHER;
}
/* m_other_and_stale: other sandbox and stale: sandbox first. */
static void m_other_and_stale(struct fixture *f)
{
	f->req.sbx = OTHER;
	f->rec.id.gen = 8;
}

struct dcase {
	const char *name;
	void (*mut)(struct fixture *f);
	enum tt_verdict verdict;
	enum tt_reason reason;
	uint64_t gen;
};

static const struct dcase cases[] = {
	/* row 7 */
	{ "exact_match", m_none, TT_ALLOW, TT_R_OK, 7 },
	/* row 2 with its boundaries */
	{ "exp_plus_15_accepted", m_exp_plus_15, TT_ALLOW, TT_R_OK, 7 },
	{ "exp_plus_16_expired", m_exp_plus_16, TT_DENY, TT_R_EXPIRED, 0 },
	{ "iat_now_plus_15_accepted", m_iat_plus_15, TT_ALLOW, TT_R_OK, 7 },
	{ "iat_now_plus_16_not_yet", m_iat_plus_16, TT_DENY, TT_R_NOT_YET_VALID, 0 },
	{ "clock_at_int64_max", m_now_max, TT_DENY, TT_R_EXPIRED, 0 },
	{ "clock_at_int64_min", m_now_min, TT_DENY, TT_R_NOT_YET_VALID, 0 },
	{ "extreme_claim_times", m_exp_far, TT_ALLOW, TT_R_OK, 7 },
	/* row 3 */
	{ "gateway_cap_at_node", m_aud_gw_at_node, TT_DENY, TT_R_WRONG_AUDIENCE, 0 },
	{ "node_cap_at_gateway", m_aud_node_at_gw, TT_DENY, TT_R_WRONG_AUDIENCE, 0 },
	{ "gateway_cap_at_bridge", m_aud_gw_at_bridge, TT_DENY, TT_R_WRONG_AUDIENCE, 0 },
	{ "node_cap_at_bridge", m_bridge_ok, TT_ALLOW, TT_R_OK, 7 },
	{ "unknown_receiver", m_bad_receiver, TT_DENY, TT_R_WRONG_AUDIENCE, 0 },
	/* row 4 */
	{ "op_not_in_ops", m_op_missing, TT_DENY, TT_R_OP_NOT_PERMITTED, 0 },
	{ "two_ops_at_once", m_op_multi, TT_DENY, TT_R_OP_NOT_PERMITTED, 0 },
	{ "control_req_port_cap", m_ctl_req_port_cap, TT_DENY, TT_R_OP_NOT_PERMITTED, 0 },
	{ "port_req_control_cap", m_port_req_ctl_cap, TT_DENY, TT_R_PORT_NOT_PERMITTED, 0 },
	{ "port_match", m_port_ok, TT_ALLOW, TT_R_OK, 7 },
	{ "port_match_tcp", m_port_tcp_ok, TT_ALLOW, TT_R_OK, 7 },
	{ "port_mismatch", m_port_mismatch, TT_DENY, TT_R_PORT_NOT_PERMITTED, 0 },
	{ "proto_mismatch", m_proto_mismatch, TT_DENY, TT_R_PORT_NOT_PERMITTED, 0 },
	/* row 5 */
	{ "other_sandbox_in_request", m_other_request, TT_DENY, TT_R_OTHER_SANDBOX, 0 },
	{ "other_sandbox_served", m_other_served, TT_DENY, TT_R_OTHER_SANDBOX, 0 },
	{ "other_served_no_request_sbx", m_other_served_no_sbx, TT_DENY, TT_R_OTHER_SANDBOX, 0 },
	{ "served_only_match", m_served_only_ok, TT_ALLOW, TT_R_OK, 7 },
	{ "no_sandbox_named", m_no_sandbox_named, TT_DENY, TT_R_OTHER_SANDBOX, 0 },
	{ "other_sandbox_no_gen_leak", m_other_with_record, TT_DENY, TT_R_OTHER_SANDBOX, 0 },
	/* row 6, each identity field alone */
	{ "gen_older_than_installed", m_cap_gen_older, TT_REFRESH_ROUTE, TT_R_STALE_EXECUTION, 7 },
	{ "installed_next_refuses_gen", m_installed_next, TT_REFRESH_ROUTE, TT_R_STALE_EXECUTION, 8 },
	{ "gen_newer_than_installed", m_cap_gen_newer, TT_REFRESH_ROUTE, TT_R_STALE_EXECUTION, 7 },
	{ "wrong_worker", m_wrk, TT_REFRESH_ROUTE, TT_R_WRONG_WORKER, 7 },
	{ "wrong_substrate", m_sst, TT_REFRESH_ROUTE, TT_R_WRONG_SUBSTRATE, 7 },
	{ "wrong_pod", m_pod, TT_REFRESH_ROUTE, TT_R_WRONG_POD, 7 },
	{ "activation_new_open", m_att_new, TT_REFRESH_ROUTE, TT_R_STALE_ACTIVATION, 7 },
	{ "activation_established", m_att_established, TT_ALLOW, TT_R_OK, 7 },
	{ "activation_established_port", m_port_att_established, TT_ALLOW, TT_R_OK, 7 },
	{ "cap_names_other_worker", m_cap_wrk, TT_REFRESH_ROUTE, TT_R_WRONG_WORKER, 7 },
	{ "cap_names_other_substrate", m_cap_sst, TT_REFRESH_ROUTE, TT_R_WRONG_SUBSTRATE, 7 },
	{ "cap_names_other_pod", m_cap_pod, TT_REFRESH_ROUTE, TT_R_WRONG_POD, 7 },
	{ "cap_names_old_activation", m_cap_att_old, TT_REFRESH_ROUTE, TT_R_STALE_ACTIVATION, 7 },
	{ "retired", m_retired, TT_REFRESH_ROUTE, TT_R_RETIRED, 7 },
	{ "retired_before_worker", m_retired_and_wrk, TT_REFRESH_ROUTE, TT_R_RETIRED, 7 },
	{ "not_installed", m_not_present, TT_REFRESH_ROUTE, TT_R_NOT_INSTALLED, 0 },
	{ "no_record", m_no_record, TT_REFRESH_ROUTE, TT_R_NOT_INSTALLED, 0 },
	{ "record_of_other_sandbox", m_record_other_sbx, TT_REFRESH_ROUTE, TT_R_NOT_INSTALLED, 0 },
	/* table order */
	{ "expired_before_sandbox", m_expired_and_other, TT_DENY, TT_R_EXPIRED, 0 },
	{ "audience_before_identity", m_audience_and_stale, TT_DENY, TT_R_WRONG_AUDIENCE, 0 },
	{ "op_before_sandbox", m_op_and_other, TT_DENY, TT_R_OP_NOT_PERMITTED, 0 },
	{ "sandbox_before_identity", m_other_and_stale, TT_DENY, TT_R_OTHER_SANDBOX, 0 },
};

/* test_case: one row of the table (the case is the cmocka state, so each
 * case is its own TAP line named after it). */
static void test_case(void **state)
{
	const struct dcase *k = *state;
	struct fixture f;
	struct tt_decision d;

	fixture_base(&f);
	k->mut(&f);
	d = decision_decide(&f.c, &f.req, f.recp, f.now);
	if (d.verdict != k->verdict || d.reason != k->reason ||
	    d.installed_generation != k->gen)
		fail_msg("case %s: got %s/%s/%llu, want %s/%s/%llu", k->name,
		         decision_verdict_name(d.verdict),
		         decision_reason_name(d.reason),
		         (unsigned long long)d.installed_generation,
		         decision_verdict_name(k->verdict),
		         decision_reason_name(k->reason),
		         (unsigned long long)k->gen);
}

/* test_deny_never_has_generation: across every case, a Deny carries 0. */
static void test_deny_never_has_generation(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fixture f;
		struct tt_decision d;

		fixture_base(&f);
		cases[i].mut(&f);
		d = decision_decide(&f.c, &f.req, f.recp, f.now);
		if (d.verdict == TT_DENY)
			assert_int_equal(d.installed_generation, 0);
	}
}

/* test_from_error: check 1 failures map to their Deny reasons. */
static void test_from_error(void **state)
{
	struct tt_err e = { 0 };
	struct tt_decision d;

	(void)state;
	e.code = TT_ERR_SIGNATURE;
	d = decision_from_error(&e);
	assert_int_equal(d.verdict, TT_DENY);
	assert_int_equal(d.reason, TT_R_BAD_SIGNATURE);
	e.code = TT_ERR_UNKNOWN_KEY;
	assert_int_equal(decision_from_error(&e).reason, TT_R_UNKNOWN_KEY);
	e.code = TT_ERR_TOO_LARGE;
	assert_int_equal(decision_from_error(&e).reason, TT_R_MALFORMED);
	e.code = TT_ERR_MALFORMED;
	assert_int_equal(decision_from_error(&e).reason, TT_R_MALFORMED);
	e.code = TT_OK; /* a caller bug is still a Deny */
	assert_int_equal(decision_from_error(&e).verdict, TT_DENY);
	assert_int_equal(decision_from_error(NULL).verdict, TT_DENY);
	assert_int_equal(decision_from_error(&e).installed_generation, 0);
}

/* body: parses a body, checking its keys. */
static json_t *body(const struct tt_decision *d, const char *sbx)
{
	char *s = decision_body_json(d, sbx);
	json_t *o;

	assert_non_null(s);
	o = json_loads(s, JSON_REJECT_DUPLICATES, NULL);
	free(s);
	assert_non_null(o);
	return o;
}

/* test_bodies: RefreshRoute carries the installed generation, Deny never
 * does; HTTP statuses per §4. */
static void test_bodies(void **state)
{
	struct fixture f;
	struct tt_decision d;
	json_t *o;

	(void)state;
	fixture_base(&f);
	f.rec.id.gen = 8;
	d = decision_decide(&f.c, &f.req, f.recp, f.now);
	o = body(&d, SBX);
	assert_string_equal(json_string_value(json_object_get(o, "decision")),
	                    "refresh_route");
	assert_string_equal(json_string_value(json_object_get(o, "reason")),
	                    "stale_execution");
	assert_string_equal(json_string_value(json_object_get(o, "sandbox")), SBX);
	assert_int_equal(json_integer_value(json_object_get(o, "installed_generation")), 8);
	assert_int_equal(json_object_size(o), 4);
	json_decref(o);
	assert_int_equal(decision_http_status(d.verdict), 409);

	fixture_base(&f);
	m_other_with_record(&f);
	d = decision_decide(&f.c, &f.req, f.recp, f.now);
	o = body(&d, OTHER);
	assert_string_equal(json_string_value(json_object_get(o, "decision")),
	                    "deny");
	assert_string_equal(json_string_value(json_object_get(o, "reason")),
	                    "other_sandbox");
	assert_null(json_object_get(o, "installed_generation"));
	json_decref(o);
	assert_int_equal(decision_http_status(d.verdict), 403);

	fixture_base(&f);
	d = decision_decide(&f.c, &f.req, f.recp, f.now);
	assert_int_equal(decision_http_status(d.verdict), 200);
	o = body(&d, NULL);
	assert_string_equal(json_string_value(json_object_get(o, "decision")),
	                    "allow");
	assert_null(json_object_get(o, "sandbox"));
	json_decref(o);
}

/* test_names_distinct: every reason has its own wire name. */
static void test_names_distinct(void **state)
{
	(void)state;
	for (int a = TT_R_OK; a <= TT_R_NOT_INSTALLED; a++)
		for (int b = a + 1; b <= TT_R_NOT_INSTALLED; b++)
			assert_string_not_equal(decision_reason_name((enum tt_reason)a),
			                        decision_reason_name((enum tt_reason)b));
	assert_string_equal(decision_reason_name(TT_R_STALE_ACTIVATION),
	                    "stale_activation");
	assert_string_equal(decision_verdict_name(TT_REFRESH_ROUTE),
	                    "refresh_route");
}

#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* main: one test per table row (named after it), then the fixed tests. */
int main(void)
{
	static const struct CMUnitTest fixed[] = {
		cmocka_unit_test(test_deny_never_has_generation),
		cmocka_unit_test(test_from_error),
		cmocka_unit_test(test_bodies),
		cmocka_unit_test(test_names_distinct),
	};
	struct CMUnitTest tests[NCASES + sizeof(fixed) / sizeof(fixed[0])];
	size_t n = 0;

	for (size_t i = 0; i < NCASES; i++)
		tests[n++] = (struct CMUnitTest){ .name = cases[i].name,
		                                  .test_func = test_case,
		                                  .initial_state = (void *)&cases[i] };
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		tests[n++] = fixed[i];
	return _cmocka_run_group_tests("decision", tests, n, NULL, NULL);
}
