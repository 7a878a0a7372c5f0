#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# systemd-analyze verify accepts tpipd.service (generated from tpipd.service.in the way meson does,
# with ExecStart pointing at the built tpipd) and tpipd.socket, with no complaint about either; the
# sysusers snippet creates the unit's User= in its Group= and no group nothing uses; tmpfiles does
# not duplicate RuntimeDirectory=; and, so that a silent verifier cannot pass this test, it does
# complain about a copy of the service with a broken ExecStart.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPD_UNITS
need_tool systemd-analyze
svc_init

sbindir=$(dirname "$TPIPD_BIN")
units=$SVC_TMP/units
mkdir "$units"
sed -e "s|@sbindir@|$sbindir|g" -e "s|@sysconfdir@|/etc|g" "$TPIPD_UNITS/tpipd.service.in" \
	>"$units/tpipd.service"
cp "$TPIPD_UNITS/tpipd.socket" "$units/"

check "the generated unit has no @placeholders@ left"
! grep -n '@[a-z]*@' "$units/tpipd.service" || fail "unsubstituted placeholder in tpipd.service"
check "ExecStart is the built tpipd ($TPIPD_BIN)"
grep -qx "ExecStart=$TPIPD_BIN" "$units/tpipd.service" || fail "ExecStart is not $TPIPD_BIN"

# verify looks up Requires=/Also= units next to the ones named, so run it in the unit dir.
verify() {
	(cd "$units" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no "$@") \
		>"$SVC_TMP/verify.out" 2>&1
}

for unit in tpipd.service tpipd.socket; do
	check "systemd-analyze verify --man=no $unit exits 0 without complaints"
	verify "$units/$unit"
	rc=$?
	SVC_LOGS+=("$SVC_TMP/verify.out")
	if [ "$rc" -ne 0 ] || grep -q 'tpipd\.\(service\|socket\)' "$SVC_TMP/verify.out"; then
		cat "$SVC_TMP/verify.out"
		fail "systemd-analyze verify $unit: exit status $rc"
	fi
done

# The sysusers snippet, applied to an empty root: it makes the unit's User= with the unit's
# Group= as its primary group, the socket's SocketGroup=, and no other group.
if command -v systemd-sysusers >/dev/null; then
	check "sysusers creates exactly the user and groups the units name"
	user=$(sed -n 's/^User=//p' "$units/tpipd.service")
	group=$(sed -n 's/^Group=//p' "$units/tpipd.service")
	sgroup=$(sed -n 's/^SocketGroup=//p' "$units/tpipd.socket")
	mkdir -p "$SVC_TMP/root/etc"
	systemd-sysusers --root="$SVC_TMP/root" "$TPIPD_UNITS/tpipd.sysusers" \
		>"$SVC_TMP/sysusers.out" 2>&1 ||
		{ cat "$SVC_TMP/sysusers.out"; fail "systemd-sysusers failed on tpipd.sysusers"; }
	gid=$(awk -F: -v u="$user" '$1 == u { print $4 }' "$SVC_TMP/root/etc/passwd")
	primary=$(awk -F: -v g="$gid" '$3 == g { print $1 }' "$SVC_TMP/root/etc/group")
	if [ -z "$gid" ] || [ "$primary" != "$group" ]; then
		fail "user $user (gid '$gid', group '$primary') is not in Group=$group"
	fi
	groups=$(cut -d: -f1 "$SVC_TMP/root/etc/group" | sort -u | tr '\n' ' ')
	want=$(printf '%s\n' "$group" "$sgroup" | sort -u | tr '\n' ' ')
	[ "$groups" = "$want" ] ||
		fail "sysusers creates the groups '$groups', the units use '$want'"
else
	say "  systemd-sysusers is not installed: the sysusers snippet is not checked"
fi

check "tmpfiles does not duplicate RuntimeDirectory="
rdir=$(sed -n 's/^RuntimeDirectory=//p' "$units/tpipd.service")
[ -n "$rdir" ] || fail "tpipd.service has no RuntimeDirectory="
! grep -q "^[dD] /run/${rdir}[ /]" "$TPIPD_UNITS/tpipd.tmpfiles" ||
	fail "tpipd.tmpfiles creates /run/$rdir, which RuntimeDirectory=$rdir already does"

check "the verifier notices an ExecStart that does not exist (so the checks above mean something)"
sed -i "s|^ExecStart=.*|ExecStart=/nonexistent/tpipd|" "$units/tpipd.service"
verify "$units/tpipd.service"
rc=$?
if [ "$rc" -eq 0 ] && ! grep -q 'tpipd\.service' "$SVC_TMP/verify.out"; then
	fail "systemd-analyze verify accepted a broken unit; it checks nothing here"
fi
say "ok"
