#!/bin/sh
# Builds (once, cached) what a tether microVM boots: Debian's cloud kernel,
# an initramfs with tether-guest as /init and the virtio modules it loads
# in order, the `base` root image and a formatted writable-layer template.
#
# usage: tether-vm-assets OUT GUEST_BIN LAYER_MB
#   OUT        the asset dir for this guest binary (the manager names it
#              <cache>/<hash of the guest>); shared pieces go to OUT/..
#   GUEST_BIN  the static tether-guest
#   LAYER_MB   size of each sandbox's writable layer
# Prints nothing on success; OUT then holds vmlinuz, initrd.gz, root.img
# and layer-<MB>.qcow2. Idempotent and safe to run concurrently (flock).
#
# The `base` root is the host's Essential packages (their files under
# /usr, /bin, /lib, /sbin, /etc) plus the shared libraries their programs
# load: the ns substrate's base binds the whole host /usr, which is 9 GB
# here, too large to copy into an image on a fresh machine. The template
# store replaces this (a template's tree goes through mkroot below).
set -eu
OUT=$1
GUEST=$2
LAYER_MB=$3
CACHE=$(dirname "$OUT")
mkdir -p "$OUT"
exec 9>"$CACHE/.lock"
flock 9

# ---- the kernel: Debian's cloud kernel, extracted, never installed ----
KPKG=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
	sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1)
if [ -z "$KPKG" ]; then
	# no package index: use a kernel extracted earlier, if any
	KDIR=$(ls -d "$CACHE"/kernel-* 2>/dev/null | tail -n1 || true)
	[ -n "$KDIR" ] || { echo "tether-vm-assets: no linux-image-cloud-amd64 in apt (apt-get update?)" >&2; exit 1; }
else
	KDIR="$CACHE/kernel-${KPKG#linux-image-}"
fi
if [ ! -f "$KDIR/vmlinuz" ]; then
	T=$(mktemp -d "$CACHE/.k.XXXXXX")
	(cd "$T" && apt-get download "$KPKG" >/dev/null 2>&1) ||
		{ rm -rf "$T"; echo "tether-vm-assets: apt-get download $KPKG failed" >&2; exit 1; }
	dpkg-deb -x "$T"/*.deb "$T/x"
	mkdir -p "$T/k/modules"
	cp "$T"/x/boot/vmlinuz-* "$T/k/vmlinuz"
	M=$(ls -d "$T"/x/lib/modules/*/kernel)
	# the order the guest loads them in (each after what it needs)
	for m in drivers/virtio/virtio_ring drivers/virtio/virtio \
		drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci_legacy_dev \
		drivers/virtio/virtio_pci drivers/virtio/virtio_mmio \
		drivers/block/virtio_blk drivers/char/virtio_console \
		net/vmw_vsock/vsock net/vmw_vsock/vmw_vsock_virtio_transport_common \
		net/vmw_vsock/vmw_vsock_virtio_transport; do
		[ -f "$M/$m.ko" ] || continue
		cp "$M/$m.ko" "$T/k/modules/"
		basename "$m.ko" >>"$T/k/modules/order"
	done
	rm -rf "$KDIR"
	mv "$T/k" "$KDIR"
	rm -rf "$T"
fi

