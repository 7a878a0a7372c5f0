#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Configuration errors: every bad file makes `tpipd --check-config` and a plain start exit 2 with
# "FILE:LINE: reason" on stderr (a plain start must not create its socket); a missing --config
# file and a bad flag value exit 2 too. The example config with every key uncommented passes,
# names every option that --check-config prints, and flags win over the file.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPD_UNITS
need_tool timeout "bounds each tpipd run"
svc_init

conf=$SVC_TMP/tpipd.conf
sock=$SVC_TMP/never.sock
long=/$(printf 'x%.0s' $(seq 1 120))

# name | file content (printf format) | line | reason (grep -E pattern)
cases=(
	"unknown key|[daemon]\nbogus = 1\n|2|unknown key 'bogus' in section \[daemon\]"
	"key in the wrong section|[daemon]\nframe-max = 4M\n|2|key 'frame-max' belongs in section \[limits\], not \[daemon\]"
	"unknown key in an unknown section|[nosuch]\nfoo = 1\n|2|unknown key 'foo' in section \[nosuch\]"
	"known key in an unknown section|[limits]\nsessions-max = 8\n[nosuch]\nframe-max = 4M\n|4|key 'frame-max' belongs in section \[limits\], not \[nosuch\]"
	"key before any section|frame-max = 4M\n|1|key 'frame-max' before any \[section\]"
	"syntax error before a bad key|this is not ini\n[daemon]\nbogus = 1\n|1|syntax error"
	"unterminated section before a key|[limits\nframe-max = 4M\n|1|syntax error"
	"bad key before a syntax error|[daemon]\nbogus = 1\nthis is not ini\n|2|unknown key 'bogus'"
	"bad number|[daemon]\ncopy-threads = two\n|2|copy-threads: 'two' is not a number in \[1, 64\]"
	"negative number|[daemon]\ncopy-threads = -1\n|2|copy-threads: '-1' is not a number"
	"number below the range|[daemon]\ncopy-threads = 0\n|2|copy-threads: '0' is not a number in \[1, 64\]"
	"number above the range|[daemon]\ncopy-threads = 65\n|2|copy-threads: '65' is not a number in \[1, 64\]"
	"size below the range|[limits]\nframe-max = 4095\n|2|frame-max: '4095' is not a size in \[4096, 67108864\]"
	"size above the range|[limits]\nframe-max = 65M\n|2|frame-max: '65M' is not a size in \[4096, 67108864\]"
	"number that overflows|[limits]\nmessage-bytes-max = 99999999999999999999999\n|2|message-bytes-max: '9+' is not a size"
	"bad size suffix|[limits]\n# a comment\nframe-max = 4Q\n|3|frame-max: '4Q' is not a size"
	"size suffix on a count|[limits]\nsessions-max = 1K\n|2|sessions-max: '1K' is not a number"
	"bad log level|[daemon]\nlog-level = loud\n|2|log-level: unknown level 'loud'"
	"bad boolean for cma|[backends]\ncma = maybe\n|2|cma: 'maybe' is not yes or no"
	"syntax error line|[daemon]\nlog-level = info\nthis is not ini\n|3|syntax error"
	"unterminated section|[limits\n|1|syntax error"
	"value too long for socket|[daemon]\nsocket = ${long}${long}\n|2|socket: value longer than 107 bytes"
	"empty value|[daemon]\ncopy-threads =\n|2|copy-threads: '' is not a number"
	"peer listen address without a port|[peer]\nlisten = nonsense\n|2|peer-listen: 'nonsense' is not ADDR:PORT"
	"peer listen port above 65535|[peer]\nlisten = 127.0.0.1:65536\n|2|peer-listen: '127.0.0.1:65536' is not ADDR:PORT"
	"peer listen bad host|[peer]\nlisten = 300.1.1.1:7420\n|2|peer-listen: '300.1.1.1:7420' is not ADDR:PORT"
	"metrics on a non-loopback address|[daemon]\nmetrics-listen = 0.0.0.0:1\n|2|metrics-listen: '0.0.0.0:1' is not a loopback ADDR:PORT .*set metrics-allow-remote = yes in \[daemon\] or --metrics-allow-remote"
	"metrics on a non-loopback address, remote access said no|[daemon]\nmetrics-allow-remote = no\nmetrics-listen = 192.0.2.1:9470\n|3|metrics-listen: '192.0.2.1:9470' is not a loopback ADDR:PORT"
	"metrics on port 0|[daemon]\nmetrics-listen = 127.0.0.1:0\n|2|metrics-listen: '127.0.0.1:0' is not ADDR:PORT"
	"metrics without a port|[daemon]\nmetrics-listen = localhost\n|2|metrics-listen: 'localhost' is not ADDR:PORT"
	"metrics on a host name, remote access allowed|[daemon]\nmetrics-allow-remote = yes\nmetrics-listen = example.org:9470\n|3|metrics-listen: 'example.org:9470' is not ADDR:PORT"
	"peer host name with a space|[peer]\nhost-name = a b\n|2|peer-host-name: 'a b' is not a host name"
	"peer host name with a slash|[peer]\nhost-name = a/b\n|2|peer-host-name: 'a/b' is not a host name"
	"no channel share for peers|[limits]\nchan-remote-create-per-peer = 0\n|2|chan-remote-create-per-peer: '0' is not a number in \\[1, 65536\\]"
	"bad boolean for metrics-allow-remote|[daemon]\nmetrics-allow-remote = maybe\n|2|metrics-allow-remote: 'maybe' is not yes or no"
)

