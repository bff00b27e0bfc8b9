/* churn: the churn proof suite (issue 12). A real client of the edge's
 * public API measures whether sandbox transitions are invisible to clients.
 *
 * C client threads loop mixed operations on K sandboxes — exec (which also
 * reads one of the client's files with cat), file read, streamed file
 * write, append (an exec that appends one token to a log file) and, for a
 * fraction, the real CLI (`tether exec`) — while a migrate loop moves the
 * sandboxes between workers continuously. Each client owns its files, so
 * it keeps an exact model of what it was acknowledged: the version each of
 * its files holds since its last acknowledged write (plus the writes whose
 * outcome is unknown), and the status of every append since the log was
 * last rotated. Every answer is checked against that model and against the
 * highest generation known current for its sandbox when it was sent.
 *
 * Counted: operations by kind, failures by class, and the safety
 * violations — wrong-incarnation answers, lost acknowledged writes, stale
 * reads, duplicated executions, phantom operations (refused, yet they ran)
 * and corrupt answers (content no model state allows). Any violation makes
 * the exit status 1; --max-error-rate R makes an error rate above R exit 2;
 * a harness or setup failure exits 3, a usage error 64.
 *
 * Memory stays bounded: latencies go into fixed log-scale histograms,
 * failure classes into a fixed table, and append logs are rotated (read,
 * checked, deleted) every APPEND_MAX appends. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

extern char **environ;

#define MAX_WORKERS 16
#define MAX_CLIENTS 256
#define MAX_MIGRATORS 16
#define MAX_SANDBOXES 256
#define APPEND_MAX 256          /* appends per log before it is rotated */
#define PEND_MAX 32             /* unknown-outcome writes tracked per file */
#define ANSWER_MAX (8u << 20)   /* largest answer body kept */
#define CLASS_MAX 96            /* failure classes kept (the last: "other") */
#define CLASS_KEY 112
#define HIST_SUB 64             /* sub-buckets per octave: ~1.6 % resolution */
#define HIST_BUCKETS (HIST_SUB + 28 * HIST_SUB)
#define VIOL_LOG_MAX 40         /* violations described on stderr */
#define FINAL_TRIES 10          /* attempts of each final verification read */

enum kind { K_EXEC, K_READ, K_WRITE, K_APPEND, K_CLI, K_DELETE, K_VERIFY, K_N };
static const char *const kind_names[K_N] = {
	"exec", "read", "write", "append", "cli", "delete", "verify",
};

enum viol { V_WRONG_INC, V_LOST, V_STALE, V_DUP, V_PHANTOM, V_CORRUPT, V_N };
static const char *const viol_names[V_N] = {
	"wrong_incarnation", "lost_writes", "stale_reads", "duplicated_execs",
	"phantom_ops", "corrupt_answers",
};
static const char *const viol_text[V_N] = {
	"wrong-incarnation answers", "lost acknowledged writes", "stale reads",
	"duplicated executions", "phantom operations (refused, yet ran)",
	"corrupt answers",
};

/* What a failed call means for the model: refused = it did not run. */
enum outcome { OUT_OK, OUT_REFUSED, OUT_UNKNOWN };
/* Append status per token. */
enum { A_ACK = 1, A_UNKNOWN, A_REFUSED };

struct opts {
	char url[1024];
	char key[512];
	char cli[PATH_MAX];
	char *ids[MAX_SANDBOXES];
	size_t nids;
	int create_n;
	char workers[MAX_WORKERS][64];
	int nworkers;
	int clients;
	double seconds;
	uint64_t max_ops;
	int migrate_pause_ms;
	int migrators;
	double cli_fraction;
	const char *json_path;
	double max_error_rate; /* percent; < 0: not set */
	int timeout_s;
	int verify_s;
	unsigned mix[4]; /* weights of exec, read, write, append */
	int files;
	size_t max_file;
	uint64_t seed;
	int keep;
	int progress_s;
	int expect100;
	int upload_fresh;  /* each PUT on a connection of its own, closed after */
	int verbose;
};

/* A log-scale latency histogram (microseconds). */
struct hist {
	uint64_t n;
	uint64_t max_us;
	uint64_t b[HIST_BUCKETS];
};

struct fclass {
	char key[CLASS_KEY];
	uint64_t n;
	uint64_t by_kind[K_N];
};

struct classes {
	pthread_mutex_t mu;
	size_t n;
	struct fclass c[CLASS_MAX];
};

struct sbx {
	char id[64];
	pthread_mutex_t mu;
	char worker[64];               /* as last reported (mu) */
	_Atomic uint64_t known_gen;    /* highest generation known current */
	_Atomic int mig_active;        /* migrations (or recoveries) in flight */
	_Atomic uint64_t mig_started;
	int created;                   /* by this run: deleted at the end */
	_Atomic int recovered;         /* resumed by the harness after a failure */
};

/* One easy handle per thread: libcurl keeps its connections alive. */
struct http {
	CURL *easy;
	struct curl_slist *hdr_json, *hdr_plain;
	char *body;
	size_t len;
	int too_large;
	int64_t gen_hdr;
	long status;
	CURLcode rc;
	char errbuf[CURL_ERROR_SIZE];
	const char *up;
	size_t up_len, up_off;
	uint64_t deadline_us; /* if set, no call runs past it (at least 1 s) */
	unsigned attempts;    /* requests curl was about to send (http_prereq) */
};

struct fmodel {
	uint64_t acked;      /* version at the last acknowledged write; 0 = absent */
	uint64_t next_ver;
	uint64_t pend[PEND_MAX]; /* later writes whose outcome is unknown */
	unsigned npend;
	uint64_t pend_floor; /* versions in (acked, floor] dropped from pend: allowed */
	int suspect;         /* one read disagreed; the next decides stale or lost */
	int broken;          /* a violation was counted: unchecked until a write */
	char why[200];
};

struct amodel {
	unsigned epoch;
	unsigned n;
	uint8_t st[APPEND_MAX];
	int suspect;
	int rotate;
	char why[200];
};

struct stats {
	uint64_t ops[K_N], failed[K_N];
	uint64_t overlap_ops, overlap_failed;
	struct hist all, overlap, overlap_ok;
};

struct client {
	int id;
	pthread_t th;
	struct http h;
	uint64_t rng;
	struct fmodel *f; /* NSB * files */
	struct amodel *a; /* NSB */
	struct stats st;
	char *buf, *buf2;
	size_t bufcap;
	char *cli_out;
	size_t cli_cap;
	uint64_t unverified;
};

struct migrator {
	int id;
	pthread_t th;
	struct http h;
	size_t next;
	uint64_t ok, failed, recoveries, recover_failed;
	struct hist dur;
};

/* The edge's health, polled on its own connection while the run lasts. */
struct watch {
	pthread_t th;
	struct http h;
	uint64_t checks, failed, longest_us, down_since;
};

struct opctx {
	int kind;
	struct sbx *s;
	uint64_t t0, gen0, started0;
	int active0;
};

static struct opts O = {
	.clients = 5,
	.seconds = 60,
	.migrators = 1,
	.cli_fraction = 0.02,
	.max_error_rate = -1,
	.timeout_s = 60,
	.verify_s = 60,
	.mix = { 1, 1, 1, 1 },
	.files = 2,
	.max_file = 65536,
	.progress_s = 10,
};
static struct sbx SB[MAX_SANDBOXES];
static size_t NSB;
static uint32_t RUN_ID;
static char **cli_envp;
static struct classes op_classes = { .mu = PTHREAD_MUTEX_INITIALIZER };
static struct classes mig_classes = { .mu = PTHREAD_MUTEX_INITIALIZER };
static _Atomic int stop_ops, stop_migrate, verify_go, clients_looping, stop_watch;
static _Atomic int edge_down; /* the last health check failed */
static _Atomic uint64_t ops_ticket, ops_done, ops_failed, dropped_conns;
static _Atomic uint64_t mig_ok_total, mig_fail_total;
static _Atomic uint64_t viol_count[V_N];
static _Atomic unsigned viol_logged;
static _Atomic uint64_t viol_recovered; /* on sandboxes resumed after a failure */
static _Thread_local struct sbx *cur_sbx; /* the sandbox of the thread's op */
static volatile sig_atomic_t got_signal;
static uint64_t verify_deadline; /* written before verify_go is set */
static uint64_t run_t0;          /* written before the threads start */

/* ---- small helpers --------------------------------------------------------- */

/* now_us: monotonic time in microseconds. */
static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* sleep_ms: sleeps about ms milliseconds. */
static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* mix64: the splitmix64 finalizer. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* rng_next: one xorshift64* step. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dULL;
}

/* rng_unit: uniform in [0, 1). */
static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* fmt: snprintf into a fixed buffer where cutting the text short is
 * acceptable (messages, class keys); ids and paths are bounded where they
 * come from. */
__attribute__((format(printf, 3, 4)))
static void fmt(char *out, size_t cap, const char *f, ...)
{
	va_list ap;

	va_start(ap, f);
	vsnprintf(out, cap, f, ap);
	va_end(ap);
}

/* viol_report: counts one safety violation and describes the first ones. */
__attribute__((format(printf, 2, 3)))
static void viol_report(enum viol v, const char *f, ...)
{
	char msg[600];
	va_list ap;

	atomic_fetch_add(&viol_count[v], 1);
	if (cur_sbx != NULL && atomic_load(&cur_sbx->recovered))
		atomic_fetch_add(&viol_recovered, 1);
	if (atomic_fetch_add(&viol_logged, 1) >= VIOL_LOG_MAX)
		return;
	va_start(ap, f);
	vsnprintf(msg, sizeof(msg), f, ap);
	va_end(ap);
	fprintf(stderr, "churn: VIOLATION %s: %s\n", viol_names[v], msg);
}

/* ---- histograms ------------------------------------------------------------ */

/* hist_index: the bucket of a value in microseconds. */
static size_t hist_index(uint64_t us)
{
	unsigned e;
	size_t i;

	if (us < HIST_SUB)
		return (size_t)us;
	e = 63u - (unsigned)__builtin_clzll(us); /* >= 6 */
	i = HIST_SUB + (size_t)(e - 6) * HIST_SUB + (size_t)((us >> (e - 6)) & (HIST_SUB - 1));
	return i < HIST_BUCKETS ? i : HIST_BUCKETS - 1;
}

/* hist_value: the lower bound of a bucket, in microseconds. */
static uint64_t hist_value(size_t i)
{
	size_t e;

	if (i < HIST_SUB)
		return i;
	e = (i - HIST_SUB) / HIST_SUB + 6;
	return (uint64_t)(HIST_SUB + (i - HIST_SUB) % HIST_SUB) << (e - 6);
}

/* hist_add: records one value. */
static void hist_add(struct hist *h, uint64_t us)
{
	h->b[hist_index(us)]++;
	h->n++;
	if (us > h->max_us)
		h->max_us = us;
}

/* hist_merge: adds src into dst. */
static void hist_merge(struct hist *dst, const struct hist *src)
{
	for (size_t i = 0; i < HIST_BUCKETS; i++)
		dst->b[i] += src->b[i];
	dst->n += src->n;
	if (src->max_us > dst->max_us)
		dst->max_us = src->max_us;
}

/* hist_pct_ms: the p-quantile (nearest rank) in milliseconds; 0 if empty. */
static double hist_pct_ms(const struct hist *h, double p)
{
	uint64_t rank, seen = 0;

	if (h->n == 0)
		return 0;
	rank = (uint64_t)ceil(p * (double)h->n);
	if (rank < 1)
		rank = 1;
	for (size_t i = 0; i < HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= rank) {
			uint64_t v = hist_value(i);
			return (double)(v > h->max_us ? h->max_us : v) / 1000.0;
		}
	}
	return (double)h->max_us / 1000.0;
}

/* ---- failure classes --------------------------------------------------------- */

