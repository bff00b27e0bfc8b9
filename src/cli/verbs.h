/* Verbs of the tether CLI. Each returns the process exit status: 0 success,
 * 1 usage or operational error (one line on stderr), or for exec the
 * sandbox command's own status. argv[0] is the verb. */
#ifndef TT_CLI_VERBS_H
#define TT_CLI_VERBS_H

int cli_cap(int argc, char **argv);     /* cap inspect TOKEN, else cli_cap_issue */
int cli_cap_issue(int argc, char **argv); /* cap ID ...: asks the edge */
int cli_up(int argc, char **argv);
int cli_create(int argc, char **argv);
int cli_ls(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_workers(int argc, char **argv);
int cli_exec(int argc, char **argv);
int cli_cp(int argc, char **argv);
int cli_rm(int argc, char **argv);
int cli_pause(int argc, char **argv);
int cli_resume(int argc, char **argv);
int cli_migrate(int argc, char **argv);
int cli_shell(int argc, char **argv);
int cli_watch(int argc, char **argv);
int cli_expose(int argc, char **argv);
int cli_keys(int argc, char **argv);
int cli_admin(int argc, char **argv);
int cli_logs(int argc, char **argv);   /* the cluster's log files */  /* admin rotate-keys | admin keys */

#endif
