# check_lib.sh - what every shell test shares (sourced, not a test): the
# pass/fail counters, ok/bad/check, a temp dir removed on exit, and the
# summary line ctest's log shows. serve_lib.sh builds on it.
pass=0 fail=0 skipped=()
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# check_summary NAME: the SKIP lines, "NAME: N passed, N failed"; the status
# is the test's.
check_summary() {
    local s
    for s in "${skipped[@]}"; do echo "$1: SKIP: $s"; done
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