/* classes_add: counts one failure of a kind under its class key. */
static void classes_add(struct classes *t, const char *key, int kind)
{
	size_t i;

	pthread_mutex_lock(&t->mu);
	for (i = 0; i < t->n; i++)
		if (strcmp(t->c[i].key, key) == 0)
			break;
	if (i == t->n) {
		if (t->n < CLASS_MAX - 1) {
			fmt(t->c[i].key, CLASS_KEY, "%s", key);
			t->n++;
		} else {
			i = CLASS_MAX - 1;
			fmt(t->c[i].key, CLASS_KEY, "(other classes)");
			if (t->n < CLASS_MAX)
				t->n = CLASS_MAX;
		}
	}
	t->c[i].n++;
	t->c[i].by_kind[kind]++;
	pthread_mutex_unlock(&t->mu);
}

/* class_cmp: most frequent class first. */
static int class_cmp(const void *a, const void *b)
{
	const struct fclass *x = a, *y = b;

	return x->n < y->n ? 1 : x->n > y->n ? -1 : strcmp(x->key, y->key);
}

/* words_keep: whether a message word is kept in a class key (sandbox ids,
 * URLs, paths and numbers vary and are left out). */
static int words_keep(const char *w, size_t len)
{
	if (len == 0)
		return 0;
	if (memmem(w, len, "sbx_", 4) || memmem(w, len, "://", 3) || w[0] == '/')
		return 0;
	for (size_t i = 0; i < len; i++)
		if (w[i] >= '0' && w[i] <= '9')
			return 0;
	return 1;
}

/* words_first: the first few stable words of a message, up to the first
 * ';' or '(' (the detail that follows varies). */
static void words_first(char *out, size_t cap, const char *msg)
{
	size_t o = 0;
	int words = 0;
	const char *p = msg;

	out[0] = '\0';
	while (*p && *p != ';' && *p != '(' && words < 8) {
		while (*p == ' ')
			p++;
		const char *w = p;
		while (*p && *p != ' ' && *p != ';' && *p != '(')
			p++;
		size_t len = (size_t)(p - w);
		while (len > 0 && w[len - 1] == ':')
			len--;
		if (!words_keep(w, len))
			continue;
		if (o + len + 2 >= cap)
			break;
		if (o > 0)
			out[o++] = ' ';
		memcpy(out + o, w, len);
		o += len;
		out[o] = '\0';
		words++;
	}
}

/* conn_dropped: whether a curl result means the connection to the edge
 * broke under the call. */
static int conn_dropped(CURLcode rc)
{
	return rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR ||
	       rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE;
}

/* ---- HTTP ------------------------------------------------------------------- */

/* http_write_cb: collects the answer body, bounded by ANSWER_MAX. */
static size_t http_write_cb(char *data, size_t size, size_t nmemb, void *arg)
{
	struct http *h = arg;
	size_t n = size * nmemb;

	if (h->len + n > ANSWER_MAX) {
		h->too_large = 1;
		return 0;
	}
	memcpy(h->body + h->len, data, n);
	h->len += n;
	return n;
}

/* http_header_cb: notes X-Tether-Generation. */
static size_t http_header_cb(char *data, size_t size, size_t nmemb, void *arg)
{
	struct http *h = arg;
	size_t n = size * nmemb;
	static const char name[] = "x-tether-generation:";

	if (n > sizeof(name) - 1 && strncasecmp(data, name, sizeof(name) - 1) == 0) {
		char v[32];
		size_t vl = n - (sizeof(name) - 1);
		char *end;

		if (vl >= sizeof(v))
			vl = sizeof(v) - 1;
		memcpy(v, data + sizeof(name) - 1, vl);
		v[vl] = '\0';
		errno = 0;
		unsigned long long g = strtoull(v, &end, 10);
		while (*end == ' ' || *end == '\r' || *end == '\n' || *end == '\t')
			end++;
		h->gen_hdr = (errno == 0 && *end == '\0' && g <= INT64_MAX) ? (int64_t)g : -2;
	}
	return n;
}

/* http_read_cb: streams the upload body. */
static size_t http_read_cb(char *buf, size_t size, size_t nmemb, void *arg)
{
	struct http *h = arg;
	size_t n = size * nmemb, left = h->up_len - h->up_off;

	if (n > left)
		n = left;
	memcpy(buf, h->up + h->up_off, n);
	h->up_off += n;
	return n;
}

/* http_socket_cb: sockets are close-on-exec, so CLI children hold none. */
static curl_socket_t http_socket_cb(void *arg, curlsocktype purpose,
                                    struct curl_sockaddr *a)
{
	(void)arg;
	(void)purpose;
	return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* http_init: one easy handle with its header lists. */
static int http_init(struct http *h)
{
	char auth[600];

	memset(h, 0, sizeof(*h));
	h->easy = curl_easy_init();
	h->body = malloc(ANSWER_MAX + 1);
	if (h->easy == NULL || h->body == NULL)
		return -1;
	fmt(auth, sizeof(auth), "Authorization: Bearer %s", O.key);
	h->hdr_plain = curl_slist_append(NULL, auth);
	if (!O.expect100) /* as libtether: no 1 s "Expect: 100-continue" stall */
		h->hdr_plain = curl_slist_append(h->hdr_plain, "Expect:");
	h->hdr_json = curl_slist_append(NULL, auth);
	h->hdr_json = curl_slist_append(h->hdr_json, "Content-Type: application/json");
	h->hdr_json = curl_slist_append(h->hdr_json, "Expect:");
	return h->hdr_plain && h->hdr_json ? 0 : -1;
}

/* http_free: releases the handle (and its connections). */
static void http_free(struct http *h)
{
	if (h->easy)
		curl_easy_cleanup(h->easy);
	curl_slist_free_all(h->hdr_plain);
	curl_slist_free_all(h->hdr_json);
	free(h->body);
	memset(h, 0, sizeof(*h));
}

/* http_do: one call to the edge: a JSON body (json), a streamed body with a
 * Content-Length (up), or none. Fills status, rc, body and gen_hdr. */
/* http_prereq: CURLOPT_PREREQFUNCTION, right before each attempt's
 * request is sent. libcurl silently resends a request whose reused
 * keep-alive connection died before an answer (the edge killed while it
 * ran the first copy); only the first may go, and a call that went out
 * once may have run, whatever the retry's error says (curl 7 after the
 * first copy reached the edge is no proof it did not run). */
static int http_prereq(void *arg, char *primary_ip, char *local_ip, int primary_port,
                       int local_port)
{
	struct http *h = arg;

	(void)primary_ip;
	(void)local_ip;
	(void)primary_port;
	(void)local_port;
	return h->attempts++ == 0 ? CURL_PREREQFUNC_OK : CURL_PREREQFUNC_ABORT;
}

static void http_do(struct http *h, const char *method, const char *path,
                    const char *json, const char *up, size_t up_len)
{
	char url[2048];
	CURL *e = h->easy;

	fmt(url, sizeof(url), "%s%s", O.url, path);
	curl_easy_reset(e); /* keeps the connection cache */
	h->len = 0;
	h->too_large = 0;
	h->gen_hdr = -1;
	h->status = 0;
	h->errbuf[0] = '\0';
	h->attempts = 0;
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, http_prereq);
	curl_easy_setopt(e, CURLOPT_PREREQDATA, h);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	long tmo = (long)O.timeout_s * 1000L;
	if (h->deadline_us) {
		uint64_t now = now_us();
		long left = now < h->deadline_us ? (long)((h->deadline_us - now) / 1000u) : 0;
		tmo = left < 1000 ? 1000 : left < tmo ? left : tmo;
	}
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, tmo);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	curl_easy_setopt(e, CURLOPT_NOPROXY, "localhost,127.0.0.1,::1");
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, h->errbuf);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, http_write_cb);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, http_header_cb);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, h);
	curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, http_socket_cb);
	if (json != NULL) {
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, h->hdr_json);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, json);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(json));
		if (strcmp(method, "POST") != 0)
			curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	} else if (up != NULL) {
		h->up = up;
		h->up_len = up_len;
		h->up_off = 0;
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, h->hdr_plain);
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up_len);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, http_read_cb);
		curl_easy_setopt(e, CURLOPT_READDATA, h);
		if (O.upload_fresh) {
			curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
			curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
		}
	} else {
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, h->hdr_plain);
		if (strcmp(method, "GET") != 0)
			curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	}
	h->rc = curl_easy_perform(e);
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &h->status);
	h->body[h->len] = '\0';
}

/* http_class: the failure class of a call: the HTTP status with the error
 * code (or the §4 decision and reason) and the message's first words, or
 * the curl error. Counts dropped connections. */
static void http_class(const struct http *h, char *out, size_t cap)
{
	json_t *j;

	if (h->rc != CURLE_OK) {
		if (conn_dropped(h->rc))
			atomic_fetch_add(&dropped_conns, 1);
		if (h->too_large)
			fmt(out, cap, "answer larger than %u bytes", ANSWER_MAX);
		else if (h->status != 0 && h->rc == CURLE_PARTIAL_FILE)
			fmt(out, cap, "curl %d after %ld: %s", (int)h->rc, h->status,
			         curl_easy_strerror(h->rc));
		else
			fmt(out, cap, "curl %d: %s", (int)h->rc, curl_easy_strerror(h->rc));
		return;
	}
	j = json_loadb(h->body, h->len, 0, NULL);
	if (json_is_object(j) && json_is_string(json_object_get(j, "decision"))) {
		const char *reason = json_string_value(json_object_get(j, "reason"));
		fmt(out, cap, "%ld %s %s", h->status,
		         json_string_value(json_object_get(j, "decision")),
		         reason ? reason : "-");
	} else if (json_is_object(j) && json_is_string(json_object_get(j, "error"))) {
		char words[96];
		const char *msg = json_string_value(json_object_get(j, "message"));
		words_first(words, sizeof(words), msg ? msg : "");
		fmt(out, cap, "%ld %s: %s", h->status,
		         json_string_value(json_object_get(j, "error")), words);
	} else {
		fmt(out, cap, "%ld (no JSON error body)", h->status);
	}
	json_decref(j);
}

/* http_outcome: whether a call ran: 2xx yes; 4xx (admission refusals,
 * conflicts) and 503 ("did not start") no; a connection that could not be
 * made, before any request went out, no; anything else (502 "may or may not have run", 500, timeouts,
 * broken connections) unknown. */
static enum outcome http_outcome(const struct http *h)
{
	if ((h->rc == CURLE_COULDNT_CONNECT || h->rc == CURLE_COULDNT_RESOLVE_HOST) &&
	    h->attempts == 0)
		return OUT_REFUSED;
	if (h->rc != CURLE_OK)
		return OUT_UNKNOWN;
	if (h->status >= 200 && h->status < 300)
		return OUT_OK;
	if ((h->status >= 400 && h->status < 500) || h->status == 503)
		return OUT_REFUSED;
	return OUT_UNKNOWN;
}

/* http_json: the answer body as JSON (NULL if it is not). */
static json_t *http_json(const struct http *h)
{
	return json_loadb(h->body, h->len, 0, NULL);
}

/* ---- sandboxes ----------------------------------------------------------------- */

/* sbx_note_gen: raises the highest generation known current. */
static void sbx_note_gen(struct sbx *s, uint64_t g)
{
	uint64_t cur = atomic_load(&s->known_gen);

	while (g > cur && !atomic_compare_exchange_weak(&s->known_gen, &cur, g))
		;
}

/* sbx_note: takes generation and worker from a sandbox object whose state
 * is running. Returns its state (static string or "?"). */
static const char *sbx_note(struct sbx *s, json_t *j)
{
	const char *state = json_string_value(json_object_get(j, "state"));
	const char *w = json_string_value(json_object_get(j, "worker"));
	json_int_t g = json_integer_value(json_object_get(j, "generation"));

	if (state && strcmp(state, "running") == 0) {
		if (g > 0)
			sbx_note_gen(s, (uint64_t)g);
		if (w) {
			pthread_mutex_lock(&s->mu);
			fmt(s->worker, sizeof(s->worker), "%s", w);
			pthread_mutex_unlock(&s->mu);
		}
	}
	if (state == NULL)
		return "?";
	static const char *const known[] = { "running", "paused", "failed", "pausing",
		                              "resuming", "starting", "deleting" };
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strcmp(state, known[i]) == 0)
			return known[i];
	return "?";
}

/* sbx_target: the worker a sandbox moves to next (the one after its
 * current worker in --workers). */
