#!/usr/bin/env bash
# What every test tier needs, set up the same way for `make test` and .ci/run.
#
#   scripts/setup-tiers.sh [--dry-run] [engine|runsc|images|cluster ...]   (default: all)
#
# As root on Debian/Ubuntu it sets up what is missing, and leaves alone what is there:
#   engine   the Docker engine (scripts/engine.sh), with debootstrap, runsc, shellcheck,
#            chromium and chromium-driver (the live page is tested in a real browser)
#   runsc    gVisor registered as the engine's `runsc` runtime with the runtimeArgs
#            sandboxes need: in the config file of a dockerd started here, or in the
#            running dockerd's own config file and a reload (SIGHUP: containers go on)
#   images   kernel-sandbox:python, :datascience, :r, :javascript, :polyglot, the stand-in
#            python:3.11-slim and :server, built the registry-less way, and the
#            stand-in's derived image
#   cluster  the Kubernetes tier's cluster: KUBECONFIG's when it is set (checked, never
#            started or stopped); else a local one (scripts/k8s/cluster.sh up), whose
#            KUBECONFIG is written to $TIERS_STATE/kubeconfig — whoever started it tears
#            it down (scripts/test.sh does at exit; `scripts/k8s/cluster.sh down`)
# Without root it changes nothing: it says, once, which tiers cannot run here and the
# one command that enables each, and exits 0 (those tiers skip locally; CI runs as root).
#
# --dry-run (or SETUP_DRY_RUN=1) prints what it would do; the decisions are made from
# the real machine. Exits non-zero only when a set-up step it tried failed.
set -euo pipefail

cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
PYTHON="${PYTHON:-python3}"
SETUP_DRY_RUN="${SETUP_DRY_RUN:-0}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd-kernel-sandbox.log}"
ENGINE_DEADLINE="${ENGINE_DEADLINE:-90}"   # seconds to wait for dockerd
# The engine config written here for a dockerd that scripts/engine.sh starts (never the
# host's daemon.json): it registers gVisor's runsc, which `make test` runs suites under.
DOCKERD_CONFIG="${DOCKERD_CONFIG:-/etc/kernel-sandbox/dockerd-ci.json}"
TIERS_STATE="${TIERS_STATE:-${TMPDIR:-/tmp}/kernel-sandbox-tiers}"
RUNSC_ARGS=(--network=none --host-uds=all --host-fifo=open)  # see backends/docker/runtimes.py
IMAGES=(python datascience standin server r javascript polyglot)

components=()
for arg in "$@"; do
    case "${arg}" in
        --dry-run) SETUP_DRY_RUN=1 ;;
        engine | runsc | images | cluster) components+=("${arg}") ;;
        *) echo "usage: $0 [--dry-run] [engine|runsc|images|cluster ...]" >&2; exit 2 ;;
    esac
done
[ "${#components[@]}" -gt 0 ] || components=(engine runsc images cluster)

