#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Packaging: configure a separate build of the source tree with --prefix /usr (no tests, no
# bench), `meson install --destdir`, and check that everything a package ships is there (daemon,
# tpipctl, library and its .pc, header, units, sysusers/tmpfiles snippets, man pages, example
# config, the example program's source). Then build example_client.c and the installed demo.c
# with the flags of the installed libtpclient.pc (through
# PKG_CONFIG_SYSROOT_DIR, so they point into the destdir) and run it, linked against the
# installed library, through the installed tpipd.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_SOURCE_ROOT
need_tool meson
need_tool ninja
need_tool pkg-config
need_tool cc "to build the example client"
svc_init

src=$TPIPD_SOURCE_ROOT
build=$SVC_TMP/build
dest=$SVC_TMP/dest

say "meson setup --prefix /usr -Dtests=false -Dbench=false $build"
meson setup --prefix /usr -Dtests=false -Dbench=false "$build" "$src" >"$SVC_TMP/setup.log" 2>&1 ||
	{ tail -n 40 "$SVC_TMP/setup.log"; fail "meson setup failed"; }
say "ninja -C $build"
ninja -C "$build" >"$SVC_TMP/build.log" 2>&1 || { tail -n 40 "$SVC_TMP/build.log"; fail "build failed"; }
say "meson install -C $build --destdir $dest"
meson install -C "$build" --destdir "$dest" >"$SVC_TMP/install.log" 2>&1 ||
	{ tail -n 40 "$SVC_TMP/install.log"; fail "meson install failed"; }
(cd "$dest" && find . \( -type f -o -type l \) | sort | sed "s|^\./|$SVC_NAME:   |")

# one GLOB...: exactly the first existing match of the globs (relative to $dest), or fail.
one() {
	local what=$1 g f
	shift
	for g in "$@"; do
		for f in $dest/$g; do
			[ -e "$f" ] && { echo "$f"; return 0; }
		done
	done
	fail "$what not installed (looked for: $*)"
}

check "binaries: usr/sbin/tpipd, usr/bin/tpipctl"
tpipd=$(one tpipd usr/sbin/tpipd)
tpipctl=$(one tpipctl usr/bin/tpipctl)
[ -x "$tpipd" ] || fail "$tpipd is not executable"
[ -x "$tpipctl" ] || fail "$tpipctl is not executable"

check "library, header and .pc"
lib=$(one libtpclient.so.0 'usr/lib/*/libtpclient.so.0' usr/lib/libtpclient.so.0 'usr/lib64/libtpclient.so.0')
libdir=$(dirname "$lib")
one "libtpclient.so.0.x.y" "${libdir#"$dest"/}/libtpclient.so.0.*" >/dev/null
one "libtpclient.so (dev link)" "${libdir#"$dest"/}/libtpclient.so" >/dev/null
one tpclient.h usr/include/tpclient.h >/dev/null
pc=$(one libtpclient.pc "${libdir#"$dest"/}/pkgconfig/libtpclient.pc" 'usr/*/pkgconfig/libtpclient.pc')
check "the library exports only tp_* symbols"
if command -v nm >/dev/null; then
	bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBRVW]/ && $3 !~ /^tp_/ { print $3 }')
	[ -z "$bad" ] || fail "libtpclient exports non-tp_ symbols: $bad"
else
	say "  nm is not installed: not checked"
fi

check "systemd units, sysusers and tmpfiles snippets"
service=$(one tpipd.service lib/systemd/system/tpipd.service usr/lib/systemd/system/tpipd.service)
one tpipd.socket lib/systemd/system/tpipd.socket usr/lib/systemd/system/tpipd.socket >/dev/null
sysusers=$(one sysusers.d/tpipd.conf usr/lib/sysusers.d/tpipd.conf lib/sysusers.d/tpipd.conf)
tmpfiles=$(one tmpfiles.d/tpipd.conf usr/lib/tmpfiles.d/tpipd.conf lib/tmpfiles.d/tpipd.conf)
grep -q '^u tpipd' "$sysusers" || fail "the sysusers snippet does not create the tpipd user"
grep -q '^d /etc/tpipd' "$tmpfiles" || fail "the tmpfiles snippet does not create /etc/tpipd"
! grep -q '^[dD] /run/tpipd' "$tmpfiles" ||
	fail "the tmpfiles snippet duplicates the service's RuntimeDirectory=tpipd"
