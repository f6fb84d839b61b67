#!/usr/bin/env bash
# Build (or reuse) LAMMPS as a shared library with the ML-IAP, PYTHON and KOKKOS packages, ML-IAP's Python
# support (MLIAP_ENABLE_PYTHON) and MPI, and install LAMMPS's Python module into the active Python environment.
#
# This is the LAMMPS that runs MACE models (converted with `sparse_accumulation.mace.accelerate` or not) through
# `pair_style mliap unified`. KOKKOS is part of it because the ML-IAP data object that MACE's LAMMPS class uses
# (ghost-atom exchange between message-passing layers, per-pair forces) is the KOKKOS one; on a CPU it runs with
# Kokkos's Serial (default) or OpenMP back end.
#
# Run `scripts/build_lammps.sh --help` for the options. Build outputs live outside the source tree, in a cache
# folder (default ~/.cache/sparse-accumulation/lammps, or $SPARSE_ACCUMULATION_LAMMPS_DIR); a second run with the
# same sources and options reuses the build and only installs the Python module again.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/build_lammps.sh [options] [-- extra CMake arguments]

Where the LAMMPS sources come from (one of):
  --source DIR          a LAMMPS source tree (the folder holding src/, cmake/, lib/, python/)
  --git-url URL         clone this repository (default https://github.com/lammps/lammps.git) ...
  --tag TAG             ... at this tag or branch (default stable_22Jul2025_update4)

Build:
  --cache-dir DIR       cache folder (default $SPARSE_ACCUMULATION_LAMMPS_DIR or ~/.cache/sparse-accumulation/lammps)
  --kokkos-backend B    serial (default), openmp, or cuda (cuda also needs --kokkos-arch, e.g. HOPPER90, and the
                        CUDA toolkit; it selects Kokkos's nvcc_wrapper as the C++ compiler)
  --kokkos-arch ARCH    a Kokkos architecture name without the Kokkos_ARCH_ prefix (e.g. HOPPER90, AMPERE80)
  --jobs N              parallel compile jobs (default 2)
  --force               configure and build again even if a build with the same options exists
  --no-install-python   do not install LAMMPS's Python module into the active Python environment
  --prepare-only        get the sources (clone), print their folder, and stop

Dependencies:
  --check-deps          print which dependencies are present or missing, then exit
  --install-deps        install the missing ones (apt-get for system packages, pip into the active Python
                        for Cython and mpi4py) before building; without it the script only reports them

Environment:
  PYTHON                the Python to build against (default: `python` of the active virtual environment,
                        else python3)
  SPARSE_ACCUMULATION_LAMMPS_DIR   default cache folder

The script prints the path of the build at the end; `lmp` and liblammps.so are in its build/ folder.
EOF
}

SOURCE_DIR=""
GIT_URL="https://github.com/lammps/lammps.git"
TAG="stable_22Jul2025_update4"
CACHE_DIR="${SPARSE_ACCUMULATION_LAMMPS_DIR:-$HOME/.cache/sparse-accumulation/lammps}"
KOKKOS_BACKEND="serial"
KOKKOS_ARCH=""
JOBS=2
FORCE=0
INSTALL_PYTHON=1
PREPARE_ONLY=0
CHECK_DEPS=0
INSTALL_DEPS=0
EXTRA_CMAKE_ARGS=()

die() { echo "build_lammps.sh: error: $*" >&2; exit 1; }
log() { echo "build_lammps.sh: $*"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --source) SOURCE_DIR="${2:?--source needs a folder}"; shift 2 ;;
        --git-url) GIT_URL="${2:?--git-url needs a URL}"; shift 2 ;;
        --tag) TAG="${2:?--tag needs a tag or branch}"; shift 2 ;;
        --cache-dir) CACHE_DIR="${2:?--cache-dir needs a folder}"; shift 2 ;;
        --kokkos-backend) KOKKOS_BACKEND="${2:?--kokkos-backend needs serial, openmp or cuda}"; shift 2 ;;
        --kokkos-arch) KOKKOS_ARCH="${2:?--kokkos-arch needs an architecture}"; shift 2 ;;
        --jobs|-j) JOBS="${2:?--jobs needs a number}"; shift 2 ;;
        --force) FORCE=1; shift ;;
        --no-install-python) INSTALL_PYTHON=0; shift ;;
        --prepare-only) PREPARE_ONLY=1; shift ;;
        --check-deps) CHECK_DEPS=1; shift ;;
        --install-deps) INSTALL_DEPS=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA_CMAKE_ARGS=("$@"); break ;;
        *) usage >&2; die "unknown option '$1'" ;;
    esac
