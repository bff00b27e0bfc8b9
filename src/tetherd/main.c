/* tetherd: one binary, one daemon role per invocation ("tetherd cp", ...).
 * Roles are linked weakly so that the binary builds while a role is being
 * written; a role that is absent says so instead of failing to link. The
 * host bridge and the signer are not roles: each is a lean binary of its
 * own (tether-bridge, tether-signer), and tetherd holds no minting code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tetherd/roles.h"

#pragma weak cp_main
#pragma weak worker_main
#pragma weak edge_main
#pragma weak node_main
#pragma weak manager_main
#pragma weak gateway_main

struct role {
	const char *name;
	int (*main)(int, char **);
	const char *help;
	int internal; /* spawned by another role, not started by hand */
};

static const struct role roles[] = {
	{ "cp", cp_main, "control plane: API, state, placement, update feed", 0 },
	{ "edge", edge_main, "client entry: auth, route cache, proxy to nodes", 0 },
	{ "node", node_main, "worker: node-api (spawns sbx-manager)", 0 },
	{ "gateway", gateway_main, "service-port gateway", 0 },
	{ "worker", worker_main, "provision a worker's credential (cp host)", 0 },
	{ "manager", manager_main, "sbx-manager (spawned by node)", 1 },
};

/* usage: lists the roles that are built into this binary. */
static int usage(FILE *out)
{
	fprintf(out, "usage: tetherd ROLE [OPTIONS]\n\nroles:\n");
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
		if (roles[i].internal || roles[i].main == NULL)
			continue;
		fprintf(out, "  %-8s %s\n", roles[i].name, roles[i].help);
	}
	return out == stderr ? 1 : 0;
}

/* proxies_drop: the daemons reach only the addresses they were given.
 * libcurl and libwebsockets both honour http_proxy and friends, even for
 * 127.0.0.1, and would hand capabilities, worker credentials and API keys to
 * whatever a shell that started the cluster happened to export. */
static void proxies_drop(void)
{
	static const char *const vars[] = { "http_proxy", "HTTP_PROXY", "https_proxy",
		                            "HTTPS_PROXY", "all_proxy", "ALL_PROXY" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

int main(int argc, char **argv)
{
	proxies_drop();
	if (argc < 2)
		return usage(stderr);
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)
		return usage(stdout);
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
		if (strcmp(argv[1], roles[i].name) != 0)
			continue;
		if (roles[i].main == NULL) {
			fprintf(stderr, "tetherd: role '%s' is not part of this build\n",
			        argv[1]);
			return 1;
		}
		return roles[i].main(argc - 1, argv + 1);
	}
	fprintf(stderr, "tetherd: unknown role '%s'\n", argv[1]);
	return usage(stderr);
}