say() { printf 'tiers: %s\n' "$*"; }
fail() { printf 'tiers: FAILED: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
wants() { [[ " ${components[*]} " == *" $1 "* ]]; }
is_root() { [ "$(id -u)" -eq 0 ]; }
act() {
    if [ "${SETUP_DRY_RUN}" = 1 ]; then
        say "would run: $*"
    else
        "$@"
    fi
}
answers() { docker info >/dev/null 2>&1; }
runsc_registered() {  # with every runtimeArg sandboxes need
    local args arg
    args=$(docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null) || return 1
    for arg in "${RUNSC_ARGS[@]}"; do
        grep -q -- "\"${arg}\"" <<<"${args}" || return 1
    done
}
# Merge the runsc runtime into the engine config file $1; keep the rest of it.
# register_runsc CONFIG [experimental]: with "experimental", the engine's checkpoint API
# too (exact snapshots; only a dockerd started here gets it: it is not reloadable).
register_runsc() {
    local runsc
    runsc="$(command -v runsc || echo /usr/bin/runsc)"   # Debian's path, once installed
    if [ "${SETUP_DRY_RUN}" = 1 ]; then
        say "would register ${runsc} as the runtime runsc in $1"
        return
    fi
    "${PYTHON}" - "$1" "${2:-}" "${runsc}" "${RUNSC_ARGS[@]}" <<'EOF'
import json, os, sys
path, experimental, runsc, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
config = {}
if os.path.exists(path) and os.path.getsize(path):
    with open(path) as f:
        config = json.load(f)
config.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": args}
if experimental:
    config["experimental"] = True
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(path + ".tmp", path)
EOF
}
missing_images() {
    "${PYTHON}" -m kernel_sandbox.cli.main images list 2>/dev/null \
        | awk '/missing/ {print}' || true
}
cluster_answers() {
    [ -n "${KUBECONFIG:-}" ] && [ -r "${KUBECONFIG%%:*}" ] || return 1
    "${PYTHON}" - <<'EOF' >/dev/null 2>&1
from kubernetes import client, config
config.load_kube_config()
client.VersionApi().get_code(_request_timeout=10)
EOF
}

# --- without root: report what cannot run, once, and change nothing ------------------------
if ! is_root; then
    gaps=()
    if ! answers; then
        gaps+=("integration tiers (no Docker engine answers): sudo scripts/engine.sh")
    else
        runsc_registered || gaps+=("the gVisor pass (runsc is not the engine's runtime): sudo scripts/setup-tiers.sh runsc")
        [ -z "$(missing_images)" ] || gaps+=("suites on missing images: sudo scripts/setup-tiers.sh images")
    fi
    { have chromium && have chromedriver; } \
        || gaps+=("the live page in a browser (no chromium/chromedriver): sudo apt-get install -y chromium chromium-driver")
    cluster_answers \
        || gaps+=("the Kubernetes tier (no cluster): export KUBECONFIG=<a cluster's kubeconfig>, or run make test as root (it starts a local one)")
    if [ "${#gaps[@]}" -eq 0 ]; then
        say "not root, but every tier can run here"
    else
        say "not root: these tiers cannot run here and will be skipped:"
        for gap in "${gaps[@]}"; do printf '  - %s\n' "${gap}"; done
    fi
    exit 0
fi

# --- as root: set up what is missing ------------------------------------------------------
if wants engine; then
    if ! pgrep -x dockerd >/dev/null; then
        register_runsc "${DOCKERD_CONFIG}" experimental   # for the dockerd started now
    fi
    say "the Docker engine, debootstrap, runsc, shellcheck and chromium (scripts/engine.sh)"
    ENGINE_DRY_RUN="${SETUP_DRY_RUN}" DOCKERD_LOG="${DOCKERD_LOG}" ENGINE_DEADLINE="${ENGINE_DEADLINE}" \
        ENGINE_EXTRA_PACKAGES="shellcheck runsc chromium chromium-driver=chromedriver" \
        DOCKERD_CONFIG="${DOCKERD_CONFIG}" scripts/engine.sh \
        || fail "no Docker engine (scripts/engine.sh above says why)"
    if [ "${SETUP_DRY_RUN}" != 1 ]; then
        have debootstrap || fail "debootstrap is missing (registry-less builds)"
        have runsc || fail "runsc is missing (make test runs suites under gVisor)"
        have shellcheck || fail "shellcheck is missing (make lint checks the shell programs)"
        { have chromium && have chromedriver; } \
            || fail "chromium/chromium-driver are missing (the live page is tested in a real browser)"
    fi
fi

if wants runsc; then
    if runsc_registered; then
        say "the engine has the runsc runtime"
    else
        # An engine that was running already reads the file given with --config-file, else
        # the default one; a reload (SIGHUP) takes new runtimes, containers keep running.
        pid=$(pgrep -xo dockerd || true)
        [ -n "${pid}" ] || fail "the engine has no runsc runtime and is not a local dockerd: register it there"
        config=$(tr '\0' '\n' <"/proc/${pid}/cmdline" | sed -n 's/^--config-file=//p; /^--config-file$/{n;p;}')
        config=${config:-/etc/docker/daemon.json}
        say "registering runsc in ${config} and reloading dockerd (SIGHUP)"
        register_runsc "${config}"
        act kill -HUP "${pid}"
        if [ "${SETUP_DRY_RUN}" != 1 ]; then
            for _ in $(seq 20); do runsc_registered && break; sleep 0.5; done
            runsc_registered || fail "dockerd did not take the runsc runtime from ${config} (see its log)"
        fi
    fi
fi

if wants images; then
    say "images (registry-less: debootstrap base, wheels from the host): ${IMAGES[*]}"
    act "${PYTHON}" -m kernel_sandbox.cli.main images build --airgapped "${IMAGES[@]}"
    say "the kernel-ready image derived from python:3.11-slim (once)"
    act "${PYTHON}" -c 'import asyncio, logging
logging.basicConfig(level=logging.INFO, format="%(message)s")
from kernel_sandbox.backends.docker.images import resolve_kernel_image
print(asyncio.run(resolve_kernel_image("python:3.11-slim", derive=True)))'
fi

if wants cluster; then
    if [ -n "${KUBECONFIG:-}" ]; then
        # someone else's cluster: used as it is, never started or stopped here
        cluster_answers || fail "KUBECONFIG=${KUBECONFIG} names no cluster that answers"
        say "the Kubernetes tier uses KUBECONFIG=${KUBECONFIG}"
    elif [ "${SETUP_DRY_RUN}" = 1 ]; then
        say "would run: scripts/k8s/cluster.sh up  (KUBECONFIG to ${TIERS_STATE}/kubeconfig)"
    else
        say "starting a local Kubernetes cluster for the Kubernetes tier"
        mkdir -p "${TIERS_STATE}"
        kubeconfig=$(scripts/k8s/cluster.sh up | tail -n 1) || fail "scripts/k8s/cluster.sh up failed"
        [ -r "${kubeconfig}" ] || fail "scripts/k8s/cluster.sh up printed no kubeconfig (${kubeconfig})"
        printf '%s\n' "${kubeconfig}" >"${TIERS_STATE}/kubeconfig"
        say "started; KUBECONFIG=${kubeconfig} (take it down: scripts/k8s/cluster.sh down)"
    fi
fi
say "set up"
