/* Fuzzes the QMP line decoder the sbx-manager runs on what QEMU sends
 * (src/substrate/microvm/qmp.c): any bytes; what decodes is an object. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "substrate/microvm/qmp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *o = qmp_parse_line((const char *)data, size, NULL);

	if (o != NULL && !json_is_object(o))
		abort();
	json_decref(o);
	return 0;
}