static void sbx_target(struct sbx *s, char *out, size_t cap)
{
	int i;

	pthread_mutex_lock(&s->mu);
	for (i = 0; i < O.nworkers; i++)
		if (strcmp(O.workers[i], s->worker) == 0)
			break;
	pthread_mutex_unlock(&s->mu);
	fmt(out, cap, "%s", O.workers[i < O.nworkers ? (i + 1) % O.nworkers : 0]);
}

/* sbx_settle: brings a sandbox back to running after a failed migration
 * (resumes a paused or failed one, waits out a transition), until the
 * deadline. 0 once it runs. */
static int sbx_settle(struct http *h, struct sbx *s, uint64_t deadline)
{
	char path[128], body[128], target[64];
	int rc = -1;

	fmt(path, sizeof(path), "/v1/sandboxes/%s", s->id);
	h->deadline_us = deadline;
	while (now_us() < deadline) {
		json_t *j;
		const char *state;

		http_do(h, "GET", path, NULL, NULL, 0);
		j = h->rc == CURLE_OK && h->status == 200 ? http_json(h) : NULL;
		state = j ? sbx_note(s, j) : "?";
		json_decref(j);
		if (strcmp(state, "running") == 0) {
			rc = 0;
			break;
		}
		if (strcmp(state, "paused") == 0 || strcmp(state, "failed") == 0) {
			char rpath[160];
			sbx_target(s, target, sizeof(target));
			fmt(rpath, sizeof(rpath), "/v1/sandboxes/%s/resume", s->id);
			fmt(body, sizeof(body), "{\"worker\":\"%s\"}", target);
			http_do(h, "POST", rpath, body, NULL, 0);
			if (h->rc == CURLE_OK && h->status == 200) {
				j = http_json(h);
				if (j)
					sbx_note(s, j);
				atomic_store(&s->recovered, 1);
				fprintf(stderr, "churn: %s was %s: resumed on %s as generation %"
				        JSON_INTEGER_FORMAT " from the snapshot of generation %"
				        JSON_INTEGER_FORMAT "\n", s->id, state, target,
				        json_integer_value(json_object_get(j, "generation")),
				        json_integer_value(json_object_get(j, "resumed_from")));
				json_decref(j);
				rc = 0;
				break;
			}
		}
		sleep_ms(200);
	}
	h->deadline_us = 0;
	return rc;
}

/* ---- the model: file contents ------------------------------------------------ */

/* content_make: the deterministic content of version ver of a client's
 * file: a header naming it, then printable filler; its size varies with
 * the version (mostly small, some up to --max-file). */
static size_t content_make(char *buf, size_t cap, int cl, size_t si, int f, uint64_t ver)
{
	uint64_t st = mix64(((uint64_t)RUN_ID << 32) ^ ((uint64_t)cl << 48) ^
	                    ((uint64_t)si << 40) ^ ((uint64_t)f << 36) ^ ver) | 1;
	unsigned pick = (unsigned)(rng_next(&st) % 100);
	size_t size, hl, maxf = O.max_file;

	if (pick < 60 || maxf <= 1024)
		size = 128 + (size_t)(rng_next(&st) % 897);
	else if (pick < 90 || maxf <= 8192)
		size = 1024 + (size_t)(rng_next(&st) % ((maxf < 8192 ? maxf : 8192) - 1023));
	else
		size = 8192 + (size_t)(rng_next(&st) % (maxf - 8191));
	if (size + 1 > cap)
		size = cap - 1;
	hl = (size_t)snprintf(buf, cap, "churn r=%08x c=%d s=%zu f=%d v=%" PRIu64 " n=%zu\n",
	                      RUN_ID, cl, si, f, ver, size);
	for (size_t i = hl; i < size; i++)
		buf[i] = (i % 64 == 63) ? '\n' : (char)('a' + rng_next(&st) % 26);
	buf[size - 1] = '\n';
	buf[size] = '\0';
	return size;
}

/* file_path: a client's file f on its sandbox. */
static void file_path(char *out, size_t cap, int cl, int f)
{
	fmt(out, cap, "/workspace/churn-%08x-c%d-f%d", RUN_ID, cl, f);
}

/* append_path: a client's append log (epoch: its rotation). */
static void append_path(char *out, size_t cap, int cl, unsigned epoch)
{
	fmt(out, cap, "/workspace/churn-%08x-c%d-appends.%u", RUN_ID, cl, epoch);
}

/* fmodel_allows: whether the file may hold version v now. */
static int fmodel_allows(const struct fmodel *m, uint64_t v)
{
	if (v == m->acked)
		return 1;
	if (v > m->acked && v <= m->pend_floor)
		return 1;
	for (unsigned i = 0; i < m->npend; i++)
		if (m->pend[i] == v)
			return 1;
	return 0;
}

/* fmodel_desc: what the model allows, for a violation's description. */
static void fmodel_desc(const struct fmodel *m, char *out, size_t cap)
{
	int o = snprintf(out, cap, "v%" PRIu64, m->acked);

	for (unsigned i = 0; i < m->npend && o > 0 && (size_t)o < cap; i++)
		o += snprintf(out + o, cap - (size_t)o, "|v%" PRIu64 "?", m->pend[i]);
}

/* fmodel_collapse: the file was seen holding v (allowed): v is now its
 * known version; unknown writes older than v did not matter. */
static void fmodel_collapse(struct fmodel *m, uint64_t v)
{
	unsigned k = 0;

	if (v == m->acked)
		return;
	m->acked = v;
	for (unsigned i = 0; i < m->npend; i++)
		if (m->pend[i] > v)
			m->pend[k++] = m->pend[i];
	m->npend = k;
	if (m->pend_floor <= v)
		m->pend_floor = 0;
}

/* fmodel_ack: an acknowledged write of version v. */
static void fmodel_ack(struct client *c, size_t si, int f, uint64_t v)
{
	struct fmodel *m = &c->f[si * (size_t)O.files + (size_t)f];

	if (m->suspect) /* the disagreeing read was before this write: stale */
		viol_report(V_STALE, "%s", m->why);
	m->suspect = 0;
	m->broken = 0;
	m->acked = v;
	m->npend = 0;
	m->pend_floor = 0;
}

/* fmodel_unknown: a write of version v whose outcome is unknown. */
static void fmodel_unknown(struct fmodel *m, uint64_t v)
{
	if (m->npend == PEND_MAX) { /* keep it bounded: the oldest ones widen */
		if (m->pend[0] > m->pend_floor)
			m->pend_floor = m->pend[0];
		memmove(m->pend, m->pend + 1, (PEND_MAX - 1) * sizeof(m->pend[0]));
		m->npend--;
	}
	m->pend[m->npend++] = v;
}

/* text_preview: the first bytes of an answer, printable (others as '.'). */
static void text_preview(char *out, size_t cap, const char *p, size_t len)
{
	size_t n = len < cap - 1 ? len : cap - 1;

	for (size_t i = 0; i < n; i++)
		out[i] = (p[i] >= ' ' && p[i] < 0x7f) ? p[i] : '.';
	out[n] = '\0';
}

/* file_observe: checks what a read (via: read, exec, cli, verify) saw in
 * a client's file f: absent, or len bytes at p. A disagreement during the
 * run is a suspicion the next read of the file decides (right again: a
 * stale read; still wrong: a lost write); at the final verification it is
 * a lost write. */
static void file_observe(struct client *c, size_t si, int f, int absent,
                         const char *p, size_t len, int final, const char *via)
{
	struct fmodel *m = &c->f[si * (size_t)O.files + (size_t)f];
	uint64_t v = 0;
	char want[200], path[128];

	if (m->broken)
		return;
	file_path(path, sizeof(path), c->id, f);
	fmodel_desc(m, want, sizeof(want));
	if (!absent) {
		unsigned r;
		int cl, ff;
		size_t s, n;
		char pre[256];
		size_t pl = len < sizeof(pre) - 1 ? len : sizeof(pre) - 1;

		memcpy(pre, p, pl);
		pre[pl] = '\0';
		char shown[48];
		text_preview(shown, sizeof(shown), p, len);
		if (sscanf(pre, "churn r=%8x c=%d s=%zu f=%d v=%" SCNu64 " n=%zu", &r, &cl,
		           &s, &ff, &v, &n) != 6 || r != RUN_ID || cl != c->id ||
		    s != si || ff != f || v == 0) {
			viol_report(V_CORRUPT, "%s of %s on %s: content of no version of this "
			            "file (%zu bytes: \"%s\"); model %s",
			            via, path, SB[si].id, len, shown, want);
			m->broken = 1;
			return;
		}
		size_t wl = content_make(c->buf2, c->bufcap, c->id, si, f, v);
		if (wl != len || memcmp(c->buf2, p, len) != 0) {
			viol_report(V_CORRUPT, "%s of %s on %s: version %" PRIu64 " damaged "
			            "(%zu bytes, want %zu); model %s",
			            via, path, SB[si].id, v, len, wl, want);
			m->broken = 1;
			return;
		}
	}
	if (fmodel_allows(m, v)) {
		if (m->suspect)
			viol_report(V_STALE, "%s", m->why);
		m->suspect = 0;
		fmodel_collapse(m, v);
		return;
	}
	if (v > m->acked && v < m->next_ver) { /* a write answered as refused */
		viol_report(V_PHANTOM, "%s of %s on %s: holds v%" PRIu64 ", written by a "
		            "write that was answered as refused; model %s",
		            via, path, SB[si].id, v, want);
		m->suspect = 0;
		fmodel_collapse(m, v);
		m->acked = v;
		return;
	}
	if (v >= m->next_ver) {
		viol_report(V_CORRUPT, "%s of %s on %s: holds v%" PRIu64 ", never written",
		            via, path, SB[si].id, v);
		m->broken = 1;
		return;
	}
	/* an older version (or absent) where a newer one was acknowledged */
	char seen[32];
	if (absent)
		fmt(seen, sizeof(seen), "absent");
	else
		fmt(seen, sizeof(seen), "v%" PRIu64, v);
	if (final || m->suspect) {
		viol_report(V_LOST, "%s of %s on %s: %s, acknowledged %s%s%s",
		            via, path, SB[si].id, seen, want,
		            m->suspect ? "; earlier: " : "", m->suspect ? m->why : "");
		m->suspect = 0;
		m->broken = 1;
		return;
	}
	m->suspect = 1;
	fmt(m->why, sizeof(m->why), "%s of %s on %s: %s, acknowledged %s",
	         via, path, SB[si].id, seen, want);
}

/* ---- the model: append logs ---------------------------------------------------- */

/* append_token: the token of append seq of a client's log. */
static void append_token(char *out, size_t cap, int cl, size_t si, unsigned epoch,
                         unsigned seq)
{
	fmt(out, cap, "%08x.%d.%zu.%u.%u", RUN_ID, cl, si, epoch, seq);
}

/* append_observe: checks an append log read: every acknowledged append in
 * order, exactly once; an unknown one at most once; a refused one never.
 * A log missing only its last acknowledged appends is a suspicion (stale
 * read or lost write, decided by the next read); one missing others, or
 * at the final verification, has lost writes. A violation rotates the log
 * so checking goes on. */