# expect_exit2 WHAT PATTERN CMD...: CMD must exit 2 and print PATTERN (grep -E) on stderr.
expect_exit2() {
	local what=$1 pattern=$2 rc
	shift 2
	timeout 10 "$@" >"$SVC_TMP/out" 2>"$SVC_TMP/err"
	rc=$?
	if [ "$rc" -ne 2 ]; then
		cat "$SVC_TMP/out" "$SVC_TMP/err"
		fail "$what: exit status $rc, expected 2"
	fi
	if ! grep -qE -- "$pattern" "$SVC_TMP/err"; then
		cat "$SVC_TMP/err"
		fail "$what: stderr does not match: $pattern"
	fi
	say "  $(head -n 1 "$SVC_TMP/err")"
}

for c in "${cases[@]}"; do
	IFS='|' read -r name content line reason <<<"$c"
	# shellcheck disable=SC2059 # the case table holds printf formats
	printf "$content" >"$conf"
	check "$name: --check-config exits 2 with $conf:$line: and the reason"
	expect_exit2 "$name (--check-config)" "^tpipd: $conf:$line: $reason" \
		"$TPIPD_BIN" --config "$conf" --check-config
	check "$name: a plain start exits 2 the same way and binds nothing"
	expect_exit2 "$name (start)" "^tpipd: $conf:$line: $reason" \
		"$TPIPD_BIN" --config "$conf" --socket "$sock" --peer-listen off
	[ ! -e "$sock" ] || fail "$name: a plain start created $sock"
done

check "a missing --config file: exit 2 naming the file"
expect_exit2 "missing --config" "^tpipd: $SVC_TMP/missing.conf: No such file or directory" \
	"$TPIPD_BIN" --config "$SVC_TMP/missing.conf" --check-config
expect_exit2 "missing --config (start)" "^tpipd: $SVC_TMP/missing.conf: " \
	"$TPIPD_BIN" --config "$SVC_TMP/missing.conf" --socket "$sock" --peer-listen off

: >"$conf"
check "a bad flag value (--frame-max 1): exit 2 naming the flag"
expect_exit2 "--frame-max 1" "^tpipd: --frame-max: '1' is not a size in \[4096, 67108864\]" \
	"$TPIPD_BIN" --config "$conf" --frame-max 1 --check-config
expect_exit2 "--frame-max 1 (start)" "^tpipd: --frame-max: '1' is not a size" \
	"$TPIPD_BIN" --config "$conf" --frame-max 1 --socket "$sock" --peer-listen off
check "bad address flags (--peer-listen nonsense, --metrics-listen 0.0.0.0:1): exit 2"
expect_exit2 "--peer-listen nonsense" "^tpipd: --peer-listen: 'nonsense' is not ADDR:PORT" \
	"$TPIPD_BIN" --config "$conf" --peer-listen nonsense --check-config
expect_exit2 "--peer-listen nonsense (start)" "^tpipd: --peer-listen: 'nonsense' is not" \
	"$TPIPD_BIN" --config "$conf" --peer-listen nonsense --socket "$sock"
expect_exit2 "--metrics-listen 0.0.0.0:1" \
	"^tpipd: --metrics-listen: '0.0.0.0:1' is not a loopback ADDR:PORT" \
	"$TPIPD_BIN" --config "$conf" --metrics-listen 0.0.0.0:1 --check-config
