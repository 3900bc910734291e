#!/usr/bin/env bash
# `make package-test`: the built binaries where nothing from the source tree can help them.
#   1. the tarball, unpacked into an empty folder, run with an empty HOME and a PATH without the venv;
#   2. the .deb through dpkg: `kvasir` on the PATH, then removed, nothing left under /opt/kvasir;
#   3. the .deb in a minimal Debian (debootstrap, cached in the user cache folder), apt resolving its
#      Depends:, the self-test under chroot and every bundled library resolved by the dynamic linker there.
# Needs root for parts 2 and 3 (sudo is used when not root). PARTS="tarball deb chroot" selects parts.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
TARBALL=dist/kvasir-$VERSION-linux-x86_64.tar.gz
DEB=dist/kvasir_${VERSION}_amd64.deb
PARTS=${PARTS:-tarball deb chroot}
SUITE=${DEBIAN_SUITE:-$( . /etc/os-release 2>/dev/null; [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}" )}
SUITE=${SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/Kvasir/package-test
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
# what a fresh session has: no venv, no source tree, no Python on the PATH beyond the system's
CLEAN_ENV=(env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvasir-package-test.XXXXXX")
ROOTFS=$WORK/rootfs
cleanup() {
    for mount in dev/pts dev proc; do
        if mountpoint -q "$ROOTFS/$mount" 2>/dev/null; then $SUDO umount -l "$ROOTFS/$mount"; fi
    done
    $SUDO rm -rf "$WORK"
}
trap cleanup EXIT

say() { echo "[package-test] $*" >&2; }  # stderr: outputs captured with $(...) stay clean
timed() {  # timed NAME COMMAND...: run, then say how long it took
    local name=$1 start=$SECONDS
    shift
    "$@"
    say "$name: $((SECONDS - start)) s"
}
check_self_test() {  # the self-test's JSON line says ok and has a reply
    local output=$1
    grep -q '"ok": true' <<<"$output" || { echo "$output" >&2; say "self-test failed"; return 1; }
    say "self-test: $(grep '"ok": true' <<<"$output")"
}

part_tarball() {
    [ -f "$TARBALL" ] || { say "$TARBALL is missing: run make package"; return 1; }
    mkdir -p "$WORK/unpacked" "$WORK/home"
    tar -xzf "$TARBALL" -C "$WORK/unpacked"
    local kvasir=$WORK/unpacked/kvasir/kvasir version output
    version=$(cd "$WORK/unpacked" && "${CLEAN_ENV[@]}" HOME="$WORK/home" "$kvasir" --version)
    [ "$version" = "kvasir $VERSION" ] || { say "--version printed '$version', not 'kvasir $VERSION'"; return 1; }
    say "tarball --version: $version"
    output=$(cd "$WORK/unpacked" && "${CLEAN_ENV[@]}" HOME="$WORK/home" "$kvasir" --self-test)
    check_self_test "$output"
}

part_deb() {
    [ -f "$DEB" ] || { say "$DEB is missing: run make package"; return 1; }
    if dpkg-query -W -f='${Status}' kvasir 2>/dev/null | grep -q installed; then
        say "kvasir is already installed on this machine; part 'deb' would remove it, skipped"; return 0
    fi
    # This host keeps its own packages (--force-depends): part 'chroot' is what proves Depends:.
    $SUDO dpkg -i --force-depends "$DEB" >/dev/null
    local found output
    found=$("${CLEAN_ENV[@]}" sh -c 'command -v kvasir')
    say "deb installed: kvasir is $found"
    mkdir -p "$WORK/deb-home"
    output=$("${CLEAN_ENV[@]}" HOME="$WORK/deb-home" kvasir --self-test) || { $SUDO dpkg -r kvasir; return 1; }
    check_self_test "$output"
    $SUDO dpkg -r kvasir >/dev/null
    if [ -e /opt/kvasir ] || [ -e /usr/bin/kvasir ] || [ -e /usr/share/applications/io.github.kvasir.Kvasir.desktop ]; then
        say "dpkg -r left files behind:"; ls -la /opt/kvasir /usr/bin/kvasir 2>&1 || true; return 1
    fi
    say "deb removed: nothing left under /opt/kvasir"
}

BASE=$CACHE/debian-$SUITE-minbase
base_root() {  # a minimal Debian root, made once and kept in the user cache folder
    if [ -f "$BASE/.complete" ]; then say "base root cached in $BASE"; return; fi
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap"; $SUDO apt-get install -y -q debootstrap >/dev/null
    fi
    $SUDO rm -rf "$BASE.tmp"
    mkdir -p "$CACHE"
    say "debootstrap --variant=minbase $SUITE $MIRROR (once; cached in $BASE)"
    $SUDO debootstrap --variant=minbase "$SUITE" "$BASE.tmp" "$MIRROR" >/dev/null
    $SUDO rm -rf "$BASE" && $SUDO mv "$BASE.tmp" "$BASE" && $SUDO touch "$BASE/.complete"
}

part_chroot() {
    [ -f "$DEB" ] || { say "$DEB is missing: run make package"; return 1; }
    timed "debian base root" base_root
    timed "copy of the base root" $SUDO cp -a "$BASE" "$ROOTFS"
    $SUDO mount -t proc proc "$ROOTFS/proc"
    $SUDO mount --bind /dev "$ROOTFS/dev"
    $SUDO mount --bind /dev/pts "$ROOTFS/dev/pts"
    $SUDO cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
    $SUDO cp "$DEB" "$ROOTFS/tmp/kvasir.deb"
    local in_root=($SUDO chroot "$ROOTFS" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
    timed "apt-get update in the root" "${in_root[@]}" apt-get update -q >/dev/null
    timed "apt-get install kvasir.deb (Depends: resolved by apt)" \
        "${in_root[@]}" apt-get install -y -q --no-install-recommends /tmp/kvasir.deb >/dev/null
    # every library the bundle's files need resolves there: the X11 plugin too, which offscreen never loads
    local unresolved
    # (with the library path the bootloader sets, as kvasir runs them)
    unresolved=$("${in_root[@]}" LD_LIBRARY_PATH=/opt/kvasir/_internal sh -c \
        'find /opt/kvasir -name "*.so*" -type f -exec ldd {} + 2>/dev/null | grep "not found" | sort -u' || true)
    if [ -n "$unresolved" ]; then say "libraries missing in a fresh Debian with the Depends: installed:"; echo "$unresolved"; return 1; fi
    say "every bundled library resolves in the fresh root"
    local output
    output=$(timed "self-test in the fresh root" "${in_root[@]}" HOME=/tmp/home QT_QPA_PLATFORM=offscreen kvasir --self-test)
    check_self_test "$output"
    "${in_root[@]}" dpkg -r kvasir >/dev/null
    [ ! -e "$ROOTFS/opt/kvasir" ] || { say "dpkg -r left /opt/kvasir behind in the root"; return 1; }
}

total=$SECONDS
for part in $PARTS; do
    timed "part $part" "part_$part"
done
say "all parts passed in $((SECONDS - total)) s"