static void append_observe(struct client *c, size_t si, int absent, const char *p,
                           size_t len, int final, const char *via)
{
	struct amodel *a = &c->a[si];
	uint8_t seen[APPEND_MAX];
	unsigned dup = 0, phantom = 0, corrupt = 0, missing = 0;
	long last = -1, first_missing = -1;
	char path[128], first_bad[64] = "";

	append_path(path, sizeof(path), c->id, a->epoch);
	memset(seen, 0, sizeof(seen));
	for (size_t pos = 0; !absent && pos < len;) {
		const char *nl = memchr(p + pos, '\n', len - pos);
		size_t ll = nl ? (size_t)(nl - (p + pos)) : len - pos;
		unsigned r, ep, q;
		int cl, consumed = 0;
		size_t s;
		char line[80];

		if (nl == NULL || ll >= sizeof(line)) {
			corrupt++;
			text_preview(first_bad, 41, p + pos, len - pos);
			break;
		}
		memcpy(line, p + pos, ll);
		line[ll] = '\0';
		pos += ll + 1;
		if (sscanf(line, "%8x.%d.%zu.%u.%u%n", &r, &cl, &s, &ep, &q, &consumed) != 5 ||
		    (size_t)consumed != ll || r != RUN_ID || cl != c->id || s != si ||
		    ep != a->epoch || q >= a->n) {
			if (!corrupt++)
				text_preview(first_bad, 41, line, ll);
			continue;
		}
		if (seen[q]) {
			dup++;
		} else if ((long)q < last) {
			if (!corrupt++)
				fmt(first_bad, sizeof(first_bad), "%s out of order", line);
		}
		if (seen[q] < 255)
			seen[q]++;
		if ((long)q > last)
			last = (long)q;
	}
	for (unsigned q = 0; q < a->n; q++) {
		if (a->st[q] == A_REFUSED && seen[q])
			phantom++;
		if (a->st[q] == A_ACK && !seen[q]) {
			missing++;
			if (first_missing < 0)
				first_missing = (long)q;
		}
	}
	if (dup)
		viol_report(V_DUP, "%s of %s on %s: %u append(s) present twice or more",
		            via, path, SB[si].id, dup);
	if (phantom)
		viol_report(V_PHANTOM, "%s of %s on %s: %u append(s) answered as refused "
		            "are present", via, path, SB[si].id, phantom);
	if (corrupt)
		viol_report(V_CORRUPT, "%s of %s on %s: %u bad line(s), first \"%s\"",
		            via, path, SB[si].id, corrupt, first_bad);
	if (dup || phantom || corrupt)
		a->rotate = 1;
	if (missing) {
		int tail = first_missing > last;
		if (final || a->suspect || !tail) {
			viol_report(V_LOST, "%s of %s on %s: %u acknowledged append(s) missing, "
			            "first #%ld (log has %u appends, last seen #%ld)%s%s",
			            via, path, SB[si].id, missing, first_missing, a->n, last,
			            a->suspect ? "; earlier: " : "", a->suspect ? a->why : "");
			a->suspect = 0;
			a->rotate = 1;
		} else {
			a->suspect = 1;
			fmt(a->why, sizeof(a->why), "%s of %s on %s: the last %u "
			         "acknowledged append(s) missing (from #%ld of %u)",
			         via, path, SB[si].id, missing, first_missing, a->n);
		}
	} else if (a->suspect) {
		viol_report(V_STALE, "%s", a->why);
		a->suspect = 0;
	}
	for (unsigned q = 0; q < a->n; q++) /* seen once: it ran */
		if (a->st[q] == A_UNKNOWN && seen[q] == 1)
			a->st[q] = A_ACK;
}

/* ---- operations -------------------------------------------------------------- */

/* op_begin: notes what was known when the operation was sent. */
static void op_begin(struct opctx *o, int kind, struct sbx *s)
{
	o->kind = kind;
	o->s = s;
	cur_sbx = s;
	o->active0 = atomic_load(&s->mig_active);
	o->started0 = atomic_load(&s->mig_started);
	o->gen0 = atomic_load(&s->known_gen);
	o->t0 = now_us();
}

/* op_end: counts the operation, its latency (also as overlapping a
 * migration of its sandbox when one was in flight at any time between
 * send and answer) and its failure class (NULL: it succeeded). */
static void op_end(struct client *c, const struct opctx *o, const char *fail)
{
	uint64_t dt = now_us() - o->t0;
	int overlap = o->active0 > 0 || atomic_load(&o->s->mig_started) != o->started0;

	c->st.ops[o->kind]++;
	atomic_fetch_add(&ops_done, 1);
	hist_add(&c->st.all, dt);
	if (overlap) {
		c->st.overlap_ops++;
		hist_add(&c->st.overlap, dt);
		if (fail == NULL)
			hist_add(&c->st.overlap_ok, dt);
		else
			c->st.overlap_failed++;
	}
	if (fail != NULL) {
		c->st.failed[o->kind]++;
		atomic_fetch_add(&ops_failed, 1);
		classes_add(&op_classes, fail, o->kind);
		if (O.verbose)
			fprintf(stderr, "churn: %.3f s: %s on %s failed after %.1f ms: %s\n",
			        (double)(now_us() - run_t0) / 1e6, kind_names[o->kind], o->s->id,
			        (double)dt / 1000.0, fail);
	}
}

/* gen_check: an answer served by generation gen: wrong incarnation if
 * older than the generation known current when the operation was sent. */
static void gen_check(const struct opctx *o, int64_t gen, const char *what)
{
	if (gen <= 0)
		return;
	if ((uint64_t)gen < o->gen0)
		viol_report(V_WRONG_INC, "%s on %s answered by generation %" PRId64
		            ", but generation %" PRIu64 " was known current before it "
		            "was sent", what, o->s->id, gen, o->gen0);
	sbx_note_gen(o->s, (uint64_t)gen);
}

/* exec_script: the shell line of an exec/CLI op: a nonce line, then the
 * client's file (or ABSENT). */
static void exec_script(char *out, size_t cap, uint64_t nonce, const char *path)
{
	fmt(out, cap, "printf '%%s\\n' N%016" PRIx64 "; cat %s 2>/dev/null || printf ABSENT",
	         nonce, path);
}

/* exec_check: checks an exec/CLI stdout: the nonce line, then the file. */
static void exec_check(struct client *c, size_t si, int f, uint64_t nonce,
                       const char *out, size_t len, const char *via)
{
	char want[24];
	size_t wl = (size_t)snprintf(want, sizeof(want), "N%016" PRIx64 "\n", nonce);

	if (len < wl || memcmp(out, want, wl) != 0) {
		char shown[48];
		text_preview(shown, sizeof(shown), out, len);
		viol_report(V_CORRUPT, "%s on %s: stdout does not start with its nonce "
		            "(\"%s\")", via, SB[si].id, shown);
		return;
	}
	out += wl;
	len -= wl;
	file_observe(c, si, f, len == 6 && memcmp(out, "ABSENT", 6) == 0, out, len, 0, via);
}

/* exec_call: POST …/exec {"cmd":["sh","-c",script]}. On a 200 answer sets
 * *exit_code, *gen and *out (a JSON reference the caller releases); else
 * writes the failure class. Returns 0 on a well-formed 200. */
static int exec_call(struct client *c, size_t si, const char *script, json_t **out,
                     json_int_t *exit_code, int64_t *gen, char *fail, size_t cap)
{
	char path[128];
	json_t *req = json_pack("{s:[s,s,s]}", "cmd", "sh", "-c", script);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_t *j;

	json_decref(req);
	*out = NULL;
	if (body == NULL) {
		fmt(fail, cap, "harness: out of memory");
		return -1;
	}
	fmt(path, sizeof(path), "/v1/sandboxes/%s/exec", SB[si].id);
	http_do(&c->h, "POST", path, body, NULL, 0);
	free(body);
	if (c->h.rc != CURLE_OK || c->h.status != 200) {
		http_class(&c->h, fail, cap);
		return -1;
	}
	j = http_json(&c->h);
	if (!json_is_object(j) || !json_is_integer(json_object_get(j, "exit_code")) ||
	    !json_is_string(json_object_get(j, "stdout")) ||
	    !json_is_integer(json_object_get(j, "generation"))) {
		json_decref(j);
		fmt(fail, cap, "200 bad answer: exec JSON");
		return -1;
	}
	*exit_code = json_integer_value(json_object_get(j, "exit_code"));
	*gen = (int64_t)json_integer_value(json_object_get(j, "generation"));
	*out = j;
	return 0;
}

/* op_exec: an exec that echoes a nonce and reads one of the client's files. */
static void op_exec(struct client *c, size_t si, int f)
{
	char path[128], script[256], fail[CLASS_KEY];
	uint64_t nonce = rng_next(&c->rng);
	struct opctx o;
	json_t *j;
	json_int_t ec;
	int64_t gen;

	file_path(path, sizeof(path), c->id, f);
	exec_script(script, sizeof(script), nonce, path);
	op_begin(&o, K_EXEC, &SB[si]);
	if (exec_call(c, si, script, &j, &ec, &gen, fail, sizeof(fail)) < 0) {
		op_end(c, &o, fail);
		return;
	}
	gen_check(&o, gen, "exec");
	if (ec != 0) {
		fmt(fail, sizeof(fail), "200 exec exit %d", (int)ec);
		json_decref(j);
		op_end(c, &o, fail);
		return;
	}
	json_t *so = json_object_get(j, "stdout");
	exec_check(c, si, f, nonce, json_string_value(so), json_string_length(so), "exec");
	json_decref(j);
	op_end(c, &o, NULL);
}

/* op_append: an exec appending one token to the client's log. */
static void op_append(struct client *c, size_t si)
{
	struct amodel *a = &c->a[si];
	char path[128], tok[64], script[256], fail[CLASS_KEY];
	unsigned seq = a->n++;
	struct opctx o;
	json_t *j;
	json_int_t ec;
	int64_t gen;

	append_path(path, sizeof(path), c->id, a->epoch);
	append_token(tok, sizeof(tok), c->id, si, a->epoch, seq);
	fmt(script, sizeof(script), "printf '%%s\\n' %s >> %s", tok, path);
	op_begin(&o, K_APPEND, &SB[si]);
	if (exec_call(c, si, script, &j, &ec, &gen, fail, sizeof(fail)) < 0) {
		a->st[seq] = http_outcome(&c->h) == OUT_REFUSED ? A_REFUSED : A_UNKNOWN;
		op_end(c, &o, fail);
		return;
	}
	gen_check(&o, gen, "append");
	json_decref(j);
	if (ec != 0) {
		a->st[seq] = A_UNKNOWN;
		fmt(fail, sizeof(fail), "200 exec exit %d", (int)ec);
		op_end(c, &o, fail);
		return;
	}
	a->st[seq] = A_ACK;
	op_end(c, &o, NULL);
}

/* op_write: a streamed PUT of the file's next version (Content-Length,
 * as curl --upload-file sends it). */
static void op_write(struct client *c, size_t si, int f)
{
	struct fmodel *m = &c->f[si * (size_t)O.files + (size_t)f];
	char path[128], url[256], fail[CLASS_KEY];
	uint64_t v = m->next_ver++;
	size_t len = content_make(c->buf, c->bufcap, c->id, si, f, v);
	struct opctx o;

	file_path(path, sizeof(path), c->id, f);
	fmt(url, sizeof(url), "/v1/sandboxes/%s/files?path=%s", SB[si].id, path);
	op_begin(&o, K_WRITE, &SB[si]);
	http_do(&c->h, "PUT", url, NULL, c->buf, len);
	if (c->h.rc != CURLE_OK || c->h.status != 200) {
		http_class(&c->h, fail, sizeof(fail));
		if (http_outcome(&c->h) != OUT_REFUSED)
			fmodel_unknown(m, v);
		op_end(c, &o, fail);
		return;
	}
	json_t *j = http_json(&c->h);
	json_t *b = json_object_get(j, "bytes");
	if (!json_is_integer(b) || (size_t)json_integer_value(b) != len) {
		json_decref(j);
		fmodel_unknown(m, v);
		fmt(fail, sizeof(fail), "200 bad answer: bytes");
		op_end(c, &o, fail);
		return;
	}
	int64_t gen = c->h.gen_hdr;
	if (gen <= 0 && json_is_integer(json_object_get(j, "generation")))
		gen = (int64_t)json_integer_value(json_object_get(j, "generation"));
	json_decref(j);
	gen_check(&o, gen, "write");
	fmodel_ack(c, si, f, v);
	op_end(c, &o, gen > 0 ? NULL : "200 write without a generation");
}

/* op_read: GET …/files of file f (f == files: the append log). kind is
 * K_READ or K_VERIFY (final = the last verification). Returns 0 when the
 * read got an answer it could check. */
