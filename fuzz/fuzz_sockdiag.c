/* Fuzzes the sock_diag reply parser (lib/sockdiag.c): the input's first 8
 * bytes are the file the bridge looks for (kdev, vfs_ino, little-endian),
 * the rest is what recvmsg on the NETLINK_SOCK_DIAG socket returned (one
 * buffer, copied to nlmsghdr alignment as the kernel delivers it), parsed
 * with and without reading to the dump's end. A match must be that file,
 * listening, with a NUL-terminated name. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sockdiag.h"

#define DIAG_SEQ 0x7e7e /* as lib/sockdiag.c tags its dumps */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* LLVMFuzzerTestOneInput: one reply buffer. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint32_t buf[8192]; /* 32 KiB, like the receive buffer */
	struct unix_listener_info info;
	uint32_t kdev, ino;
	size_t n;

	if (size < 8)
		return 0;
	memcpy(&kdev, data, 4);
	memcpy(&ino, data + 4, 4);
	n = size - 8 > sizeof(buf) ? sizeof(buf) : size - 8;
	memcpy(buf, data + 8, n);
	for (int to_end = 0; to_end < 2; to_end++) {
		struct tt_err err = { 0 };
		bool found = false;
		int rc;

		memset(&info, 0xa5, sizeof(info));
		rc = sockdiag_reply_parse(buf, n, DIAG_SEQ, to_end, kdev, ino, &info,
		                          &found, &err);
		if (rc < -1 || rc > 1 || (rc == 1 && !found) || (rc < 0 && err.code == TT_OK))
			abort();
		if (found && (info.vfs_dev != kdev || info.vfs_ino != ino ||
		              info.state != 10 ||
		              memchr(info.name, '\0', sizeof(info.name)) == NULL))
			abort();
	}
	return 0;
}
