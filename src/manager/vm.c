/* sbx-manager: the microvm substrate's readiness on this worker: its
 * assets (kernel, initramfs with this build's tether-guest, base root,
 * layer template; src/substrate/microvm/tether-vm-assets.sh, cached in
 * /var/cache/tether/microvm or $TETHER_MICROVM_CACHE) and the probe boot
 * that decides KVM or TCG (SPEC §9). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "log.h"
#include "manager/manager_int.h"

#define VM_CACHE_DEFAULT "/var/cache/tether/microvm"

/* vm_ready: see manager_int.h. */
int vm_ready(struct manager *m, struct tt_err *err)
{
	const char *cache = getenv("TETHER_MICROVM_CACHE");
	char script[PATH_MAX];
	struct tt_err e = { 0 };

	if (m->vm_checked)
		return m->vm_ok ? 0 : tt_err_set(err, TT_ERR_INVALID, "install: substrate microvm "
		                                 "not available here: %s", m->vm_why);
	m->vm_checked = true;
	if (cache == NULL || cache[0] != '/')
		cache = VM_CACHE_DEFAULT;
	if (fsutil_sibling_bin("tether-vm-assets", script, sizeof(script), &e) < 0 ||
	    microvm_assets(cache, m->guest_bin, script, m->vm_assets, sizeof(m->vm_assets),
	                   &e) < 0 ||
	    microvm_probe(m->vm_assets, &m->vm_kvm, &e) < 0) {
		snprintf(m->vm_why, sizeof(m->vm_why), "%s", e.msg);
		log_warn("microvm substrate unavailable: %s", m->vm_why);
		return tt_err_set(err, TT_ERR_INVALID, "install: substrate microvm not available "
		                  "here: %s", m->vm_why);
	}
	m->vm_ok = true;
	log_info("microvm substrate ready: %s, assets %s", m->vm_kvm ? "KVM" :
	         "TCG (software emulation: a KVM probe boot did not finish, or no /dev/kvm)",
	         m->vm_assets);
	return 0;
}