expect_exit2 "--metrics-listen 0.0.0.0:1 (start)" "^tpipd: --metrics-listen: '0.0.0.0:1' is not" \
	"$TPIPD_BIN" --config "$conf" --metrics-listen 0.0.0.0:1 --socket "$sock" --peer-listen off
check "good addresses pass: --peer-listen [::1]:0, *:7420, off; --metrics-listen [::1]:9470;" \
	"other hosts' addresses with --metrics-allow-remote (before or after the address)"
for a in "--peer-listen [::1]:0" "--peer-listen *:7420" "--peer-listen off" \
	"--metrics-listen [::1]:9470" "--metrics-listen localhost:9470" \
	"--metrics-listen 0.0.0.0:9470 --metrics-allow-remote" \
	"--metrics-allow-remote --metrics-listen [::]:9470" \
	"--metrics-allow-remote --metrics-listen 127.0.0.1:9470"; do
	# shellcheck disable=SC2086 # flag and value
	"$TPIPD_BIN" --config "$conf" $a --check-config >/dev/null 2>"$SVC_TMP/err" ||
		{ cat "$SVC_TMP/err"; fail "$a is rejected"; }
done
check "metrics-allow-remote from the file or a flag, in any order, lets the file's address pass"
printf '[daemon]\nmetrics-listen = 192.0.2.1:9470\nmetrics-allow-remote = yes\n' >"$conf"
"$TPIPD_BIN" --config "$conf" --check-config >"$SVC_TMP/dump" 2>"$SVC_TMP/err" ||
	{ cat "$SVC_TMP/err"; fail "metrics-allow-remote after metrics-listen in the file is rejected"; }
grep -qxF "metrics-allow-remote = yes" "$SVC_TMP/dump" || fail "metrics-allow-remote = yes not dumped"
printf '[daemon]\nmetrics-listen = 192.0.2.1:9470\n' >"$conf"
"$TPIPD_BIN" --config "$conf" --metrics-allow-remote --check-config >/dev/null 2>"$SVC_TMP/err" ||
	{ cat "$SVC_TMP/err"; fail "--metrics-allow-remote does not admit the file's address"; }
check "a flag's loopback address replaces the file's remote one: no error without the option"
"$TPIPD_BIN" --config "$conf" --metrics-listen 127.0.0.1:9470 --check-config >/dev/null \
	2>"$SVC_TMP/err" || { cat "$SVC_TMP/err"; fail "the flag's loopback address is rejected"; }
: >"$conf"
check "an unknown flag: exit 2"
expect_exit2 "--no-such-flag" "unknown or incomplete option" \
	"$TPIPD_BIN" --config "$conf" --no-such-flag --check-config
[ ! -e "$sock" ] || fail "a failed start created $sock"

check "kept-fds-max must fit RLIMIT_NOFILE less the reserve: under ulimit -n 8192, 2920 fits (8192 - 5272)," \
	"2921 does not (exit 2 naming both figures, at start too); a file's value likewise; 0 derives it"
(ulimit -n 8192 && "$TPIPD_BIN" --config "$conf" --kept-fds-max 2920 --check-config) \
	>/dev/null 2>"$SVC_TMP/err" || { cat "$SVC_TMP/err"; fail "kept-fds-max 2920 refused"; }
(ulimit -n 8192 && "$TPIPD_BIN" --config "$conf" --kept-fds-max 0 --check-config) \
	>/dev/null 2>"$SVC_TMP/err" || { cat "$SVC_TMP/err"; fail "kept-fds-max 0 refused"; }
expect_exit2 "--kept-fds-max 2921" \
	"^tpipd: kept-fds-max: 2921 fds do not fit RLIMIT_NOFILE 8192, which leaves 2920 once 5272 are set aside" \
	bash -c 'ulimit -n 8192 && exec "$0" "$@"' "$TPIPD_BIN" --config "$conf" --kept-fds-max 2921 \
	--check-config
expect_exit2 "--kept-fds-max 2921 (start)" "^tpipd: kept-fds-max: 2921 fds do not fit" \
	bash -c 'ulimit -n 8192 && exec "$0" "$@"' "$TPIPD_BIN" --config "$conf" --kept-fds-max 2921 \
	--socket "$sock"
