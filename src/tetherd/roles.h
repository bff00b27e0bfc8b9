/* Entry points of the tetherd roles. Each lives in its own folder under src/
 * and returns an exit status; main.c only dispatches. */
#ifndef TT_ROLES_H
#define TT_ROLES_H

int cp_main(int argc, char **argv);      /* src/cp: control plane */
int worker_main(int argc, char **argv);  /* src/cp/workers.c: provisioning */
int edge_main(int argc, char **argv);    /* src/edge */
int node_main(int argc, char **argv);    /* src/node: node-api */
int manager_main(int argc, char **argv); /* src/manager: sbx-manager, spawned by node */
int gateway_main(int argc, char **argv); /* src/gateway */

#endif
