#!/usr/bin/env bash
# Install everything ubitrain, its demo and its tests need on a fresh Debian 12 machine with
# Python 3.11: the C toolchains and emulators from Debian, then this project with pip.
# Idempotent: apt runs only when a package is missing; pip only adds what is missing.
#
#   bash scripts/setup.sh            # as root, or as a user with sudo
#   PYTHON=python3.11 bash scripts/setup.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# cmake + gcc build the generated C on the host; the rest are the cross compilers and
# emulators of the non-host targets (docs/toolchains.md).
APT_PACKAGES=(
    cmake gcc make libc6-dev
    gcc-aarch64-linux-gnu qemu-user
    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm
    clang lld
)

PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    APT_PACKAGES+=(python3 python3-pip python3-venv)
elif ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    APT_PACKAGES+=(python3-pip python3-venv)
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]})); then
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
        SUDO=(sudo)
    fi
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "setup: Debian packages already present"
fi

# Debian's own Python refuses pip installs outside a venv (PEP 668); this machine is set up
# for ubitrain, so install into it anyway there. Other Pythons (pyenv, a venv) need no flag.
PIP_FLAGS=(--root-user-action=ignore)
if "$PYTHON" -c 'import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
         and sys.prefix == sys.base_prefix else 1)'; then
    PIP_FLAGS+=(--break-system-packages)
fi

# pyproject pins torch==2.13.0 (the CPU build); an unpinned torch would pull a CUDA build.
echo "setup: pip install -e .[test] (with $("$PYTHON" --version))"
"$PYTHON" -m pip install -q "${PIP_FLAGS[@]}" -e ".[test]"
if command -v pyenv >/dev/null 2>&1; then
    pyenv rehash || true  # the `ubitrain` command's shim
fi

"$PYTHON" -c 'import ubitrain, torch, tvm; print(f"setup: ubitrain {ubitrain.__version__}, "
                f"torch {torch.__version__}, tvm {tvm.__version__}: ready")'