done

case "$KOKKOS_BACKEND" in
    serial|openmp) ;;
    cuda) [[ -n "$KOKKOS_ARCH" ]] || die "--kokkos-backend cuda needs --kokkos-arch (e.g. HOPPER90 for H100/H200)" ;;
    *) die "--kokkos-backend must be serial, openmp or cuda, not '$KOKKOS_BACKEND'" ;;
esac
[[ "$JOBS" =~ ^[0-9]+$ && "$JOBS" -ge 1 ]] || die "--jobs must be a positive number, not '$JOBS'"

# ---------------------------------------------------------------- the Python to build against
if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
else
    PY="$(command -v python3 || true)"
fi
[[ -n "$PY" && -x "$(command -v "$PY")" ]] || die "no Python found: activate a virtual environment or set PYTHON"
PY="$(command -v "$PY")"
PY_TAG="$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
PY_HAS_SHARED="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED") or 0)')"

# ---------------------------------------------------------------- dependencies
have_cmd() { command -v "$1" >/dev/null 2>&1; }
py_has() { "$PY" -c "import $1" >/dev/null 2>&1; }
cmake_ok() {
    have_cmd cmake || return 1
    local v; v="$(cmake --version | head -n1 | awk '{print $3}')"
    "$PY" -c "import sys; v=tuple(int(x) for x in '$v'.split('.')[:2]); sys.exit(0 if v >= (3, 20) else 1)"
}

MISSING_APT=()
MISSING_PIP=()
REPORT=()
check() {  # check NAME TEST APT_PACKAGES PIP_PACKAGE
    local name="$1" test="$2" apt="$3" pip="$4"
    if eval "$test"; then
        REPORT+=("  found    $name")
    else
        REPORT+=("  MISSING  $name${apt:+ (Debian/Ubuntu: $apt)}${pip:+ (pip: $pip)}")
        [[ -n "$apt" ]] && MISSING_APT+=($apt)
        [[ -n "$pip" ]] && MISSING_PIP+=("$pip")
    fi
    return 0
}
collect_deps() {
    MISSING_APT=(); MISSING_PIP=(); REPORT=()
    check "C++ compiler (c++ or g++)" "have_cmd c++ || have_cmd g++" "g++" ""
    check "CMake >= 3.20" "cmake_ok" "cmake" ""
    check "make" "have_cmd make" "make" ""
    check "git (only for --git-url)" "[[ -n '$SOURCE_DIR' ]] || have_cmd git" "git" ""
    check "MPI C++ compiler wrapper (mpicxx, with MPI headers)" "have_cmd mpicxx" "mpich libmpich-dev" ""
    check "mpirun / mpiexec" "have_cmd mpirun || have_cmd mpiexec" "mpich" ""
    check "Python with a shared libpython ($PY)" "[[ '$PY_HAS_SHARED' == 1 ]]" "" ""
    check "Python headers (Python.h)" "[[ -f \"\$('$PY' -c 'import sysconfig; print(sysconfig.get_path(\"include\"))')/Python.h\" ]]" "python3-dev" ""
    check "NumPy in $PY" "py_has numpy" "" "numpy"
    check "Cython in $PY" "py_has Cython" "" "cython"
    check "mpi4py in $PY, built against this MPI (for MPI runs driven from Python)" "py_has mpi4py.MPI" "" "mpi4py"
    check "ccache (optional, makes rebuilds fast)" "have_cmd ccache" "ccache" ""
}

collect_deps
if [[ $CHECK_DEPS -eq 1 ]]; then
    echo "Dependencies for building LAMMPS with ML-IAP + PYTHON + KOKKOS + MPI against $PY:"
    printf '%s\n' "${REPORT[@]}"
    exit 0
