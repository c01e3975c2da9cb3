#!/usr/bin/env bash
# The package as a user gets it: build the wheel and the sdist, check their metadata,
# install the wheel ALONE (no extras) into a fresh virtualenv and run a real sandbox
# from it, outside the checkout.
#
#   - `python -m build` makes dist/ (wheel + sdist) in a temporary directory;
#   - `twine check` passes on both;
#   - the wheel's version is kernel_sandbox.__version__ (the one place it is written);
#   - a fresh venv gets the wheel with its core dependencies only, and none of the
#     extras' heavy parts (kubernetes, fastapi, mcp, openai) come with it;
#   - from that venv, in an empty directory: `import kernel_sandbox`, code run in a
#     Docker sandbox (state kept between calls, a shell command beside it), the CLI.
#
# Needs a Docker engine and the image $PACKAGE_IMAGE (kernel-sandbox:python; `make
# images` builds it). PACKAGE_KEEP=1 keeps the temporary directory. Used by `make
# package` and .ci/run.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
PACKAGE_IMAGE="${PACKAGE_IMAGE:-kernel-sandbox:python}"
# what the core must not bring: the extras' distributions (pip names)
NOT_IN_CORE=(kubernetes fastapi mcp openai uvicorn nbconvert numpy pillow)

say() { printf 'package: %s\n' "$*"; }
die() { printf 'package: FAILED: %s\n' "$*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/kernel-sandbox-package.XXXXXX")
if [ "${PACKAGE_KEEP:-0}" = 1 ]; then
    say "keeping ${work}"
else
    trap 'rm -rf "${work}"' EXIT
fi
# the checkout must not be what the venv imports
unset PYTHONPATH

say "building the wheel and the sdist (python -m build)"
"${PYTHON}" -m build --sdist --wheel --outdir "${work}/dist" . >"${work}/build.log" 2>&1 \
    || { tail -n 40 "${work}/build.log" >&2; die "python -m build failed"; }
wheels=("${work}"/dist/*.whl)
sdists=("${work}"/dist/*.tar.gz)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then die "expected one wheel in dist/"; fi
if [ "${#sdists[@]}" -ne 1 ] || [ ! -f "${sdists[0]}" ]; then die "expected one sdist in dist/"; fi
say "built $(basename "${wheels[0]}") and $(basename "${sdists[0]}")"

say "twine check"
"${PYTHON}" -m twine check --strict "${wheels[0]}" "${sdists[0]}" || die "twine check failed"

version=$("${PYTHON}" -c 'import ast, sys
tree = ast.parse(open("kernel_sandbox/__init__.py").read())
print(next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
           and getattr(n.targets[0], "id", "") == "__version__"))')
case "$(basename "${wheels[0]}")" in
    "kernel_sandbox-${version}-"*) say "version ${version}, from kernel_sandbox.__version__" ;;
    *) die "the wheel's version is not kernel_sandbox.__version__ (${version})" ;;
esac

say "installing the wheel alone (no extras) into a fresh venv"
"${PYTHON}" -m venv "${work}/venv"
venv="${work}/venv/bin"
"${venv}/python" -m pip install --disable-pip-version-check "${wheels[0]}" \
    >"${work}/install.log" 2>&1 || { tail -n 40 "${work}/install.log" >&2; die "pip install of the wheel failed"; }
for dist in "${NOT_IN_CORE[@]}"; do
    if "${venv}/python" -m pip show -q "${dist}" >/dev/null 2>&1; then
        die "the core install brought ${dist}, which belongs to an extra"
    fi
done
say "not installed, as they should not be: ${NOT_IN_CORE[*]}"
say "the core: $("${venv}/python" -m pip list --format=freeze 2>/dev/null | wc -l) distributions"

say "running a sandbox from the installed wheel (${PACKAGE_IMAGE})"
mkdir "${work}/empty"
(
    cd "${work}/empty"
    PACKAGE_IMAGE="${PACKAGE_IMAGE}" "${venv}/python" - <<'PY'
import os

import kernel_sandbox
from kernel_sandbox import Sandbox

where = os.path.dirname(kernel_sandbox.__file__)
assert "/venv/" in where, f"kernel_sandbox came from {where}, not the fresh venv"
with Sandbox.create(image=os.environ["PACKAGE_IMAGE"], timeout=60) as sb:
    sb.run_python("x = 6 * 7")
    ex = sb.run_python("print(x)")
    assert ex.status == "ok" and ex.stdout == "42\n", (ex.status, ex.stdout, ex.error)
    shell = sb.run_shell("id -un")
    assert shell.exit_code == 0 and shell.stdout.strip() == "sandbox", shell
print(f"package: kernel_sandbox {kernel_sandbox.__version__} from {where}: print(x) -> 42")
PY
) || die "the installed wheel did not run a sandbox"
"${venv}/kernel-sandbox" --help >/dev/null || die "kernel-sandbox --help failed"
out=$("${venv}/kernel-sandbox" serve --port 0 2>&1) && die "serve ran without the server extra"
grep -q "pip install 'kernel-sandbox\[server\]'" <<<"${out}" \
    || die "serve without the server extra did not name it: ${out}"
say "kernel-sandbox serve without the extra says: ${out}"
say "passed"
