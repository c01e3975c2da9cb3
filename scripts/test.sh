#!/usr/bin/env bash
# `make test`: every tier, on whatever machine this is.
#
#   1. scripts/setup-tiers.sh sets up what the tiers need (as root on Debian/Ubuntu: the
#      engine with runsc, chromium and its driver, the images, a local Kubernetes cluster
#      unless KUBECONFIG names one); without root it says once which tiers cannot run
#      here and the command that enables each;
#   2. both tiers with pytest (unit, integration, Kubernetes), then the hostile-code and
#      core suites again under gVisor (KERNEL_SANDBOX_RUNTIME=runsc);
#   3. at exit, a cluster started in 1 is taken down (never one KUBECONFIG named).
#
# A pass that collects no tests (pytest's exit status 5, or "no tests ran") fails.
# PYTHON, DURATIONS (pytest's --durations), RUNSC_TESTS (the gVisor pass) and TEST_PATHS
# (the first pass; default: pyproject's testpaths) come from the Makefile or the caller;
# SETUP_DRY_RUN=1 shows what set-up would do.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DURATIONS="${DURATIONS:---durations=15}"
RUNSC_TESTS="${RUNSC_TESTS:-tests/integration/test_hostile*.py tests/integration/test_sandbox.py}"
TEST_PATHS="${TEST_PATHS:-}"
TIERS_STATE=$(mktemp -d "${TMPDIR:-/tmp}/kernel-sandbox-tiers.XXXXXX")
export TIERS_STATE

die() { printf '\nmake test FAILED: %s\n' "$*" >&2; exit 1; }
cleanup() {
    if [ -s "${TIERS_STATE}/kubeconfig" ]; then  # only a cluster set-up started
        printf 'tiers: taking down the local cluster this run started\n'
        scripts/k8s/cluster.sh down >/dev/null 2>&1 || true
    fi
    rm -rf "${TIERS_STATE}"
}
trap cleanup EXIT

scripts/setup-tiers.sh || die "setting up the tiers failed (scripts/setup-tiers.sh above says why)"
if [ -s "${TIERS_STATE}/kubeconfig" ]; then
    KUBECONFIG=$(cat "${TIERS_STATE}/kubeconfig")
    export KUBECONFIG
fi

# One pytest pass; a pass that ran nothing is a failure, not a success.
run_pass() {
    local name=$1 log status
    shift
    log="${TIERS_STATE}/${name}.log"
    printf '\n==> %s: pytest %s\n' "${name}" "$*"
    set +e
    "$@" 2>&1 | tee "${log}"
    status=${PIPESTATUS[0]}
    set -e
    if [ "${status}" -eq 5 ] || grep -qE '(^| )no tests ran' "${log}"; then
        die "${name}: pytest collected no tests (exit status 5): the suite did not run"
    fi
    [ "${status}" -eq 0 ] || die "${name} failed (pytest exit status ${status})"
}

# shellcheck disable=SC2086  # DURATIONS, TEST_PATHS and RUNSC_TESTS are lists of words
run_pass "both tiers" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} ${TEST_PATHS}
# shellcheck disable=SC2086
run_pass "the gVisor pass" env KERNEL_SANDBOX_RUNTIME=runsc \
    "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} -m "not tcp_transport" ${RUNSC_TESTS}