fi
if [[ ${#MISSING_APT[@]} -gt 0 || ${#MISSING_PIP[@]} -gt 0 ]]; then
    if [[ $INSTALL_DEPS -eq 1 ]]; then
        if [[ ${#MISSING_APT[@]} -gt 0 ]]; then
            have_cmd apt-get || die "cannot install ${MISSING_APT[*]}: no apt-get here; install them with your package manager"
            SUDO=""; [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
            log "installing with apt-get: ${MISSING_APT[*]}"
            $SUDO apt-get update
            $SUDO apt-get install -y --no-install-recommends "${MISSING_APT[@]}"
        fi
        if [[ ${#MISSING_PIP[@]} -gt 0 ]]; then
            log "installing with pip into $PY: ${MISSING_PIP[*]}"
            # mpi4py from its source, compiled with this MPI's mpicc (its binary wheels may expect another MPI's
            # library names, e.g. libmpi.so.12, which Debian's MPICH does not have)
            "$PY" -m pip install --no-binary mpi4py --force-reinstall "${MISSING_PIP[@]}"
        fi
        collect_deps
    fi
    still_missing=0
    for line in "${REPORT[@]}"; do
        if [[ "$line" == *MISSING* && "$line" != *ccache* && "$line" != *mpi4py* ]]; then still_missing=1; fi
    done
    if [[ $still_missing -eq 1 ]]; then
        printf '%s\n' "${REPORT[@]}" >&2
        die "dependencies are missing (above); install them, or rerun with --install-deps"
    fi
    for line in "${REPORT[@]}"; do [[ "$line" == *MISSING* ]] && log "note:${line#  MISSING}"; done
fi

# ---------------------------------------------------------------- the LAMMPS sources
mkdir -p "$CACHE_DIR"
CACHE_DIR="$(cd "$CACHE_DIR" && pwd)"
if [[ -n "$SOURCE_DIR" ]]; then
    [[ -d "$SOURCE_DIR/src" && -f "$SOURCE_DIR/cmake/CMakeLists.txt" ]] \
        || die "--source $SOURCE_DIR is not a LAMMPS source tree (no src/ or cmake/CMakeLists.txt)"
    SOURCE_DIR="$(cd "$SOURCE_DIR" && pwd)"
else
    SOURCE_DIR="$CACHE_DIR/src/lammps-${TAG//\//_}"
    if [[ ! -f "$SOURCE_DIR/cmake/CMakeLists.txt" ]]; then
        log "cloning $GIT_URL at $TAG into $SOURCE_DIR"
        rm -rf "$SOURCE_DIR"
        git clone --depth 1 --branch "$TAG" "$GIT_URL" "$SOURCE_DIR"
    fi
fi
[[ -f "$SOURCE_DIR/src/ML-IAP/mliap_unified.cpp" ]] \
    || die "$SOURCE_DIR has no ML-IAP unified models (src/ML-IAP/mliap_unified.cpp): LAMMPS is too old"
[[ -f "$SOURCE_DIR/src/KOKKOS/mliap_unified_couple_kokkos.pyx" ]] \
    || die "$SOURCE_DIR has no KOKKOS ML-IAP Python coupling (src/KOKKOS/mliap_unified_couple_kokkos.pyx): LAMMPS is too old for MACE's ML-IAP interface"
grep -q "forward_exchange" "$SOURCE_DIR/src/KOKKOS/mliap_unified_couple_kokkos.pyx" \
    || die "$SOURCE_DIR's KOKKOS ML-IAP coupling has no forward_exchange (ghost-atom exchange): LAMMPS is too old for MACE's ML-IAP interface"
LAMMPS_VERSION="$(sed -n 's/^#define LAMMPS_VERSION "\(.*\)"/\1/p' "$SOURCE_DIR/src/version.h" | tr -d ' ')"
LAMMPS_UPDATE="$(sed -n 's/^#define LAMMPS_UPDATE "\(.*\)"/\1/p' "$SOURCE_DIR/src/version.h" | tr -d ' ')"
[[ -n "$LAMMPS_VERSION" ]] || die "cannot read LAMMPS_VERSION from $SOURCE_DIR/src/version.h"
LABEL="lammps-${LAMMPS_VERSION}${LAMMPS_UPDATE:+-$LAMMPS_UPDATE}"

[[ -f "$SOURCE_DIR/lib/kokkos/CMakeLists.txt" ]] \
    || die "$SOURCE_DIR has no lib/kokkos (a repackaged source such as Debian's +dfsg tarball strips it): build LAMMPS's own release sources (--git-url/--tag), which bundle Kokkos"

if [[ $PREPARE_ONLY -eq 1 ]]; then
    echo "LAMMPS sources: $SOURCE_DIR"
    exit 0
fi

# ---------------------------------------------------------------- configure and build
CMAKE_ARGS=(
    -D CMAKE_BUILD_TYPE=Release
    -D BUILD_SHARED_LIBS=ON
    -D BUILD_MPI=ON
    -D BUILD_OMP="$([[ $KOKKOS_BACKEND == openmp ]] && echo ON || echo OFF)"
    -D PKG_ML-IAP=ON
    -D PKG_ML-SNAP=ON
    -D PKG_PYTHON=ON
    -D MLIAP_ENABLE_PYTHON=ON
    -D PKG_KOKKOS=ON
    -D Kokkos_ENABLE_SERIAL=ON
    -D Kokkos_ENABLE_DEPRECATION_WARNINGS=OFF
    -D Python_EXECUTABLE="$PY"
    -D WITH_JPEG=OFF -D WITH_PNG=OFF -D WITH_FFMPEG=OFF
)
case "$KOKKOS_BACKEND" in
    openmp) CMAKE_ARGS+=(-D Kokkos_ENABLE_OPENMP=ON) ;;
    cuda) CMAKE_ARGS+=(-D Kokkos_ENABLE_CUDA=ON -D CMAKE_CXX_COMPILER="$SOURCE_DIR/lib/kokkos/bin/nvcc_wrapper") ;;
esac
[[ -n "$KOKKOS_ARCH" ]] && CMAKE_ARGS+=(-D "Kokkos_ARCH_${KOKKOS_ARCH}=ON")
have_cmd ccache && CMAKE_ARGS+=(-D CMAKE_CXX_COMPILER_LAUNCHER=ccache -D CMAKE_C_COMPILER_LAUNCHER=ccache)
CMAKE_ARGS+=("${EXTRA_CMAKE_ARGS[@]}")

CONFIG_STRING="source=$SOURCE_DIR python=$PY ${CMAKE_ARGS[*]}"
CONFIG_HASH="$(printf '%s' "$CONFIG_STRING" | sha256sum | cut -c1-10)"
BUILD_ROOT="$CACHE_DIR/$LABEL-$KOKKOS_BACKEND${KOKKOS_ARCH:+-$KOKKOS_ARCH}-$PY_TAG-$CONFIG_HASH"
BUILD_DIR="$BUILD_ROOT/build"
STAMP="$BUILD_ROOT/build-complete"

if [[ $FORCE -eq 0 && -f "$STAMP" && -f "$BUILD_DIR/liblammps.so" ]]; then
    log "reusing the build in $BUILD_ROOT (--force builds again)"
else
    mkdir -p "$BUILD_DIR"
    rm -f "$STAMP"
    printf '%s\n' "$CONFIG_STRING" > "$BUILD_ROOT/configuration.txt"
    log "configuring $LABEL ($KOKKOS_BACKEND) in $BUILD_DIR"
    cmake -S "$SOURCE_DIR/cmake" -B "$BUILD_DIR" "${CMAKE_ARGS[@]}"
    log "building with $JOBS jobs (this takes a while the first time)"
    start=$(date +%s)
    cmake --build "$BUILD_DIR" --parallel "$JOBS"
    log "built in $(( $(date +%s) - start )) s"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$STAMP"
fi

if [[ $INSTALL_PYTHON -eq 1 ]]; then
    log "installing LAMMPS's Python module into $PY"
    # install.py installs into $VIRTUAL_ENV's `python` when that is set; point it at the Python we built against
    (export PATH="$(dirname "$PY"):$PATH"; cmake --build "$BUILD_DIR" --target install-python)
    "$PY" - <<'EOF'
from lammps import lammps
lmp = lammps(cmdargs=["-nocite", "-log", "none", "-screen", "none"])
needed = {"ML-IAP", "PYTHON", "KOKKOS"}
missing = needed - set(lmp.installed_packages)
print("build_lammps.sh: LAMMPS %s, packages %s" % (lmp.version(), ", ".join(sorted(lmp.installed_packages))))
if missing:
    raise SystemExit("build_lammps.sh: error: the installed LAMMPS module lacks %s" % ", ".join(sorted(missing)))
import lammps.mliap
try:
    lammps.mliap.activate_mliappy(lmp)
    lammps.mliap.activate_mliappy_kokkos(lmp)
except Exception as error:
    raise SystemExit("build_lammps.sh: error: no ML-IAP Python coupling in this LAMMPS (%r)" % (error,))
print("build_lammps.sh: ML-IAP Python coupling (with KOKKOS) importable")
lmp.close()
EOF
fi
echo "LAMMPS build: $BUILD_ROOT"
echo "  executable: $BUILD_DIR/lmp"
echo "  library:    $BUILD_DIR/liblammps.so"