check "the installed tpipd.service runs ExecStart=/usr/sbin/tpipd"
grep -qx 'ExecStart=/usr/sbin/tpipd' "$service" || { grep -n Exec "$service"; fail "wrong ExecStart"; }
! grep -n '@[a-z]*@' "$service" || fail "unsubstituted placeholder in the installed unit"
grep -q '/etc/tpipd/tpipd.conf' "$service" || fail "the unit does not name /etc/tpipd/tpipd.conf"
check "the installed tpipd reads /etc/tpipd/tpipd.conf by default"
"$tpipd" --help | grep -q '/etc/tpipd/tpipd.conf' || fail "tpipd --help does not name /etc/tpipd/tpipd.conf"

check "man pages tpipd(8), tpipctl(1), libtpclient(3), tpipd.conf(5)"
if command -v scdoc >/dev/null; then
	for page in man8/tpipd.8 man1/tpipctl.1 man3/libtpclient.3 man5/tpipd.conf.5; do
		one "$page" "usr/share/man/$page" "usr/share/man/$page.gz" >/dev/null
	done
else
	say "  scdoc is not installed, so the build has no man pages: not checked"
fi
check "the example config under usr/share/doc/tpipd"
one tpipd.conf.example usr/share/doc/tpipd/tpipd.conf.example 'usr/share/doc/tpipd/tpipd.conf.example*' >/dev/null

check "the example program libtpclient(3) names: usr/share/doc/tpipd/examples/demo.c"
demo_src=$(one examples/demo.c usr/share/doc/tpipd/examples/demo.c)

check "cc example_client.c with pkg-config --cflags --libs libtpclient (sysroot $dest)"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs libtpclient) || fail "pkg-config libtpclient failed"
say "  flags: $flags"
case " $flags " in *" -I$dest/usr/include "*) ;; *) fail "--cflags do not point into $dest" ;; esac
case " $flags " in *" -L$libdir "*) ;; *) fail "--libs do not point into $libdir" ;; esac
# shellcheck disable=SC2086
cc -Wall -Wextra -Wno-unused-parameter -Werror -o "$SVC_TMP/example_client" \
	"$(dirname "$0")/example_client.c" $flags >"$SVC_TMP/cc.log" 2>&1 ||
	{ cat "$SVC_TMP/cc.log"; fail "the example does not build against the installed tree"; }
check "cc the installed examples/demo.c the same way"
# shellcheck disable=SC2086
cc -Wall -Wextra -Werror -o "$SVC_TMP/demo" "$demo_src" $flags >"$SVC_TMP/cc.log" 2>&1 ||
	{ cat "$SVC_TMP/cc.log"; fail "the installed demo.c does not build against the tree"; }
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
LD_LIBRARY_PATH=$libdir ldd "$SVC_TMP/example_client" | grep -q "$libdir/libtpclient.so.0" ||
	fail "the example does not load the installed libtpclient"

check "the installed tpipd serves the example linked against the installed library"
TPIPD_BIN=$tpipd TPIPCTL_BIN=$tpipctl
: >"$SVC_TMP/empty.conf"
svc_start_daemon "$SVC_TMP/tpipd.sock" "$SVC_TMP/tpipd.log" --config "$SVC_TMP/empty.conf"
LD_LIBRARY_PATH=$libdir "$SVC_TMP/example_client" "$SVC_TMP/tpipd.sock" >"$SVC_TMP/client.out" 2>&1 ||
	{ cat "$SVC_TMP/client.out"; fail "example_client failed"; }
say "  $(cat "$SVC_TMP/client.out")"
ctl --socket "$SVC_TMP/tpipd.sock" --json status | grep -q '"messages_moved": [1-9]' ||
	fail "the installed tpipctl does not report the message"
svc_stop_daemon "$SVC_DAEMON_PID"
say "ok"
