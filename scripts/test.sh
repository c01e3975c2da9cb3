#!/usr/bin/env bash
# `make test`: every tier, on whatever machine this is.
#
#   1. scripts/setup-tiers.sh sets up what the tiers need (as root on Debian/Ubuntu: the
#      engine with runsc, chromium and its driver, the images); the local Kubernetes
#      cluster (unless KUBECONFIG names one) comes up in the background meanwhile;
#      without root it says once which tiers cannot run here and the command that
#      enables each;
#   2. the integration tier with pytest and, beside it, the unit tier and then (the
#      cluster up) the Kubernetes tier: those two wait mostly (on local kernels; on pods,
#      Leases and the reaper's passes), the integration tier mostly works; then the
#      hostile-code and core suites again under gVisor (KERNEL_SANDBOX_RUNTIME=runsc),
#      the busiest pass, beside whatever of the Kubernetes tier is left;
#   3. at exit, a cluster started in 1 is taken down (never one KUBECONFIG named).
#
# A pass that collects no tests (pytest's exit status 5, or "no tests ran") fails.
# PYTHON, DURATIONS (pytest's --durations), RUNSC_TESTS (the gVisor pass) and TEST_PATHS
# (instead of every tier: one pass over these paths, then the gVisor pass) come from the
# Makefile or the caller; SETUP_DRY_RUN=1 shows what set-up would do.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DURATIONS="${DURATIONS:---durations=15}"
RUNSC_TESTS="${RUNSC_TESTS:-tests/integration/test_hostile*.py tests/integration/test_sandbox.py}"
TEST_PATHS="${TEST_PATHS:-}"
TIERS_STATE=$(mktemp -d "${TMPDIR:-/tmp}/kernel-sandbox-tiers.XXXXXX")
export TIERS_STATE

die() { printf '\nmake test FAILED: %s\n' "$*" >&2; exit 1; }
cluster_setup="" side_pass=""
# End the background job $1 (a subshell) and the programs it runs, when it still runs.
stop_job() {
    [ -n "$1" ] || return 0
    pkill -TERM -P "$1" 2>/dev/null || true
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    stop_job "${side_pass}"  # the run ended before its side passes (a failure)
    if [ -n "${cluster_setup}" ]; then  # a cluster still starting when this run ends
        stop_job "${cluster_setup}"
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

scripts/setup-tiers.sh engine runsc images \
    || die "setting up the tiers failed (scripts/setup-tiers.sh above says why)"
# The cluster's start (~2 min, mostly loading images) overlaps the first pass.  Without
# root, set-up changes nothing and has said so already.
# Its exit status goes to $TIERS_STATE/cluster.status: the side passes wait for it there.
start_cluster() {
    local status=0
    scripts/setup-tiers.sh cluster >"${TIERS_STATE}/cluster.log" 2>&1 || status=$?
    printf '%s\n' "${status}" >"${TIERS_STATE}/cluster.status"
    return "${status}"
}
if [ "$(id -u)" -eq 0 ]; then
    start_cluster &
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

# The unit tier, then (its cluster up) the Kubernetes tier, one after the other beside
# the integration tier; the names of those that failed go to $TIERS_STATE/side-failed.
side_passes() {
    # shellcheck disable=SC2086  # DURATIONS is a list of words
    run_pass "the unit tier" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} tests/unit \
        || echo "the unit tier" >>"${TIERS_STATE}/side-failed"
    if [ -n "${cluster_setup}" ]; then
        while [ ! -s "${TIERS_STATE}/cluster.status" ]; do sleep 1; done
        if [ "$(cat "${TIERS_STATE}/cluster.status")" != 0 ]; then
            echo "the Kubernetes tier (its cluster's set-up failed)" >>"${TIERS_STATE}/side-failed"
            return
        fi
    fi
    if [ -s "${TIERS_STATE}/kubeconfig" ]; then
        KUBECONFIG=$(cat "${TIERS_STATE}/kubeconfig")
        export KUBECONFIG
    fi
    # shellcheck disable=SC2086
    run_pass "the Kubernetes tier" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} tests/kubernetes \
        || echo "the Kubernetes tier" >>"${TIERS_STATE}/side-failed"
}

failed=()
runsc_pass=""
# shellcheck disable=SC2086  # DURATIONS, TEST_PATHS and RUNSC_TESTS are lists of words
if [ -n "${TEST_PATHS}" ]; then
    run_pass "${TEST_PATHS}" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} ${TEST_PATHS} \
        || failed+=("${TEST_PATHS}")
else
    side_passes >"${TIERS_STATE}/side.out" 2>&1 &
    side_pass=$!
    # everything but the unit and Kubernetes tiers: a new directory of tests runs here
    run_pass "the integration tier" "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} \
        --ignore=tests/kubernetes --ignore=tests/unit || failed+=("the integration tier")
fi

if [ -n "${cluster_setup}" ]; then
    status=0
    wait "${cluster_setup}" || status=$?
    cluster_setup=""
    cat "${TIERS_STATE}/cluster.log"
    [ "${status}" -eq 0 ] || failed+=("setting up the cluster (above)")
fi

# shellcheck disable=SC2086
start_pass runsc_pass "the gVisor pass" env KERNEL_SANDBOX_RUNTIME=runsc \
    "${PYTHON}" -m pytest -q -rfEs ${DURATIONS} -m "not tcp_transport" ${RUNSC_TESTS}
if [ -n "${side_pass}" ]; then
    wait "${side_pass}" || true
    side_pass=""
    cat "${TIERS_STATE}/side.out"
    if [ -s "${TIERS_STATE}/side-failed" ]; then
        mapfile -t side_failed <"${TIERS_STATE}/side-failed"
        failed+=("${side_failed[@]}")
    fi
fi
show_pass "the gVisor pass" "${runsc_pass}" || failed+=("the gVisor pass")

[ "${#failed[@]}" -eq 0 ] || die "$(IFS=,; echo "${failed[*]}") failed (see above)"
printf '\nmake test: every tier passed\n'
