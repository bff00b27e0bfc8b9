#!/bin/bash
# "tether-signer keygen" and "tether cap inspect" as a user runs them: real
# binaries, real key files. Tokens are minted by a small helper compiled
# here against build/libtethercore.a (cap_mint, the signer's own code path)
# from the k4.secret file keygen wrote. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
TD=${TETHERD:-$ROOT/build/tetherd}
TS=${TETHER_SIGNER:-$ROOT/build/tether-signer}
T=${TETHER:-$ROOT/build/tether}
workdir tether-capcli

# run OUT ERR CMD...: runs CMD with stdout/stderr to files, sets $rc.
run() { local o=$1 e=$2; shift 2; rc=0; "$@" >"$o" 2>"$e" || rc=$?; }
lines() { grep -c '' "$1"; }

for b in "$TD" "$T"; do
	[ -x "$b" ] || { echo "not ok 1 - $b is not built (run make)"; exit 1; }
done

if ! build_mint "$WORK/mint"; then
	echo "not ok 1 - minting helper builds"; sed 's/^/#   /' "$WORK/mint.err"; exit 1
fi
O=$WORK/out E=$WORK/err

# --- keygen ---
run "$O" "$E" "$TS" keygen "$WORK/a.key"
expect "keygen succeeds" '[ $rc -eq 0 ]' "rc=$rc $(cat "$E")"
expect "keygen key file has mode 0600" \
	'[ "$(stat -c %a "$WORK/a.key")" = 600 ]' "$(stat -c %a "$WORK/a.key")"
expect "keygen file holds one k4.secret line" \
	'[ "$(lines "$WORK/a.key")" = 1 ] && grep -q "^k4\.secret\." "$WORK/a.key"' ""
PUB=$(sed -n 's/^public: //p' "$O")
KID=$(sed -n 's/^kid: //p' "$O")
expect "keygen prints the k4.public key and the kid" \
	'[[ $PUB == k4.public.* && $KID == k4.pid.* && $(lines "$O") == 2 ]]' "$(cat "$O")"
expect "keygen prints no secret" '! grep -q "k4\.secret\|$(cut -c11- "$WORK/a.key")" "$O" "$E"' ""

SUM=$(sha256sum <"$WORK/a.key")
run "$O" "$E" "$TS" keygen "$WORK/a.key"
expect "keygen refuses to overwrite (exit 1, one line)" \
	'[ $rc -eq 1 ] && [ "$(lines "$E")" = 1 ] && grep -q "already exists" "$E" && [ ! -s "$O" ]' \
	"rc=$rc $(cat "$E")"
expect "refused keygen left the key unchanged" \
	'[ "$(sha256sum <"$WORK/a.key")" = "$SUM" ] && [ "$(ls "$WORK" | grep -c "a\.key")" = 1 ]' \
	"$(ls -la "$WORK")"
run "$O" "$E" "$TS" keygen "$WORK/a.key" --force
expect "keygen --force replaces the key" \
	'[ $rc -eq 0 ] && [ "$(sha256sum <"$WORK/a.key")" != "$SUM" ]' "rc=$rc $(cat "$E")"
PUB=$(sed -n 's/^public: //p' "$O")
KID=$(sed -n 's/^kid: //p' "$O")
run "$O" "$E" "$TS" keygen "$WORK/b.key"
PUB2=$(sed -n 's/^public: //p' "$O")
run "$O" "$E" "$TS" keygen
expect "keygen without FILE is a usage error" \
	'[ $rc -eq 1 ] && grep -q "^usage: tether-signer keygen" "$E"' "rc=$rc $(cat "$E")"

# --- cap inspect ---
TOK=$("$WORK/mint" "$WORK/a.key")
expect "helper minted a token" '[[ $TOK == v4.public.* ]]' "$TOK"
BODY=${TOK#v4.public.}
BODY=${BODY%%.*}

run "$O" "$E" "$T" cap inspect "$TOK"
expect "inspect without a key prints the claims" \
	'[ $rc -eq 0 ] && grep -q "\"sbx\": \"sbx_abcdefghijklmnopqrstuvwxyz\"" "$O"' \
	"rc=$rc $(cat "$E")"
expect "inspect without a key says it did not verify" \
	'grep -q "NOT VERIFIED" "$E"' "$(cat "$E")"

run "$O" "$E" "$T" cap inspect "$TOK" --key "$PUB"
expect "inspect with the right key verifies" \
	'[ $rc -eq 0 ] && grep -q "\"gen\": 7" "$O" && grep -q "^signature: valid (kid $KID); expires in" "$E"' \
	"rc=$rc $(cat "$E")"

run "$O" "$E" "$T" cap inspect - --key "$PUB" <<<"$TOK"
expect "inspect reads the token from stdin with -" \
	'[ $rc -eq 0 ] && grep -q "^signature: valid" "$E"' "rc=$rc $(cat "$E")"

run "$O" "$E" "$T" cap inspect "$TOK" --key "$PUB2"
expect "inspect with a wrong key: exit 1, one line, nothing printed" \
	'[ $rc -eq 1 ] && [ "$(lines "$E")" = 1 ] && [ ! -s "$O" ] && grep -q "unknown_key" "$E"' \
	"rc=$rc $(cat "$E")"

# Change one payload character (position 20 of the body: 6 full bits).
c=${BODY:20:1}
[ "$c" = A ] && r=B || r=A
BAD="v4.public.${BODY:0:20}$r${TOK#v4.public.${BODY:0:21}}"
run "$O" "$E" "$T" cap inspect "$BAD" --key "$PUB"
expect "inspect of a tampered token: exit 1, one line, nothing printed" \
	'[ $rc -eq 1 ] && [ "$(lines "$E")" = 1 ] && [ ! -s "$O" ] && grep -q "bad_signature" "$E"' \
	"rc=$rc $(cat "$E")"
expect "no error message echoes the token" \
	'! grep -qF "${BODY:0:40}" "$E"' "$(cat "$E")"

run "$O" "$E" "$T" cap inspect "${TOK}=" --key "$PUB"
expect "inspect of a padded token: exit 1, one line" \
	'[ $rc -eq 1 ] && [ "$(lines "$E")" = 1 ] && grep -q malformed "$E"' "rc=$rc $(cat "$E")"

run "$O" "$E" "$T" cap inspect "v4.local.abc"
expect "inspect of a wrong prefix: exit 1, one line" \
	'[ $rc -eq 1 ] && [ "$(lines "$E")" = 1 ]' "rc=$rc $(cat "$E")"

OLD=$("$WORK/mint" "$WORK/a.key" 1000)
run "$O" "$E" "$T" cap inspect "$OLD" --key "$PUB"
expect "inspect of an expired token: exit 1, the claims printed, EXPIRED" \
	'[ $rc -eq 1 ] && grep -q "EXPIRED" "$E" && grep -q "\"gen\": 7" "$O"' "rc=$rc $(cat "$E")"
run "$O" "$E" "$T" cap inspect "$OLD"
expect "inspect of an expired token without a key: exit 1 too" \
	'[ $rc -eq 1 ] && grep -q "NOT VERIFIED.*EXPIRED" "$E" && [ -s "$O" ]' "rc=$rc $(cat "$E")"

run "$O" "$E" "$T" cap inspect "$TOK" --implicit x
expect "--implicit without --key is a usage error" \
	'[ $rc -eq 1 ] && [ "$(lines "$E")" = 1 ]' "rc=$rc $(cat "$E")"

tap_done
