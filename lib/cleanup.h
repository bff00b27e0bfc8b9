/* Scope-bound cleanup (as in bubblewrap/systemd): a variable declared with
 * one of these is released when it leaves scope. Set it to NULL / -1 to
 * hand ownership elsewhere ("steal"). */
#ifndef TT_CLEANUP_H
#define TT_CLEANUP_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void tt_freep(void *p) { free(*(void **)p); }
static inline void tt_closep(int *fd)
{
	if (*fd >= 0)
		close(*fd);
}

static inline void tt_fclosep(FILE **f)
{
	if (*f != NULL)
		fclose(*f);
}

#define _cleanup_free_   __attribute__((cleanup(tt_freep)))
#define _cleanup_close_  __attribute__((cleanup(tt_closep)))
#define _cleanup_fclose_ __attribute__((cleanup(tt_fclosep)))

/* tt_steal_ptr: returns *pp and clears it, so cleanup no longer frees it. */
#define tt_steal_ptr(pp) ({ __typeof__(*(pp)) tt_s_ = *(pp); *(pp) = NULL; tt_s_; })
/* tt_steal_fd: returns *fdp and sets it to -1. */
#define tt_steal_fd(fdp) ({ int tt_f_ = *(fdp); *(fdp) = -1; tt_f_; })

#endif
