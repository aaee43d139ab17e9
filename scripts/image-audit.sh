#!/usr/bin/env bash
# pip-audit of the Python packages the image installs (the project's dependencies with
# the `kubernetes` extra, as `pip list` reports them inside the built image), against
# the PyPI vulnerability data.
#
#   scripts/image-audit.sh            # builds (or reuses) the image first
#
# Fails (exit 1) when a dependency has a known vulnerability that a released version
# fixes: the fix is to raise the lower bound in pyproject.toml and rebuild. A known
# vulnerability without a fix is printed and does not fail. Audited: the packages in the
# image's site-packages (what the Dockerfile installs), not the base image's own
# Debian packages (python3-pip/setuptools: Debian patches those without changing the
# upstream version number, which pip-audit cannot see).
#
# When no package could be looked up at all (the vulnerability service unreachable), it
# says SKIPPED and exits 0, or 1 with AIRUNTIME_AUDIT_STRICT=1.
#
# Environment: PIP_AUDIT (default: pip-audit on PATH), AIRUNTIME_AUDIT_STRICT.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PIP_AUDIT="${PIP_AUDIT:-pip-audit}"
work="$(mktemp -d "${TMPDIR:-/tmp}/airt-audit.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log() { printf '[image-audit] %s\n' "$*" >&2; }

command -v "$PIP_AUDIT" >/dev/null || { log "ERROR: $PIP_AUDIT not found (pip install pip-audit)"; exit 2; }
image="$("$REPO/scripts/image-build.sh" | tail -n1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["image"])')"

# The packages as installed in the image, read by the image's own Python.
podman run --rm --runtime runc --ulimit nproc=4096:4096 --ulimit nofile=20000:20000 \
    --network none --read-only --cap-drop ALL --entrypoint python "$image" -c '
import importlib.metadata as md, sysconfig
site = sysconfig.get_paths()["purelib"]
for dist in md.distributions(path=[site]):
    name = dist.metadata["Name"]
    if name.lower() != "airuntime":  # the project itself is not on PyPI
        print(f"{name}=={dist.version}")
' | sort >"$work/requirements.txt"
log "auditing $(wc -l <"$work/requirements.txt") packages installed in $image"

rc=0
"$PIP_AUDIT" --requirement "$work/requirements.txt" --no-deps --disable-pip \
    --progress-spinner off --format json --output "$work/audit.json" || rc=$?
[[ -s "$work/audit.json" ]] || { log "ERROR: pip-audit produced no report (exit $rc)"; exit 2; }

set +e
python3 - "$work/audit.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
deps = report["dependencies"] if isinstance(report, dict) else report
fixable, unfixable = [], []
for dep in deps:
    for vuln in dep.get("vulns", []):
        line = f"{dep['name']} {dep['version']}: {vuln['id']} (fixed in: {', '.join(vuln['fix_versions']) or 'no release'})"
        (fixable if vuln["fix_versions"] else unfixable).append(line)
skipped = [d for d in deps if d.get("skip_reason")]
print(f"pip-audit: {len(deps)} packages, {len(fixable)} fixable and {len(unfixable)} "
      f"unfixable known vulnerabilities, {len(skipped)} not audited")
for line in unfixable:
    print(f"  known, no fix released: {line}")
for dep in skipped:
    print(f"  not audited: {dep['name']}: {dep['skip_reason']}")
for line in fixable:
    print(f"  FIXABLE: {line}")
if deps and len(skipped) == len(deps):
    # Nothing could be looked up: the vulnerability service did not answer for any
    # package (e.g. a network whose PyPI proxy serves only /simple and /pypi/NAME/json,
    # not the per-version /pypi/NAME/VERSION/json that pip-audit reads).
    print("SKIPPED: pip-audit could not reach vulnerability data for any package; "
          "nothing was audited (AIRUNTIME_AUDIT_STRICT=1 makes this an error)")
    sys.exit(3)
sys.exit(1 if fixable else 0)
EOF
status=$?
if ((status == 3)); then
    [[ "${AIRUNTIME_AUDIT_STRICT:-0}" == 1 ]] && exit 1
    exit 0
fi
exit "$status"