static int op_read(struct client *c, size_t si, int f, int kind, int final)
{
	char path[128], url[256], fail[CLASS_KEY];
	int is_log = f == O.files;
	struct opctx o;
	int absent;

	if (is_log)
		append_path(path, sizeof(path), c->id, c->a[si].epoch);
	else
		file_path(path, sizeof(path), c->id, f);
	fmt(url, sizeof(url), "/v1/sandboxes/%s/files?path=%s", SB[si].id, path);
	op_begin(&o, kind, &SB[si]);
	http_do(&c->h, "GET", url, NULL, NULL, 0);
	if (c->h.rc == CURLE_OK && c->h.status == 404 && c->h.gen_hdr > 0) {
		json_t *j = http_json(&c->h);
		const char *code = json_string_value(json_object_get(j, "error"));
		absent = code != NULL && strcmp(code, "not_found") == 0;
		json_decref(j);
		if (!absent) {
			http_class(&c->h, fail, sizeof(fail));
			op_end(c, &o, fail);
			return -1;
		}
	} else if (c->h.rc == CURLE_OK && c->h.status == 200) {
		absent = 0;
	} else {
		http_class(&c->h, fail, sizeof(fail));
		op_end(c, &o, fail);
		return -1;
	}
	gen_check(&o, c->h.gen_hdr, kind == K_VERIFY ? "verify" : "read");
	if (is_log)
		append_observe(c, si, absent, c->h.body, c->h.len, final,
		               kind == K_VERIFY ? "verify" : "read");
	else
		file_observe(c, si, f, absent, c->h.body, c->h.len, final,
		             kind == K_VERIFY ? "verify" : "read");
	op_end(c, &o, c->h.gen_hdr > 0 ? NULL : "answer without X-Tether-Generation");
	return 0;
}

/* cli_spawn: runs `tether exec ID -- sh -c SCRIPT`, collecting stdout
 * (bounded) and the start of stderr, killed after --timeout. Returns the
 * wait status, or -1 if it could not run. */
static int cli_spawn(struct client *c, const char *id, const char *script, size_t *outlen,
                     char *err, size_t errcap)
{
	int op[2] = { -1, -1 }, ep[2] = { -1, -1 }, status = -1;
	posix_spawn_file_actions_t fa;
	char *argv[] = { O.cli, "exec", (char *)id, "--", "sh", "-c", (char *)script, NULL };
	pid_t pid;
	size_t el = 0;
	uint64_t deadline = now_us() + (uint64_t)O.timeout_s * 1000000u;

	*outlen = 0;
	err[0] = '\0';
	if (pipe2(op, O_CLOEXEC) < 0 || pipe2(ep, O_CLOEXEC) < 0) {
		fmt(err, errcap, "pipe: %s", strerror(errno));
		goto out;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, op[1], 1);
	posix_spawn_file_actions_adddup2(&fa, ep[1], 2);
	int rc = posix_spawn(&pid, O.cli, &fa, NULL, argv, cli_envp);
	posix_spawn_file_actions_destroy(&fa);
	close(op[1]);
	close(ep[1]);
	op[1] = ep[1] = -1;
	if (rc != 0) {
		fmt(err, errcap, "spawn %s: %s", O.cli, strerror(rc));
		goto out;
	}
	int open_fds = 2;
	while (open_fds > 0) {
		struct pollfd pf[2] = { { op[0], POLLIN, 0 }, { ep[0], POLLIN, 0 } };
		uint64_t now = now_us();
		char junk[4096];

		if (now >= deadline) {
			fmt(err, errcap, "timed out");
			break;
		}
		if (poll(pf, 2, (int)((deadline - now) / 1000 + 1)) < 0 && errno != EINTR) {
			fmt(err, errcap, "poll: %s", strerror(errno));
			break;
		}
		for (int i = 0; i < 2; i++) {
			if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			char *dst = i == 0 ? c->cli_out + *outlen : junk;
			size_t room = i == 0 ? c->cli_cap - *outlen : sizeof(junk);
			if (room == 0) {
				dst = junk;
				room = sizeof(junk);
			}
			ssize_t n = read(pf[i].fd, dst, room);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				close(pf[i].fd);
				if (i == 0)
					op[0] = -1;
				else
					ep[0] = -1;
				open_fds--;
				continue;
			}
			if (i == 0 && dst != junk)
				*outlen += (size_t)n;
			if (i == 1 && el + 1 < errcap) {
				size_t k = (size_t)n < errcap - 1 - el ? (size_t)n : errcap - 1 - el;
				memcpy(err + el, junk, k);
				el += k;
				err[el] = '\0';
			}
		}
	}
	if (open_fds > 0) /* gave up on it: our own child, by its pid */
		kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
out:
	for (int i = 0; i < 2; i++) {
		if (op[i] >= 0)
			close(op[i]);
		if (ep[i] >= 0)
			close(ep[i]);
	}
	c->cli_out[*outlen < c->cli_cap ? *outlen : c->cli_cap - 1] = '\0';
	return status;
}

/* op_cli: the exec op through the real CLI (`tether exec`). */
static void op_cli(struct client *c, size_t si, int f)
{
	char path[128], script[256], err[256], fail[CLASS_KEY], words[96];
	uint64_t nonce = rng_next(&c->rng);
	struct opctx o;
	size_t len;
	int st;

	file_path(path, sizeof(path), c->id, f);
	exec_script(script, sizeof(script), nonce, path);
	op_begin(&o, K_CLI, &SB[si]);
	st = cli_spawn(c, SB[si].id, script, &len, err, sizeof(err));
	err[strcspn(err, "\n")] = '\0';
	/* "tether: exec sbx_…: code: message": keep the stable words */
	const char *msg = strncmp(err, "tether: ", 8) == 0 ? err + 8 : err;
	words_first(words, sizeof(words), msg);
	if (st < 0) {
		fmt(fail, sizeof(fail), "cli: %s", words);
	} else if (WIFSIGNALED(st)) {
		fmt(fail, sizeof(fail), "cli signal %d%s%s", WTERMSIG(st),
		         err[0] ? ": " : "", words);
	} else if (WEXITSTATUS(st) != 0) {
		fmt(fail, sizeof(fail), "cli exit %d: %s", WEXITSTATUS(st), words);
	} else if (len >= c->cli_cap) {
		fmt(fail, sizeof(fail), "cli: output too large");
	} else {
		exec_check(c, si, f, nonce, c->cli_out, len, "cli");
		op_end(c, &o, NULL);
		return;
	}
	op_end(c, &o, fail);
}

/* op_delete: DELETE …/files of a rotated append log. */
static void op_delete(struct client *c, size_t si, const char *path)
{
	char url[256], fail[CLASS_KEY];
	struct opctx o;

	fmt(url, sizeof(url), "/v1/sandboxes/%s/files?path=%s", SB[si].id, path);
	op_begin(&o, K_DELETE, &SB[si]);
	http_do(&c->h, "DELETE", url, NULL, NULL, 0);
	if ((c->h.rc != CURLE_OK || c->h.status != 200) &&
	    !(c->h.rc == CURLE_OK && c->h.status == 404 && c->h.gen_hdr > 0)) {
		http_class(&c->h, fail, sizeof(fail));
		op_end(c, &o, fail);
		return;
	}
	op_end(c, &o, NULL);
}

/* client_rotate: a full append log is read and checked once more, then
 * deleted, and a fresh one (next epoch) begins: memory and disk stay
 * bounded. */
static void client_rotate(struct client *c, size_t si)
{
	struct amodel *a = &c->a[si];
	char path[128];

	if (!a->rotate)
		op_read(c, si, O.files, K_READ, 0);
	if (a->suspect) /* undecided: it was seen wrong once */
		viol_report(V_STALE, "%s", a->why);
	append_path(path, sizeof(path), c->id, a->epoch);
	op_delete(c, si, path);
	a->epoch++;
	a->n = 0;
	a->suspect = 0;
	a->rotate = 0;
}

/* client_verify: the last verification, after migrations stopped: every
 * file and append log read once more (retried on failures). */
static void client_verify(struct client *c)
{
	c->h.deadline_us = verify_deadline;
	for (size_t si = 0; si < NSB; si++)
		for (int f = 0; f <= O.files; f++) {
			int done = 0;
			for (int t = 0; t < FINAL_TRIES && !done && now_us() < verify_deadline; t++) {
				done = op_read(c, si, f, K_VERIFY, 1) == 0;
				if (!done)
					sleep_ms(300);
			}
			if (!done) {
				c->unverified++;
				fprintf(stderr, "churn: client %d: final read of %s file %d "
				        "failed (tries or time ran out)\n", c->id, SB[si].id, f);
			}
		}
}

/* client_pick: exec (0), read (1), write (2) or append (3), by --mix. */
static int client_pick(uint64_t *rng)
{
	unsigned total = O.mix[0] + O.mix[1] + O.mix[2] + O.mix[3];
	unsigned r = (unsigned)(rng_next(rng) % total);

	for (int i = 0; i < 3; i++) {
		if (r < O.mix[i])
			return i;
		r -= O.mix[i];
	}
	return 3;
}

/* client_main: the client loop, then the final verification. */
static void *client_main(void *arg)
{
	struct client *c = arg;

	while (!atomic_load(&stop_ops)) {
		if (O.max_ops && atomic_fetch_add(&ops_ticket, 1) >= O.max_ops)
			break;
		size_t si = (size_t)(rng_next(&c->rng) % NSB);
		int f = (int)(rng_next(&c->rng) % (uint64_t)O.files);

		if (c->a[si].n >= APPEND_MAX || c->a[si].rotate) {
			client_rotate(c, si);
			continue;
		}
		c->h.rc = CURLE_OK;
		if (rng_unit(&c->rng) < O.cli_fraction) {
			op_cli(c, si, f);
			continue;
		}
		switch (client_pick(&c->rng)) {
		case 0:
			op_exec(c, si, f);
			break;
		case 1: /* one of the files, or the append log */
			op_read(c, si, (int)(rng_next(&c->rng) % (uint64_t)(O.files + 1)), K_READ, 0);
			break;
		case 2:
			op_write(c, si, f);
			break;
		default:
			op_append(c, si);
			break;
		}
		/* nothing listens: back off as a client would, not spin */
		if (c->h.rc == CURLE_COULDNT_CONNECT)
			sleep_ms(100);
	}
	atomic_fetch_sub(&clients_looping, 1);
	while (!atomic_load(&verify_go))
		sleep_ms(20);
	client_verify(c);
	return NULL;
}

/* ---- migrations ------------------------------------------------------------------ */

/* migrator_main: migrates sandboxes round robin, each to the worker after
 * its current one, as fast as migrations complete (or with a pause). A
 * failed migration is followed by bringing the sandbox back to running. */
static void *migrator_main(void *arg)
{
	struct migrator *m = arg;

	while (!atomic_load(&stop_migrate)) {
		struct sbx *s = &SB[m->next++ % NSB];
		char path[128], body[128], target[64], fail[CLASS_KEY];
		uint64_t t0;

		sbx_target(s, target, sizeof(target));
		fmt(path, sizeof(path), "/v1/sandboxes/%s/migrate", s->id);
		fmt(body, sizeof(body), "{\"worker\":\"%s\"}", target);
		atomic_fetch_add(&s->mig_started, 1);
		atomic_fetch_add(&s->mig_active, 1);
		t0 = now_us();
		http_do(&m->h, "POST", path, body, NULL, 0);
		uint64_t dt = now_us() - t0;
		json_t *j = m->h.rc == CURLE_OK && m->h.status == 200 ? http_json(&m->h) : NULL;
		if (j != NULL && strcmp(sbx_note(s, j), "running") == 0) {
			m->ok++;
			atomic_fetch_add(&mig_ok_total, 1);
			hist_add(&m->dur, dt);
		} else {
			if (j != NULL)
				fmt(fail, sizeof(fail), "200 but not running");
			else
				http_class(&m->h, fail, sizeof(fail));
			classes_add(&mig_classes, fail, 0);
			m->failed++;
			atomic_fetch_add(&mig_fail_total, 1);
			fprintf(stderr, "churn: %.3f s: migrate %s -> %s failed: %s\n",
			        (double)(now_us() - run_t0) / 1e6, s->id, target, fail);
			if (!atomic_load(&stop_migrate)) { /* else main settles it */
				m->recoveries++;
				if (sbx_settle(&m->h, s, now_us() + 30000000u) < 0)
					m->recover_failed++;
			}
		}
		json_decref(j);
		atomic_fetch_sub(&s->mig_active, 1);
		for (int left = O.migrate_pause_ms; left > 0 && !atomic_load(&stop_migrate);
		     left -= 50)
			sleep_ms(left < 50 ? (unsigned)left : 50);
	}
	return NULL;
}

