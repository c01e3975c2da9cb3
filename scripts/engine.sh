#!/usr/bin/env bash
# Make sure a Docker engine answers, setting one up where that is safe to do by itself.
#
# Used by `make run` / `make images` and by .ci/run (one script, so the README's first
# command and CI set a machine up the same way):
#
#   - an engine answers: nothing to do (debootstrap, needed by the registry-less image
#     build, is installed too when this runs as root on Debian/Ubuntu);
#   - as root on Debian/Ubuntu: installs what is missing of docker.io and debootstrap
#     with apt-get, starts dockerd in the background (log: $DOCKERD_LOG) unless one is
#     starting already, and waits until `docker info` answers ($ENGINE_DEADLINE s);
#   - as root elsewhere with dockerd installed: starts it the same way;
#   - otherwise: changes nothing, prints exactly what to run, and exits 1.
#
# It never stops or restarts an engine.  ENGINE_DRY_RUN=1 prints what it would do
# instead of doing it (the decisions are still made from the real machine).
# OS_RELEASE names the os-release file to read (tests point it elsewhere).
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd-kernel-sandbox.log}"
ENGINE_DEADLINE="${ENGINE_DEADLINE:-90}"
ENGINE_DRY_RUN="${ENGINE_DRY_RUN:-0}"
# DOCKERD_CONFIG: the config file a dockerd started here gets (--config-file), e.g. one
# that registers runsc (CI asks for the runsc package through ENGINE_EXTRA_PACKAGES).
DOCKERD_CONFIG="${DOCKERD_CONFIG:-}"
OS_RELEASE="${OS_RELEASE:-/etc/os-release}"

say() { printf 'engine: %s\n' "$*"; }
have() { command -v "$1" >/dev/null 2>&1; }
answers() { docker info >/dev/null 2>&1; }

# Run a command, or only print it in a dry run.
act() {
    if [ "${ENGINE_DRY_RUN}" = 1 ]; then
        printf 'engine: would run: %s\n' "$*"
    else
        printf 'engine: running: %s\n' "$*"
        "$@"
    fi
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# True on Debian, Ubuntu and their derivatives (ID or ID_LIKE in os-release).
is_debian() {
    [ -r "${OS_RELEASE}" ] || return 1
    local id="" id_like=""
    id=$(sed -n 's/^ID=//p' "${OS_RELEASE}" | tr -d '"')
    id_like=$(sed -n 's/^ID_LIKE=//p' "${OS_RELEASE}" | tr -d '"')
    case " ${id} ${id_like} " in
        *" debian "* | *" ubuntu "*) return 0 ;;
        *) return 1 ;;
    esac
}

# ENGINE_EXTRA_PACKAGES: more Debian packages a caller needs (CI: shellcheck for
# `make lint`), each named after the command it provides, installed the same way.
missing_extras() {
    local p
    for p in ${ENGINE_EXTRA_PACKAGES:-}; do have "${p}" || printf '%s ' "${p}"; done
}

missing_packages() {
    local missing=()
    if ! have dockerd || ! have docker; then missing+=(docker.io); fi
    have debootstrap || missing+=(debootstrap)
    # shellcheck disable=SC2207  # one word per package
    missing+=($(missing_extras))
    printf '%s\n' "${missing[@]+"${missing[@]}"}" | tr '\n' ' ' | sed 's/ *$//'
}

install_packages() {
    local packages
    packages=$(missing_packages)
    [ -n "${packages}" ] || return 0
    say "installing ${packages} (apt-get)"
    act env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    act env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${packages}
}

start_and_wait() {
    if pgrep -x dockerd >/dev/null 2>&1; then
        say "dockerd is starting already; waiting for it"
    else
        say "starting dockerd (log: ${DOCKERD_LOG})"
        if [ "${ENGINE_DRY_RUN}" = 1 ]; then
            say "would run: nohup dockerd ${DOCKERD_CONFIG:+--config-file ${DOCKERD_CONFIG} }>${DOCKERD_LOG} 2>&1 &"
        else
            nohup dockerd ${DOCKERD_CONFIG:+--config-file "${DOCKERD_CONFIG}"} \
                >"${DOCKERD_LOG}" 2>&1 </dev/null &
        fi
    fi
    if [ "${ENGINE_DRY_RUN}" = 1 ]; then
        say "would wait up to ${ENGINE_DEADLINE} s for \`docker info\` to answer"
        return 0
    fi
    local deadline=$(($(date +%s) + ENGINE_DEADLINE))
    until answers; do
        if [ "$(date +%s)" -ge "${deadline}" ]; then
            tail -n 30 "${DOCKERD_LOG}" >&2 2>/dev/null || true
            say "the Docker engine did not answer within ${ENGINE_DEADLINE} s (log: ${DOCKERD_LOG})" >&2
            return 1
        fi
        sleep 1
    done
    say "the Docker engine answers"
}

# What a user who may not (or cannot) let this script set things up should run.
instructions() {
    local sudo="sudo "
    is_root && sudo=""
    {
        echo
        echo "No Docker engine answers, and this script sets one up only as root on"
        echo "Debian or Ubuntu. To set it up, run:"
        echo
        if is_debian; then
            echo "    ${sudo}apt-get update && ${sudo}apt-get install -y docker.io debootstrap"
            echo "    ${sudo}systemctl start docker    # or, without systemd:"
            echo "    ${sudo}sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'"
            echo
            echo "(or run \`sudo make run\`, which does all of this itself)."
        else
            echo "    install Docker Engine for your system (https://docs.docker.com/engine/install/)"
            echo "    and start it, e.g. ${sudo}systemctl start docker"
            echo "    plus debootstrap if no image registry can be reached (registry-less builds)."
        fi
        if ! is_root; then
            echo
            echo "To use the engine without root afterwards:"
            echo "    sudo usermod -aG docker \"\$USER\"    # then log in again"
        fi
        echo
        echo "Then run \`make run\` again."
    } >&2
}

main() {
    if answers; then
        say "the Docker engine is running"
        if is_root && is_debian && { ! have debootstrap || [ -n "$(missing_extras)" ]; }; then
            install_packages
        fi
        return 0
    fi
    local why=""
    have docker && why=$(docker info 2>&1 || true)
    if ! is_root && pgrep -x dockerd >/dev/null 2>&1 \
        && printf '%s' "${why}" | grep -qi 'permission denied'; then
        say "dockerd runs, but this user may not use it:" >&2
        echo "    sudo usermod -aG docker \"\$USER\"    # then log in again (or run as root)" >&2
        return 1
    fi
    if is_root && is_debian && have apt-get; then
        install_packages
        start_and_wait
        return
    fi
    if is_root && have dockerd; then
        start_and_wait
        return
    fi
    instructions
    return 1
}

main "$@"