# ---- the initramfs: tether-guest as /init, the modules ----
if [ ! -f "$OUT/initrd.gz" ] || [ "$GUEST" -nt "$OUT/initrd.gz" ]; then
	T=$(mktemp -d "$CACHE/.i.XXXXXX")
	mkdir -p "$T/r/dev" "$T/r/proc" "$T/r/sys" "$T/r/newroot" "$T/r/lib/tether-modules"
	cp "$GUEST" "$T/r/init"
	chmod 0755 "$T/r/init"
	cp "$KDIR"/modules/* "$T/r/lib/tether-modules/"
	(cd "$T/r" && find . | cpio -o -H newc --quiet | gzip -1 >"$T/initrd.gz")
	mv "$T/initrd.gz" "$OUT/initrd.gz"
	rm -rf "$T"
fi
ln -sf "$KDIR/vmlinuz" "$OUT/vmlinuz"

# ---- the base root image ----
KEY=$(dpkg-query -W -f='${Package} ${Version}\n' | md5sum | cut -c1-12)
ROOT="$CACHE/root-base-$KEY.img"
if [ ! -f "$ROOT" ]; then
	T=$(mktemp -d "$CACHE/.r.XXXXXX")
	S="$T/tree"
	mkdir -p "$S"
	PK=$(dpkg-query -W -f='${Package} ${Essential} ${Priority}\n' |
		awk '$2=="yes"||$3=="required"{print $1}')
	# shellcheck disable=SC2086
	dpkg -L $PK 2>/dev/null | grep -E '^/(usr|bin|sbin|lib|lib64|etc)/' | sort -u >"$T/files"
	# the dynamic loader and every library their programs load
	for f in $(cat "$T/files"); do [ -f "$f" ] && [ -x "$f" ] && echo "$f"; done |
		xargs -r ldd 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^\t\(\/[^ ]*\) .*/\1/p' |
		sort -u >>"$T/files"
	# merged /usr: the top-level names are symlinks, as on the host, and
	# what packages list under them is copied under /usr
	for d in bin sbin lib lib64; do
		[ -L "/$d" ] && ln -s "usr/$d" "$S/$d"
	done
	[ -L /bin ] && sed -i 's#^/bin/#/usr/bin/#; s#^/sbin/#/usr/sbin/#; s#^/lib/#/usr/lib/#; s#^/lib64/#/usr/lib64/#' "$T/files"
	# each name once, with the target of every symlink among them
	sort -u "$T/files" | while read -r f; do
		[ -e "$f" ] || continue
		[ -d "$f" ] && [ ! -L "$f" ] && continue
		echo "$f"
		[ -L "$f" ] && readlink -f "$f"
	done | sed 's#^/bin/#/usr/bin/#; s#^/sbin/#/usr/sbin/#; s#^/lib/#/usr/lib/#; s#^/lib64/#/usr/lib64/#' |
		sort -u | cpio -pdm --quiet "$S" 2>/dev/null || true
	mkdir -p "$S/etc" "$S/home" "$S/tmp" "$S/workspace" "$S/run" "$S/dev" \
		"$S/proc" "$S/sys" "$S/.layer" "$S/root" "$S/var/tmp"
	printf 'root:x:0:0:root:/home:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$S/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$S/etc/group"
	printf 'sandbox\n' >"$S/etc/hostname"
	printf '127.0.0.1 localhost sandbox\n::1 localhost\n' >"$S/etc/hosts"
	[ -d /etc/alternatives ] && cp -a /etc/alternatives "$S/etc/" 2>/dev/null || true
	SZ=$(du -sm "$S" | cut -f1)
	truncate -s $((SZ + SZ / 4 + 64))M "$T/root.img"
	mkfs.ext4 -q -F -L tether-root -O ^has_journal -E root_owner=0:0 -d "$S" "$T/root.img"
	mv "$T/root.img" "$ROOT"
	rm -rf "$T"
fi
ln -sf "$ROOT" "$OUT/root.img"

# ---- the writable layer's template: ext4, as a compact qcow2 ----
LT="$CACHE/layer-$LAYER_MB.qcow2"
if [ ! -f "$LT" ]; then
	T=$(mktemp -d "$CACHE/.l.XXXXXX")
	mkdir -p "$T/t/home" "$T/t/tmp" "$T/t/workspace"
	chmod 1777 "$T/t/tmp"
	truncate -s "${LAYER_MB}M" "$T/layer.raw"
	mkfs.ext4 -q -F -L tether-layer -E root_owner=0:0 -d "$T/t" "$T/layer.raw"
	qemu-img convert -f raw -O qcow2 "$T/layer.raw" "$T/layer.qcow2"
	mv "$T/layer.qcow2" "$LT"
	rm -rf "$T"
fi
ln -sf "$LT" "$OUT/layer.qcow2"
touch "$OUT/ready"