/* watch_main: GET /healthz every second (5 s timeout): how long the edge
 * did not answer anyone. */
static void *watch_main(void *arg)
{
	struct watch *w = arg;

	while (!atomic_load(&stop_watch)) {
		uint64_t t = now_us();

		w->h.deadline_us = t + 5000000u;
		http_do(&w->h, "GET", "/healthz", NULL, NULL, 0);
		w->checks++;
		if (w->h.rc != CURLE_OK || w->h.status != 200) {
			w->failed++;
			if (!w->down_since)
				w->down_since = t;
			atomic_store(&edge_down, 1);
		} else {
			if (w->down_since && t - w->down_since > w->longest_us)
				w->longest_us = t - w->down_since;
			w->down_since = 0;
			atomic_store(&edge_down, 0);
		}
		for (int i = 0; i < 10 && !atomic_load(&stop_watch); i++)
			sleep_ms(100);
	}
	if (w->down_since && now_us() - w->down_since > w->longest_us)
		w->longest_us = now_us() - w->down_since;
	return NULL;
}

/* ---- setup --------------------------------------------------------------------- */

/* config_file: url= and api_key= from ~/.config/tether/config, for what
 * neither the options nor the environment gave. */
static void config_file(int need_url, int need_key)
{
	const char *home = getenv("HOME");
	char path[PATH_MAX], line[1200];
	FILE *fp;

	if (home == NULL || (!need_url && !need_key))
		return;
	fmt(path, sizeof(path), "%s/.config/tether/config", home);
	fp = fopen(path, "re");
	if (fp == NULL)
		return;
	while (fgets(line, sizeof(line), fp)) {
		line[strcspn(line, "\r\n")] = '\0';
		char *p = line;
		while (*p == ' ' || *p == '\t')
			p++;
		if (need_url && strncmp(p, "url=", 4) == 0)
			fmt(O.url, sizeof(O.url), "%s", p + 4);
		else if (need_key && strncmp(p, "api_key=", 8) == 0)
			fmt(O.key, sizeof(O.key), "%s", p + 8);
	}
	fclose(fp);
}

/* workers_parse: --workers w1,w2,w3. */
static int workers_parse(const char *arg)
{
	char tmp[1024], *save = NULL;

	fmt(tmp, sizeof(tmp), "%s", arg);
	O.nworkers = 0;
	for (char *w = strtok_r(tmp, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		if (O.nworkers == MAX_WORKERS || strlen(w) >= sizeof(O.workers[0]))
			return -1;
		fmt(O.workers[O.nworkers++], sizeof(O.workers[0]), "%s", w);
	}
	return O.nworkers > 0 ? 0 : -1;
}

/* workers_discover: the workers the cluster reports up. */
static int workers_discover(struct http *h)
{
	json_t *j, *arr, *w;
	size_t i;

	http_do(h, "GET", "/v1/workers", NULL, NULL, 0);
	if (h->rc != CURLE_OK || h->status != 200)
		return -1;
	j = http_json(h);
	arr = json_object_get(j, "workers");
	json_array_foreach(arr, i, w) {
		const char *id = json_string_value(json_object_get(w, "id"));
		const char *st = json_string_value(json_object_get(w, "state"));
		if (id && st && strcmp(st, "up") == 0 && O.nworkers < MAX_WORKERS &&
		    strlen(id) < sizeof(O.workers[0]))
			fmt(O.workers[O.nworkers++], sizeof(O.workers[0]), "%s", id);
	}
	json_decref(j);
	return O.nworkers > 0 ? 0 : -1;
}

/* sandboxes_setup: creates --sandboxes N (spread over the workers) or
 * loads the given ids; each must be running. */
static int sandboxes_setup(struct http *h)
{
	char path[128], body[128], fail[CLASS_KEY];

	NSB = O.nids ? O.nids : (size_t)O.create_n;
	for (size_t i = 0; i < NSB; i++) {
		struct sbx *s = &SB[i];
		json_t *j;

		pthread_mutex_init(&s->mu, NULL);
		if (O.nids) {
			fmt(s->id, sizeof(s->id), "%s", O.ids[i]);
			fmt(path, sizeof(path), "/v1/sandboxes/%s", s->id);
			http_do(h, "GET", path, NULL, NULL, 0);
		} else {
			fmt(body, sizeof(body), "{\"worker\":\"%s\"}",
			         O.workers[i % (size_t)O.nworkers]);
			http_do(h, "POST", "/v1/sandboxes", body, NULL, 0);
		}
		if (h->rc != CURLE_OK || (h->status != 200 && h->status != 201)) {
			http_class(h, fail, sizeof(fail));
			fprintf(stderr, "churn: %s sandbox %zu: %s\n",
			        O.nids ? "cannot load" : "cannot create", i, fail);
			return -1;
		}
		j = http_json(h);
		const char *id = json_string_value(json_object_get(j, "id"));
		if (!O.nids && id) {
			fmt(s->id, sizeof(s->id), "%s", id);
			s->created = 1;
		}
		const char *state = j ? sbx_note(s, j) : "?";
		json_decref(j);
		if (strcmp(state, "running") != 0 && sbx_settle(h, s, now_us() + 30000000u) < 0) {
			fprintf(stderr, "churn: sandbox %s is %s, not running\n", s->id, state);
			return -1;
		}
	}
	return 0;
}

/* sandboxes_cleanup: deletes the sandboxes this run created. */
static void sandboxes_cleanup(struct http *h)
{
	char path[128];

	for (size_t i = 0; i < NSB; i++) {
		if (!SB[i].created)
			continue;
		fmt(path, sizeof(path), "/v1/sandboxes/%s", SB[i].id);
		http_do(h, "DELETE", path, NULL, NULL, 0);
		if (h->rc != CURLE_OK || h->status != 200)
			fprintf(stderr, "churn: could not delete %s (status %ld)\n", SB[i].id,
			        h->status);
	}
}

/* cli_env: the environment of CLI children: ours, with the URL and key. */
static int cli_env(void)
{
	size_t n = 0, k = 0;
	char *url = NULL, *key = NULL;

	while (environ[n])
		n++;
	cli_envp = calloc(n + 3, sizeof(char *));
	if (cli_envp == NULL || asprintf(&url, "TETHER_URL=%s", O.url) < 0 ||
	    asprintf(&key, "TETHER_API_KEY=%s", O.key) < 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "TETHER_URL=", 11) != 0 &&
		    strncmp(environ[i], "TETHER_API_KEY=", 15) != 0)
			cli_envp[k++] = environ[i];
	cli_envp[k++] = url;
	cli_envp[k++] = key;
	cli_envp[k] = NULL;
	return 0;
}

/* cli_default: build/tether next to this binary. */
static void cli_default(void)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n <= 0) {
		fmt(O.cli, sizeof(O.cli), "tether");
		return;
	}
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	fmt(O.cli, sizeof(O.cli), "%s/tether", self);
}

/* ---- report --------------------------------------------------------------------- */

struct totals {
	struct watch *w;
	struct stats st;
	uint64_t ops, failed, unverified;
	struct hist mig;
	uint64_t mig_ok, mig_failed, recoveries, recover_failed;
	double run_s, total_s;
};

/* totals_gather: adds up every client's and migrator's counts. */
static void totals_gather(struct totals *t, struct client *cl, struct migrator *mg)
{
	for (int i = 0; i < O.clients; i++) {
		const struct stats *s = &cl[i].st;
		for (int k = 0; k < K_N; k++) {
			t->st.ops[k] += s->ops[k];
			t->st.failed[k] += s->failed[k];
			t->ops += s->ops[k];
			t->failed += s->failed[k];
		}
		t->st.overlap_ops += s->overlap_ops;
		t->st.overlap_failed += s->overlap_failed;
		hist_merge(&t->st.all, &s->all);
		hist_merge(&t->st.overlap, &s->overlap);
		hist_merge(&t->st.overlap_ok, &s->overlap_ok);
		t->unverified += cl[i].unverified;
	}
	for (int i = 0; i < O.migrators; i++) {
		hist_merge(&t->mig, &mg[i].dur);
		t->mig_ok += mg[i].ok;
		t->mig_failed += mg[i].failed;
		t->recoveries += mg[i].recoveries;
		t->recover_failed += mg[i].recover_failed;
	}
}

/* report_classes: one table's classes, most frequent first. */
static void report_classes(FILE *out, struct classes *t, int by_kind)
{
	qsort(t->c, t->n, sizeof(t->c[0]), class_cmp);
	for (size_t i = 0; i < t->n; i++) {
		fprintf(out, "  %9" PRIu64 "  %s", t->c[i].n, t->c[i].key);
		if (by_kind) {
			const char *sep = "  (";
			for (int k = 0; k < K_N; k++)
				if (t->c[i].by_kind[k]) {
					fprintf(out, "%s%s %" PRIu64, sep, kind_names[k], t->c[i].by_kind[k]);
					sep = ", ";
				}
			fputs(")", out);
		}
		fputc('\n', out);
	}
}

/* goal_met: issue 12's latency goal: operations that overlapped a
 * migration all succeeded, with a p99 within the migration p99 + 50 ms. */
static int goal_met(const struct totals *t)
{
	return t->st.overlap_failed == 0 &&
	       hist_pct_ms(&t->st.overlap, 0.99) <= hist_pct_ms(&t->mig, 0.99) + 50.0;
}

/* report_text: the human summary. */
static void report_text(FILE *out, const struct totals *t)
{
	double rate = t->ops ? 100.0 * (double)t->failed / (double)t->ops : 0;
	double mig_p99 = hist_pct_ms(&t->mig, 0.99);
	double ov_p99 = hist_pct_ms(&t->st.overlap, 0.99);
	uint64_t viol = 0;

	fprintf(out, "\n== churn: %.1f s (+%.1f s final verification), %d clients, %zu "
	        "sandboxes, %d workers (", t->run_s, t->total_s - t->run_s, O.clients, NSB,
	        O.nworkers);
	for (int i = 0; i < O.nworkers; i++)
		fprintf(out, "%s%s", i ? "," : "", O.workers[i]);
	fprintf(out, "), %d migrate loop(s), run %08x\n", O.migrators, RUN_ID);
	fprintf(out, "operations       %" PRIu64 "  (%.1f/s)\n", t->ops,
	        t->run_s > 0 ? (double)t->ops / t->total_s : 0);
	for (int k = 0; k < K_N; k++)
		if (t->st.ops[k])
			fprintf(out, "  %-8s %9" PRIu64 "  failed %" PRIu64 "\n", kind_names[k],
			        t->st.ops[k], t->st.failed[k]);
	fprintf(out, "failed           %" PRIu64 "\n", t->failed);
	fprintf(out, "error rate       %.6f %%\n", rate);
	if (op_classes.n) {
		fprintf(out, "failure classes:\n");
		report_classes(out, &op_classes, 1);
	}
	fprintf(out, "dropped client connections  %" PRIu64 "\n", atomic_load(&dropped_conns));
	fprintf(out, "edge health      %" PRIu64 " checks of /healthz, %" PRIu64 " unanswered "
	        "(5 s); longest unresponsive %.1f s%s\n", t->w->checks, t->w->failed,
	        (double)t->w->longest_us / 1e6, t->w->failed ? "  <- the edge stopped answering" : "");
	fprintf(out, "migrations       ok %" PRIu64 ", failed %" PRIu64 " (%.2f/s ok), "
	        "duration p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
	        t->mig_ok, t->mig_failed, t->run_s > 0 ? (double)t->mig_ok / t->run_s : 0,
	        hist_pct_ms(&t->mig, 0.5), mig_p99, (double)t->mig.max_us / 1000.0);
	if (mig_classes.n) {
		fprintf(out, "migration failures (%" PRIu64 " recoveries, %" PRIu64
		        " of them failed):\n", t->recoveries, t->recover_failed);
		report_classes(out, &mig_classes, 0);
	}
	fprintf(out, "latency          all: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
	        hist_pct_ms(&t->st.all, 0.5), hist_pct_ms(&t->st.all, 0.99),
	        (double)t->st.all.max_us / 1000.0);
	fprintf(out, "                 overlapping a migration: %" PRIu64 " ops (%" PRIu64
	        " failed), p50 %.1f ms, p99 %.1f ms; succeeded only: p99 %.1f ms\n",
	        t->st.overlap_ops, t->st.overlap_failed, hist_pct_ms(&t->st.overlap, 0.5),
	        ov_p99, hist_pct_ms(&t->st.overlap_ok, 0.99));
	fprintf(out, "                 goal: overlapping p99 %.1f ms <= migration p99 %.1f "
	        "ms + 50 ms, none failed: %s\n", ov_p99, mig_p99,
	        goal_met(t) ? "met" : "NOT met");
	fprintf(out, "safety:\n");
	for (int v = 0; v < V_N; v++) {
		uint64_t n = atomic_load(&viol_count[v]);
		viol += n;
		fprintf(out, "  %9" PRIu64 "  %s\n", n, viol_text[v]);
	}
	if (atomic_load(&viol_recovered))
		fprintf(out, "  (%" PRIu64 " of them on sandboxes the harness had to resume "
		        "from their last snapshot after a failed migration)\n",
		        atomic_load(&viol_recovered));
	if (t->unverified)
		fprintf(out, "  (%" PRIu64 " files could not be verified at the end)\n",
		        t->unverified);
	fprintf(out, "verdict          %s\n", viol ? "UNSAFE: safety violations" : "safe");
}