[ ! -e "$sock" ] || fail "a failed start created $sock"
printf '[limits]\nsessions-max = 4096\nkept-fds-max = 1000\n' >"$conf"
expect_exit2 "kept-fds-max in the file, sessions-max raised" \
	"^tpipd: kept-fds-max: 1000 fds do not fit RLIMIT_NOFILE 8192, which leaves 0 once 14488" \
	bash -c 'ulimit -n 8192 && exec "$0" "$@"' "$TPIPD_BIN" --config "$conf" --check-config
check "a soft RLIMIT_NOFILE below the hard one (a shell's 1024) is raised to it at start, so" \
	"kept fds are derived from the hard limit (1024 alone leaves none once 5272 are set aside)"
: >"$conf"
(ulimit -Sn 1024 && ulimit -Hn 8192 &&
	exec "$TPIPD_BIN" --config "$conf" --socket "$SVC_TMP/nofile.sock") 2>"$SVC_TMP/nofile.log" &
nofile_pid=$!
for _ in $(seq 100); do [ -S "$SVC_TMP/nofile.sock" ] && break; sleep 0.05; done
grep -q "RLIMIT_NOFILE raised from 1024 to its hard limit 8192" "$SVC_TMP/nofile.log" &&
	grep -q "keeps at most 2920 fds of clients' buffers" "$SVC_TMP/nofile.log" ||
	{ kill "$nofile_pid"; cat "$SVC_TMP/nofile.log"; fail "the soft limit was not raised"; }
kill "$nofile_pid"
wait "$nofile_pid" 2>/dev/null || true
printf '[limits]\nkept-fds-per-uid = -1\n' >"$conf"
expect_exit2 "kept-fds-per-uid = -1" "^tpipd: $conf:2: kept-fds-per-uid: '-1' is not a number" \
	"$TPIPD_BIN" --config "$conf" --check-config
printf '[limits]\nkept-fds-max = 16777217\n' >"$conf"
expect_exit2 "kept-fds-max above its range" \
	"^tpipd: $conf:2: kept-fds-max: '16777217' is not a number in \[0, 16777216\]" \
	"$TPIPD_BIN" --config "$conf" --check-config
: >"$conf"

# The example with every '# key = value' line uncommented and the '(restart...)' notes dropped.
example=$TPIPD_UNITS/tpipd.conf.example
good=$SVC_TMP/good.conf
sed -E 's/^# ([a-z][a-z-]* = [^ ]+).*$/\1/' "$example" >"$good"
nkeys=$(grep -cE '^[a-z][a-z-]* = ' "$good")
check "the uncommented example ($nkeys keys) passes --check-config"
"$TPIPD_BIN" --config "$good" --check-config >"$SVC_TMP/dump" 2>"$SVC_TMP/err" ||
	{ cat "$SVC_TMP/err"; fail "the example config with every key set is rejected"; }
[ "$nkeys" -gt 0 ] || fail "no 'key = value' lines generated from $example"

check "the example sets every option --check-config prints, and no other"
grep -oE '^[a-z][a-z-]* =' "$good" | sort >"$SVC_TMP/keys.example"
grep -oE '^[a-z][a-z-]* =' "$SVC_TMP/dump" | sort >"$SVC_TMP/keys.dump"
diff -u "$SVC_TMP/keys.dump" "$SVC_TMP/keys.example" ||
	fail "tpipd.conf.example and --check-config disagree on the option list"

check "--check-config prints the example's values (sizes in bytes)"
for kv in "frame-max = 4194304" "inline-max = 1048576" "segments-max = 1024" \
	"buffer-bytes-max = 68719476736" "log-level = info" "cma = yes" \
	"metrics-listen = 127.0.0.1:9470"; do
	grep -qxF "$kv" "$SVC_TMP/dump" || { cat "$SVC_TMP/dump"; fail "'$kv' not in the dump"; }
done

check "flags win over the file: frame-max = 2M in the file, --frame-max 8M on the command line"
printf '[limits]\nframe-max = 2M\n' >"$conf"
"$TPIPD_BIN" --config "$conf" --check-config | grep -qxF "frame-max = 2097152" ||
	fail "the file's frame-max = 2M is not in effect without the flag"
"$TPIPD_BIN" --config "$conf" --frame-max 8M --check-config >"$SVC_TMP/dump" ||
	fail "--frame-max 8M --check-config failed"
grep -qxF "frame-max = 8388608" "$SVC_TMP/dump" ||
	{ cat "$SVC_TMP/dump"; fail "--frame-max 8M did not win over frame-max = 2M"; }
say "ok"
