#!/usr/bin/env bash
# `make test`: every tier, on whatever machine this is.
#
#   1. scripts/setup-tiers.sh sets up what the tiers need (as root on Debian/Ubuntu: the
#      engine with runsc, chromium and its driver, the images); the local Kubernetes
#      cluster (unless KUBECONFIG names one) comes up in the background meanwhile;
#      without root it says once which tiers cannot run here and the command that
#      enables each;
#   2. the unit and integration tiers with pytest; then, side by side (the one waits on
#      a cluster, the other on the engine), the Kubernetes tier and the hostile-code and
#      core suites again under gVisor (KERNEL_SANDBOX_RUNTIME=runsc).  The first pass and
#      the gVisor pass run on WORKERS pytest-xdist processes, a file's tests on one of
#      them (--dist loadfile: its module fixtures are made once): their time goes to
#      waiting on kernels and containers, not to the CPU.  Tests that must not overlap
#      another process's take turns through a host lock (the `orphans` marker,
#      tests/integration/conftest.py); those marked `alone` run after, in one process;
#   3. at exit, a cluster started in 1 is taken down (never one KUBECONFIG named).
#
# A pass that collects no tests (pytest's exit status 5, or "no tests ran") fails.
# PYTHON, DURATIONS (pytest's --durations), WORKERS (pytest-xdist's -n; 1: one process),
# RUNSC_TESTS (the gVisor pass) and TEST_PATHS (instead of every tier: one pass over these
# paths, then the gVisor pass) come from the Makefile or the caller; SETUP_DRY_RUN=1 shows
# what set-up would do.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DURATIONS="${DURATIONS:---durations=15}"
RUNSC_TESTS="${RUNSC_TESTS:-tests/integration/test_hostile*.py tests/integration/test_sandbox.py}"
TEST_PATHS="${TEST_PATHS:-}"
WORKERS="${WORKERS:-3}"
TIERS_STATE=$(mktemp -d "${TMPDIR:-/tmp}/kernel-sandbox-tiers.XXXXXX")
export TIERS_STATE

die() { printf '\nmake test FAILED: %s\n' "$*" >&2; exit 1; }
cluster_setup=""
cleanup() {
    if [ -n "${cluster_setup}" ]; then  # a cluster still starting when this run ends
        kill "${cluster_setup}" 2>/dev/null || true
        wait "${cluster_setup}" 2>/dev/null || true
        # half started by this run (set-up starts none when KUBECONFIG names one)
        [ -n "${KUBECONFIG:-}" ] || scripts/k8s/cluster.sh down >/dev/null 2>&1 || true
    fi
    if [ -s "${TIERS_STATE}/kubeconfig" ]; then  # only a cluster set-up started
        printf 'tiers: taking down the local cluster this run started\n'
        scripts/k8s/cluster.sh down >/dev/null 2>&1 || true
    fi
    rm -rf "${TIERS_STATE}"
}
trap cleanup EXIT

# Several workers need pytest-xdist (a dev tool: `make install`); one needs nothing more.
XDIST=""
if [ "${WORKERS}" != 1 ]; then
    "${PYTHON}" -c 'import xdist' 2>/dev/null \
        || die "WORKERS=${WORKERS} needs pytest-xdist: run \`make install\` (or WORKERS=1)"
    XDIST="-n ${WORKERS} --dist loadfile"
fi

scripts/setup-tiers.sh engine runsc images \
    || die "setting up the tiers failed (scripts/setup-tiers.sh above says why)"
# The cluster's start (~2 min, mostly loading images) overlaps the first pass.  Without
# root, set-up changes nothing and has said so already.
if [ "$(id -u)" -eq 0 ]; then
    scripts/setup-tiers.sh cluster >"${TIERS_STATE}/cluster.log" 2>&1 &
    cluster_setup=$!
fi

# Where a pass named $1 keeps its files (a name may be TEST_PATHS: slashes, spaces).
pass_file() { printf '%s/%s' "${TIERS_STATE}" "${1//[^A-Za-z0-9]/-}"; }
# One pytest pass, its output to the terminal and its log; a pass that ran nothing is a
# failure, not a success.  Returns pytest's status (0 when it passed).
run_pass() {
    local name=$1 log status
    shift
    log="$(pass_file "${name}").log"
    printf '\n==> %s: pytest %s\n' "${name}" "$*"
    set +e
    "$@" 2>&1 | tee "${log}"
    status=${PIPESTATUS[0]}
    set -e
    if [ "${status}" -eq 5 ] || grep -qE '(^| )no tests ran' "${log}"; then
        printf '\nmake test: %s: pytest collected no tests (exit status 5): the suite did not run\n' \
            "${name}" >&2
        return 5
    fi
    return "${status}"
}
# run_pass in the background, its output kept for show_pass; its pid in the variable $1.
start_pass() {
    local var=$1 name=$2
    shift 2
    run_pass "${name}" "$@" >"$(pass_file "${name}").out" 2>&1 &
    printf -v "${var}" '%s' "$!"
}
show_pass() {  # $1 the name, $2 the pid of start_pass: its output, then its status
    local status=0
    wait "$2" || status=$?
    cat "$(pass_file "$1").out"
    return "${status}"
}

failed=()
runsc_pass="" kubernetes_pass=""
# shellcheck disable=SC2086  # DURATIONS, XDIST, TEST_PATHS and RUNSC_TESTS are lists of words
if [ -n "${TEST_PATHS}" ]; then
    run_pass "${TEST_PATHS}" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} ${XDIST} ${TEST_PATHS} \
        || failed+=("${TEST_PATHS}")
else
    run_pass "unit and integration tiers" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} ${XDIST} \
        -m "not alone" --ignore=tests/kubernetes || failed+=("the unit and integration tiers")
    # then, one process on a quiet host, the few that need one (the `alone` marker)
    run_pass "the tests that need the host alone" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} \
        -m alone --ignore=tests/kubernetes || failed+=("the tests that need the host alone")
fi

if [ -n "${cluster_setup}" ]; then
    status=0
    wait "${cluster_setup}" || status=$?
    cluster_setup=""
    cat "${TIERS_STATE}/cluster.log"
    [ "${status}" -eq 0 ] || die "setting up the cluster failed (above)"
fi
if [ -s "${TIERS_STATE}/kubeconfig" ]; then
    KUBECONFIG=$(cat "${TIERS_STATE}/kubeconfig")
    export KUBECONFIG
fi

# shellcheck disable=SC2086
start_pass runsc_pass "the gVisor pass" env KERNEL_SANDBOX_RUNTIME=runsc \
    "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} ${XDIST} -m "not tcp_transport" ${RUNSC_TESTS}
if [ -z "${TEST_PATHS}" ]; then
    # shellcheck disable=SC2086
    start_pass kubernetes_pass "the Kubernetes tier" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} \
        tests/kubernetes
    show_pass "the Kubernetes tier" "${kubernetes_pass}" || failed+=("the Kubernetes tier")
fi
show_pass "the gVisor pass" "${runsc_pass}" || failed+=("the gVisor pass")

[ "${#failed[@]}" -eq 0 ] || die "$(IFS=,; echo "${failed[*]}") failed (see above)"
printf '\nmake test: every tier passed\n'