/* report_classes_json: one table's classes as a JSON array. */
static json_t *report_classes_json(const struct classes *t, int by_kind)
{
	json_t *arr = json_array();

	for (size_t i = 0; i < t->n; i++) {
		json_t *o = json_pack("{s:s,s:I}", "class", t->c[i].key, "count",
		                      (json_int_t)t->c[i].n);
		if (by_kind) {
			json_t *k = json_object();
			for (int kk = 0; kk < K_N; kk++)
				if (t->c[i].by_kind[kk])
					json_object_set_new(k, kind_names[kk],
					                    json_integer((json_int_t)t->c[i].by_kind[kk]));
			json_object_set_new(o, "by_kind", k);
		}
		json_array_append_new(arr, o);
	}
	return arr;
}

/* report_json: the summary as one JSON line in path. */
static int report_json(const char *path, const struct totals *t)
{
	json_t *j = json_object(), *kinds = json_object(), *lat, *mig;
	double rate = t->ops ? 100.0 * (double)t->failed / (double)t->ops : 0;
	double mig_p99 = hist_pct_ms(&t->mig, 0.99), ov_p99 = hist_pct_ms(&t->st.overlap, 0.99);
	uint64_t viol = 0;
	FILE *fp;
	char *s;

	for (int k = 0; k < K_N; k++)
		json_object_set_new(kinds, kind_names[k],
		                    json_pack("{s:I,s:I}", "ops", (json_int_t)t->st.ops[k],
		                              "failed", (json_int_t)t->st.failed[k]));
	json_object_set_new(j, "run", json_sprintf("%08x", RUN_ID));
	json_object_set_new(j, "seconds", json_real(t->run_s));
	json_object_set_new(j, "total_seconds", json_real(t->total_s));
	json_object_set_new(j, "clients", json_integer(O.clients));
	json_object_set_new(j, "sandboxes", json_integer((json_int_t)NSB));
	json_object_set_new(j, "workers", json_integer(O.nworkers));
	json_object_set_new(j, "operations", json_integer((json_int_t)t->ops));
	json_object_set_new(j, "ops_per_s", json_real(t->total_s > 0 ? (double)t->ops / t->total_s : 0));
	json_object_set_new(j, "by_kind", kinds);
	json_object_set_new(j, "failed", json_integer((json_int_t)t->failed));
	json_object_set_new(j, "error_rate_pct", json_real(rate));
	json_object_set_new(j, "failure_classes", report_classes_json(&op_classes, 1));
	json_object_set_new(j, "dropped_connections",
	                    json_integer((json_int_t)atomic_load(&dropped_conns)));
	for (int v = 0; v < V_N; v++) {
		uint64_t n = atomic_load(&viol_count[v]);
		viol += n;
		json_object_set_new(j, viol_names[v], json_integer((json_int_t)n));
	}
	json_object_set_new(j, "violations", json_integer((json_int_t)viol));
	json_object_set_new(j, "violations_after_recovery",
	                    json_integer((json_int_t)atomic_load(&viol_recovered)));
	json_object_set_new(j, "unverified", json_integer((json_int_t)t->unverified));
	json_object_set_new(j, "edge_health",
	                    json_pack("{s:I,s:I,s:f}", "checks", (json_int_t)t->w->checks,
	                              "unanswered", (json_int_t)t->w->failed,
	                              "longest_unresponsive_s", (double)t->w->longest_us / 1e6));
	mig = json_pack("{s:I,s:I,s:f,s:f,s:f,s:f,s:I,s:I}", "ok", (json_int_t)t->mig_ok,
	                "failed", (json_int_t)t->mig_failed, "per_s",
	                t->run_s > 0 ? (double)t->mig_ok / t->run_s : 0.0, "p50_ms",
	                hist_pct_ms(&t->mig, 0.5), "p99_ms", mig_p99, "max_ms",
	                (double)t->mig.max_us / 1000.0, "recoveries", (json_int_t)t->recoveries,
	                "recover_failed", (json_int_t)t->recover_failed);
	json_object_set_new(mig, "failure_classes", report_classes_json(&mig_classes, 0));
	json_object_set_new(j, "migrations", mig);
	lat = json_pack("{s:f,s:f,s:f,s:I,s:I,s:f,s:f,s:f,s:b}", "p50_ms",
	                hist_pct_ms(&t->st.all, 0.5), "p99_ms", hist_pct_ms(&t->st.all, 0.99),
	                "max_ms", (double)t->st.all.max_us / 1000.0, "overlap_ops",
	                (json_int_t)t->st.overlap_ops, "overlap_failed",
	                (json_int_t)t->st.overlap_failed, "overlap_p50_ms",
	                hist_pct_ms(&t->st.overlap, 0.5), "overlap_p99_ms", ov_p99,
	                "overlap_ok_p99_ms", hist_pct_ms(&t->st.overlap_ok, 0.99),
	                "goal_met", goal_met(t));
	json_object_set_new(j, "latency", lat);
	s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10));
	json_decref(j);
	fp = s ? fopen(path, "we") : NULL;
	if (fp == NULL) {
		fprintf(stderr, "churn: cannot write %s: %s\n", path, strerror(errno));
		free(s);
		return -1;
	}
	fprintf(fp, "%s\n", s);
	free(s);
	return fclose(fp) == 0 ? 0 : -1;
}

/* ---- main ------------------------------------------------------------------------ */

/* usage: the options. */
static void usage(FILE *out)
{
	fprintf(out,
	        "usage: churn [options] [SANDBOX_ID...]\n"
	        "  Mixed client operations on sandboxes migrating continuously, checked\n"
	        "  against an exact model of what each client was acknowledged.\n"
	        "  --url URL              edge URL (TETHER_URL, ~/.config/tether/config)\n"
	        "  --key KEY              API key (TETHER_API_KEY, config api_key=)\n"
	        "  --sandboxes N          create N sandboxes (default 6 when no ids given)\n"
	        "  --workers w1,w2,...    workers to migrate between (default: all up)\n"
	        "  --clients C            client threads (default 5)\n"
	        "  --seconds S            run time (default 60)\n"
	        "  --ops N                stop after N operations instead\n"
	        "  --migrators M          migrate loops (default 1; 0: none)\n"
	        "  --migrate-pause-ms MS  pause between migrations (default 0)\n"
	        "  --cli-fraction F       fraction of ops run through the CLI (default 0.02)\n"
	        "  --cli PATH             the CLI (default: tether next to this binary)\n"
	        "  --mix E,R,W,A          weights of exec, read, write, append (default 1,1,1,1)\n"
	        "  --files N              files per client and sandbox (default 2)\n"
	        "  --max-file BYTES       largest file written (default 65536)\n"
	        "  --timeout S            per-call timeout (default 60)\n"
	        "  --verify-seconds S     time for the final verification (default 60)\n"
	        "  --json FILE            the summary as one JSON line\n"
	        "  --max-error-rate PCT   exit 2 if the error rate (%%) is above PCT\n"
	        "  --seed N               RNG seed (default: from the clock)\n"
	        "  --progress S           progress line every S seconds (0: none; default 10)\n"
	        "  --expect100            keep curl's Expect: 100-continue on uploads\n"
	        "  --fresh-upload-connections  each PUT on a new connection, closed after\n"
	        "                         it (default: keep-alive, like every other call)\n"
	        "  --keep                 do not delete the sandboxes this run created\n"
	        "  --verbose              print every failure\n"
	        "Exit: 0 ok, 1 safety violations, 2 error rate above the maximum,\n"
	        "3 setup or harness failure, 64 usage.\n");
}

