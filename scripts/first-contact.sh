#!/usr/bin/env bash
# First contact: the README's first command, run the way a newcomer runs it.
#
#   1. a clean clone of the committed tree, a fresh virtualenv with no extras, the
#      README's first command verbatim (read from the README, so the two cannot drift);
#   2. a wheel built from that clone, installed into another fresh virtualenv and used
#      from `/` (no source tree anywhere near): `airt --help`, `airt examples list`,
#      `airt run <packaged example>`, `airt demo`, and `airt operator` refusing with
#      the extra to install (exit 2, no traceback).
#
# Exit 0 only when every step exits as expected and the demo ends with its success
# line. Used by .ci/run before the test suite; run it by hand the same way.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
expected_final='demo: 3 of 3 runs completed'
work=$(mktemp -d "${TMPDIR:-/tmp}/airt-first-contact.XXXXXX")
trap 'rm -rf "$work"' EXIT

log() { printf '[first-contact] %s\n' "$*"; }
fail() { printf '[first-contact] FAILED: %s\n' "$*" >&2; exit 1; }

# The line after "# 1." in the first ```bash block of the README's Quick start.
first_command=$(awk '
  /^## Quick start/ { section = 1; next }
  section && /^## / { exit }
  section && /^```bash/ { block = 1; next }
  block && /^```/ { exit }
  block && /^# 1\./ { getline; print; exit }
' "$repo/README.md")
[ -n "$first_command" ] || fail "no first command found in README.md (Quick start, '# 1.')"
log "README's first command: $first_command"

# Every step's output is kept; on failure its tail is shown.
run_step() {  # run_step NAME EXPECTED_RC DIR COMMAND...
  local name=$1 want=$2 dir=$3
  shift 3
  local out="$work/$name.out" rc=0
  (cd "$dir" && "$@") >"$out" 2>&1 || rc=$?
  if [ "$rc" != "$want" ]; then
    tail -n 60 "$out" >&2
    fail "$name: exit $rc, expected $want"
  fi
  if grep -q '^Traceback (most recent call last)' "$out"; then
    tail -n 60 "$out" >&2
    fail "$name: printed a traceback"
  fi
  log "$name: exit $rc as expected"
}

final_line_is_success() {  # final_line_is_success NAME
  local last
  last=$(grep -v '^\s*$' "$work/$1.out" | tail -n 1)
  case "$last" in
    "$expected_final"*) log "$1: final line: $last" ;;
    *) tail -n 40 "$work/$1.out" >&2; fail "$1: final line is '$last', expected '$expected_final...'" ;;
  esac
}

# --- 1. clean clone, fresh venv, no extras, the command verbatim ----------------------
git clone --quiet "$repo" "$work/clone"
"$python" -m venv "$work/venv-editable"
# The newcomer's shell: the venv activated, nothing else of ours in the environment.
run_step editable 0 "$work/clone" env -u AIRUNTIME_REDIS_URL -u AIRUNTIME_HOME \
  bash -c ". '$work/venv-editable/bin/activate' && $first_command"
final_line_is_success editable

# --- 2. a wheel, installed into another fresh venv, used from / ------------------------
run_step build-wheel 0 "$work/clone" \
  "$work/venv-editable/bin/python" -m pip wheel --no-deps --wheel-dir "$work/dist" .
"$python" -m venv "$work/venv-wheel"
wheel=$(ls "$work"/dist/airuntime-*.whl)
# The web console's templates, CSS, JS and licence are package data: the wheel must carry them.
"$python" - "$wheel" <<'PY' || fail "the wheel lacks the console's templates or static files"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
base = "airuntime/control_plane/console/"
need = ["templates/base.html", "templates/run.html", "static/console.js", "static/console.css",
        "static/LICENSE"]
missing = [n for n in need if base + n not in names]
sys.exit(f"missing: {missing}" if missing else 0)
PY
run_step install-wheel 0 / "$work/venv-wheel/bin/python" -m pip install "$wheel"
airt="$work/venv-wheel/bin/airt"
export -n AIRUNTIME_REDIS_URL AIRUNTIME_HOME 2>/dev/null || true
unset AIRUNTIME_REDIS_URL AIRUNTIME_HOME
run_step wheel-help 0 / "$airt" --help
grep -q 'operator' "$work/wheel-help.out" || fail "airt --help does not list the operator command"
run_step wheel-examples 0 / "$airt" examples list
grep -q 'summarize-documents' "$work/wheel-examples.out" || fail "airt examples list shows no examples"
run_step wheel-run 0 / "$airt" run summarize-documents
run_step wheel-operator 2 / "$airt" operator
grep -q "airuntime\[kubernetes\]" "$work/wheel-operator.out" \
  || fail "airt operator without the extra does not name the extra to install"
run_step wheel-demo 0 / "$airt" demo
final_line_is_success wheel-demo

log "passed: editable install and wheel install both run the demo to its success line"