/* opts_parse: the command line; 0, or the exit status for main. */
static int opts_parse(int argc, char **argv)
{
	enum { O_URL = 256, O_KEY, O_SBX, O_WORKERS, O_CLIENTS, O_SECONDS, O_OPS, O_MIGR,
	       O_PAUSE, O_CLIF, O_CLI, O_FILES, O_MAXFILE, O_TIMEOUT, O_JSON, O_MAXRATE,
	       O_SEED, O_PROGRESS, O_EXPECT, O_KEEP, O_VERBOSE, O_VERIFY, O_MIX, O_FRESH, O_HELP };
	static const struct option lo[] = {
		{ "url", 1, 0, O_URL }, { "key", 1, 0, O_KEY }, { "sandboxes", 1, 0, O_SBX },
		{ "workers", 1, 0, O_WORKERS }, { "clients", 1, 0, O_CLIENTS },
		{ "seconds", 1, 0, O_SECONDS }, { "ops", 1, 0, O_OPS },
		{ "migrators", 1, 0, O_MIGR }, { "migrate-pause-ms", 1, 0, O_PAUSE },
		{ "cli-fraction", 1, 0, O_CLIF }, { "cli", 1, 0, O_CLI },
		{ "files", 1, 0, O_FILES }, { "max-file", 1, 0, O_MAXFILE },
		{ "timeout", 1, 0, O_TIMEOUT }, { "json", 1, 0, O_JSON },
		{ "max-error-rate", 1, 0, O_MAXRATE }, { "seed", 1, 0, O_SEED },
		{ "progress", 1, 0, O_PROGRESS }, { "expect100", 0, 0, O_EXPECT },
		{ "keep", 0, 0, O_KEEP }, { "verbose", 0, 0, O_VERBOSE },
		{ "verify-seconds", 1, 0, O_VERIFY }, { "mix", 1, 0, O_MIX },
		{ "fresh-upload-connections", 0, 0, O_FRESH },
		{ "help", 0, 0, O_HELP }, { 0, 0, 0, 0 },
	};
	const char *env;
	int opt;

	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		char *end = NULL;
		errno = 0;
		switch (opt) {
		case O_URL: fmt(O.url, sizeof(O.url), "%s", optarg); break;
		case O_KEY: fmt(O.key, sizeof(O.key), "%s", optarg); break;
		case O_SBX: O.create_n = (int)strtol(optarg, &end, 10); break;
		case O_WORKERS:
			if (workers_parse(optarg) < 0) {
				fprintf(stderr, "churn: bad --workers\n");
				return 64;
			}
			break;
		case O_CLIENTS: O.clients = (int)strtol(optarg, &end, 10); break;
		case O_SECONDS: O.seconds = strtod(optarg, &end); O.max_ops = 0; break;
		case O_OPS: O.max_ops = strtoull(optarg, &end, 10); break;
		case O_MIGR: O.migrators = (int)strtol(optarg, &end, 10); break;
		case O_PAUSE: O.migrate_pause_ms = (int)strtol(optarg, &end, 10); break;
		case O_CLIF: O.cli_fraction = strtod(optarg, &end); break;
		case O_CLI: fmt(O.cli, sizeof(O.cli), "%s", optarg); break;
		case O_FILES: O.files = (int)strtol(optarg, &end, 10); break;
		case O_MAXFILE: O.max_file = strtoull(optarg, &end, 10); break;
		case O_TIMEOUT: O.timeout_s = (int)strtol(optarg, &end, 10); break;
		case O_JSON: O.json_path = optarg; break;
		case O_MAXRATE: O.max_error_rate = strtod(optarg, &end); break;
		case O_SEED: O.seed = strtoull(optarg, &end, 0); break;
		case O_PROGRESS: O.progress_s = (int)strtol(optarg, &end, 10); break;
		case O_EXPECT: O.expect100 = 1; break;
		case O_FRESH: O.upload_fresh = 1; break;
		case O_KEEP: O.keep = 1; break;
		case O_VERBOSE: O.verbose = 1; break;
		case O_VERIFY: O.verify_s = (int)strtol(optarg, &end, 10); break;
		case O_MIX: {
			int used = 0;
			if (sscanf(optarg, "%u,%u,%u,%u%n", &O.mix[0], &O.mix[1], &O.mix[2],
			           &O.mix[3], &used) != 4 || optarg[used] != '\0' ||
			    O.mix[0] + O.mix[1] + O.mix[2] + O.mix[3] == 0 ||
			    O.mix[0] + O.mix[1] + O.mix[2] + O.mix[3] > 1000000) {
				fprintf(stderr, "churn: bad --mix (E,R,W,A weights)\n");
				return 64;
			}
			break;
		}
		case O_HELP: case 'h': usage(stdout); return -1;
		default: usage(stderr); return 64;
		}
		if (errno != 0 || (end != NULL && (*end != '\0' || end == optarg))) {
			fprintf(stderr, "churn: bad value for --%s: %s\n", lo[opt - O_URL].name, optarg);
			return 64;
		}
	}
	for (int i = optind; i < argc; i++) {
		if (O.nids == MAX_SANDBOXES || strlen(argv[i]) >= sizeof(SB[0].id)) {
			fprintf(stderr, "churn: too many or too long sandbox ids\n");
			return 64;
		}
		O.ids[O.nids++] = argv[i];
	}
	if (O.nids && O.create_n) {
		fprintf(stderr, "churn: give sandbox ids or --sandboxes N, not both\n");
		return 64;
	}
	if (!O.nids && !O.create_n)
		O.create_n = 6;
	if (O.create_n < 0 || O.create_n > MAX_SANDBOXES || O.clients < 1 ||
	    O.clients > MAX_CLIENTS || O.migrators < 0 || O.migrators > MAX_MIGRATORS ||
	    O.files < 1 || O.files > 64 || O.max_file < 1024 || O.max_file > (64u << 20) ||
	    O.timeout_s < 1 || O.verify_s < 1 || O.cli_fraction < 0 || O.cli_fraction > 1 ||
	    (O.max_ops == 0 && O.seconds <= 0) || O.migrate_pause_ms < 0) {
		fprintf(stderr, "churn: an option is out of range (see --help)\n");
		return 64;
	}
	if (O.url[0] == '\0' && (env = getenv("TETHER_URL")) && *env)
		fmt(O.url, sizeof(O.url), "%s", env);
	if (O.key[0] == '\0' && (env = getenv("TETHER_API_KEY")) && *env)
		fmt(O.key, sizeof(O.key), "%s", env);
	config_file(O.url[0] == '\0', O.key[0] == '\0');
	for (size_t l = strlen(O.url); l > 0 && O.url[l - 1] == '/'; l--)
		O.url[l - 1] = '\0';
	if (O.url[0] == '\0' || O.key[0] == '\0') {
		fprintf(stderr, "churn: no edge URL or API key (--url/--key, TETHER_URL/"
		        "TETHER_API_KEY or ~/.config/tether/config)\n");
		return 64;
	}
	if (O.key[strcspn(O.key, "\r\n")] != '\0') {
		fprintf(stderr, "churn: the API key has a line break\n");
		return 64;
	}
	if (O.cli[0] == '\0')
		cli_default();
	return 0;
}

/* on_signal: SIGINT/SIGTERM end the run early (verification still runs). */
static void on_signal(int sig)
{
	got_signal = sig;
}

/* progress_line: one line on stderr while running. */
static void progress_line(double t)
{
	uint64_t ops = atomic_load(&ops_done), f = atomic_load(&ops_failed), v = 0;

	for (int i = 0; i < V_N; i++)
		v += atomic_load(&viol_count[i]);
	fprintf(stderr, "churn: %5.0f s  %" PRIu64 " ops (%.0f/s)  failed %" PRIu64
	        " (%.3f %%)  migrations %" PRIu64 " ok %" PRIu64 " failed  violations %"
	        PRIu64 "%s\n", t, ops, t > 0 ? (double)ops / t : 0, f,
	        ops ? 100.0 * (double)f / (double)ops : 0, atomic_load(&mig_ok_total),
	        atomic_load(&mig_fail_total), v,
	        atomic_load(&edge_down) ? "  EDGE NOT ANSWERING /healthz" : "");
}

int main(int argc, char **argv)
{
	struct client *cl = NULL;
	struct migrator *mg = NULL;
	struct http h;
	struct totals t;
	struct watch w;
	struct sigaction sa;
	uint64_t t0, t_run_end, next_progress;
	int rc = opts_parse(argc, argv);

	if (rc != 0)
		return rc < 0 ? 0 : rc;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESETHAND; /* a second signal ends it at once */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (O.seed == 0)
		O.seed = mix64(now_us() ^ ((uint64_t)getpid() << 32));
	RUN_ID = (uint32_t)mix64(O.seed);
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 || http_init(&h) < 0) {
		fprintf(stderr, "churn: cannot initialise libcurl\n");
		return 3;
	}
	if (O.nworkers == 0 && workers_discover(&h) < 0) {
		fprintf(stderr, "churn: cannot list the workers at %s (status %ld, %s)\n",
		        O.url, h.status, curl_easy_strerror(h.rc));
		return 3;
	}
	if (O.migrators > 0 && O.nworkers < 2) {
		fprintf(stderr, "churn: migrating needs at least 2 workers\n");
		return 3;
	}
	if (O.cli_fraction > 0 && access(O.cli, X_OK) != 0) {
		fprintf(stderr, "churn: the CLI %s is not executable (--cli, or "
		        "--cli-fraction 0)\n", O.cli);
		return 3;
	}
	if (cli_env() < 0 || sandboxes_setup(&h) < 0) {
		sandboxes_cleanup(&h);
		return 3;
	}
	fprintf(stderr, "churn: run %08x (seed %" PRIu64 "): %d clients, %zu sandboxes, "
	        "%d workers, %d migrate loop(s), ", RUN_ID, O.seed, O.clients, NSB,
	        O.nworkers, O.migrators);
	if (O.max_ops)
		fprintf(stderr, "until %" PRIu64 " operations\n", O.max_ops);
	else
		fprintf(stderr, "%.0f s\n", O.seconds);
	fprintf(stderr, "churn: sandboxes");
	for (size_t i = 0; i < NSB; i++)
		fprintf(stderr, " %s", SB[i].id);
	fprintf(stderr, "; files /workspace/churn-%08x-c<client>-*\n", RUN_ID);

	cl = calloc((size_t)O.clients, sizeof(*cl));
	mg = calloc((size_t)(O.migrators ? O.migrators : 1), sizeof(*mg));
	if (cl == NULL || mg == NULL)
		return 3;
	for (int i = 0; i < O.clients; i++) {
		struct client *c = &cl[i];
		c->id = i;
		c->rng = mix64(O.seed + 0x1000u * (uint64_t)(i + 1)) | 1;
		c->f = calloc(NSB * (size_t)O.files, sizeof(*c->f));
		c->a = calloc(NSB, sizeof(*c->a));
		c->bufcap = O.max_file + 256;
		c->buf = malloc(c->bufcap);
		c->buf2 = malloc(c->bufcap);
		c->cli_cap = O.max_file + 4096;
		c->cli_out = malloc(c->cli_cap);
		if (!c->f || !c->a || !c->buf || !c->buf2 || !c->cli_out || http_init(&c->h) < 0)
			return 3;
		for (size_t k = 0; k < NSB * (size_t)O.files; k++)
			c->f[k].next_ver = 1;
	}
	for (int i = 0; i < O.migrators; i++) {
		mg[i].id = i;
		mg[i].next = (size_t)i * NSB / (size_t)O.migrators;
		if (http_init(&mg[i].h) < 0)
			return 3;
	}

	memset(&w, 0, sizeof(w));
	if (http_init(&w.h) < 0)
		return 3;
	pthread_create(&w.th, NULL, watch_main, &w);
	t0 = run_t0 = now_us();
	if (O.verbose) {
		struct timespec rt;
		clock_gettime(CLOCK_REALTIME, &rt);
		fprintf(stderr, "churn: the run starts at %lld.%03ld (epoch s)\n",
		        (long long)rt.tv_sec, rt.tv_nsec / 1000000L);
	}
	next_progress = t0 + (uint64_t)O.progress_s * 1000000u;
	atomic_store(&clients_looping, O.clients);
	for (int i = 0; i < O.migrators; i++)
		pthread_create(&mg[i].th, NULL, migrator_main, &mg[i]);
	for (int i = 0; i < O.clients; i++)
		pthread_create(&cl[i].th, NULL, client_main, &cl[i]);
	for (;;) {
		uint64_t now = now_us();
		if (got_signal || atomic_load(&clients_looping) == 0 ||
		    (!O.max_ops && (double)(now - t0) >= O.seconds * 1e6))
			break;
		if (O.progress_s > 0 && now >= next_progress) {
			progress_line((double)(now - t0) / 1e6);
			next_progress += (uint64_t)O.progress_s * 1000000u;
		}
		sleep_ms(50);
	}
	/* stop the clients' loop and the migrations; once no migration is in
	 * flight and every sandbox runs again, the final verification */
	t_run_end = now_us();
	atomic_store(&stop_ops, 1);
	atomic_store(&stop_migrate, 1);
	for (int i = 0; i < O.migrators; i++)
		pthread_join(mg[i].th, NULL);
	while (atomic_load(&clients_looping) > 0)
		sleep_ms(10);
	uint64_t settle_end = now_us() + (uint64_t)(O.verify_s < 30 ? O.verify_s : 30) * 1000000u;
	for (size_t i = 0; i < NSB; i++)
		if (sbx_settle(&h, &SB[i], settle_end) < 0)
			fprintf(stderr, "churn: %s does not run again; its final reads will "
			        "fail\n", SB[i].id);
	verify_deadline = now_us() + (uint64_t)O.verify_s * 1000000u;
	atomic_store(&verify_go, 1);
	for (int i = 0; i < O.clients; i++)
		pthread_join(cl[i].th, NULL);
	atomic_store(&stop_watch, 1);
	pthread_join(w.th, NULL);

	memset(&t, 0, sizeof(t));
	t.w = &w;
	t.run_s = (double)(t_run_end - t0) / 1e6;
	t.total_s = (double)(now_us() - t0) / 1e6;
	totals_gather(&t, cl, mg);
	report_text(stdout, &t);
	fflush(stdout);
	rc = 0;
	if (O.json_path && report_json(O.json_path, &t) < 0)
		rc = 3;
	if (!O.keep)
		sandboxes_cleanup(&h);
	for (int i = 0; i < O.clients; i++) {
		http_free(&cl[i].h);
		free(cl[i].f);
		free(cl[i].a);
		free(cl[i].buf);
		free(cl[i].buf2);
		free(cl[i].cli_out);
	}
	for (int i = 0; i < O.migrators; i++)
		http_free(&mg[i].h);
	http_free(&h);
	http_free(&w.h);
	free(cl);
	free(mg);
	curl_global_cleanup();

	uint64_t viol = 0;
	for (int v = 0; v < V_N; v++)
		viol += atomic_load(&viol_count[v]);
	double rate = t.ops ? 100.0 * (double)t.failed / (double)t.ops : 0;
	if (viol)
		return 1;
	if (O.max_error_rate >= 0 && rate > O.max_error_rate) {
		fprintf(stderr, "churn: error rate %.6f %% is above the maximum %.6f %%\n", rate,
		        O.max_error_rate);
		return 2;
	}
	return rc;
}
