#!/bin/sh
# ctest "install": `cmake --install BUILD` into a temporary prefix, then the README example EXAMPLE built
# against that tree as a user would (pkg-config for libmoe.so and libmoe.a, find_package(libmoe)) and run,
# and the installed Python package imported from the tree (finding the installed libmoe.so.0) and run.
# Usage: test-install.sh BUILD EXAMPLE LIBDIR OPENBLAS_DIR PYTHON PYTHONDIR [CFLAGS]
#   LIBDIR: CMAKE_INSTALL_LIBDIR; OPENBLAS_DIR: the OpenMP OpenBLAS; PYTHON, PYTHONDIR: the interpreter and
#   where the package is installed ("" when CMake found no python3); CFLAGS: the sanitizers, if any
set -eu
build=$1 example=$2 libdir=$3 openblas=$4 python=$5 pythondir=$6 cflags=${7:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL install: $*"; exit 1; }
step() { # runs "$@" quietly; on failure shows its output
  "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "$*"; }
}
# Every program below must start by its run path alone.
unset LD_LIBRARY_PATH
prefix=$tmp/prefix lib=$tmp/prefix/$libdir

# cmake --install rewrites BUILD/install_manifest.txt: the user's own install keeps its manifest.
manifest=$build/install_manifest.txt
[ ! -e "$manifest" ] || cp -p "$manifest" "$tmp/manifest"
step cmake --install "$build" --prefix "$prefix"
if [ -e "$tmp/manifest" ]; then mv "$tmp/manifest" "$manifest"; else rm -f "$manifest"; fi

[ "$(readlink "$lib/libmoe.so")" = libmoe.so.0 ] || fail "libmoe.so -> $(readlink "$lib/libmoe.so"), want libmoe.so.0"
readelf -d "$lib/libmoe.so" | grep -q 'SONAME.*\[libmoe.so.0\]' || fail "libmoe.so: SONAME is not libmoe.so.0"
internal=$(nm -D --defined-only "$lib/libmoe.so" | awk '$3 !~ /^moe_[^_]/' | head -5)
[ -z "$internal" ] || fail "libmoe.so exports non-public symbols: $internal"

# The README's two compile lines (CFLAGS only adds the sanitizers in the ASan build).
export PKG_CONFIG_PATH="$lib/pkgconfig"
shared=$(pkg-config --cflags --libs libmoe) || fail "pkg-config libmoe"
static=$(pkg-config --static --cflags --libs libmoe-static) || fail "pkg-config --static libmoe-static"
step cc $cflags "$example" -o "$tmp/shared" $shared
step cc $cflags "$example" -o "$tmp/static" $static
readelf -d "$tmp/shared" | grep -q 'NEEDED.*\[libmoe.so.0\]' || fail "cc ex.c $shared: does not load libmoe.so.0"
! readelf -d "$tmp/static" | grep -q 'NEEDED.*libmoe' || fail "cc ex.c $static: loads libmoe.so"

step cmake -S "$here/install-test" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DEXAMPLE="$example" \
     -DCMAKE_C_FLAGS="$cflags"
step cmake --build "$tmp/cmake" -j 2

# Each loads the OpenMP OpenBLAS; the example exits 0 only when its results are right.
for p in "$prefix/bin/moe" "$tmp/shared" "$tmp/static" "$tmp/cmake/example_shared" "$tmp/cmake/example_static"; do
  ldd "$p" | grep -q "libopenblas.so.0 => $openblas/" || { ldd "$p"; fail "$p: not the OpenBLAS in $openblas"; }
done
step "$prefix/bin/moe" --version
for p in "$tmp/shared" "$tmp/static" "$tmp/cmake/example_shared" "$tmp/cmake/example_static"; do
  step "$p"
done
echo "install: libmoe.so.0 exports moe_* only; 4 programs built against $prefix and run"

# The Python package as a user imports it: from the installed tree, outside the source tree.
if [ -z "$pythondir" ]; then
  echo "SKIP install (python): CMake found no python3, so the package was not installed"
elif [ -n "$cflags" ]; then
  echo "SKIP install (python): sanitizer build (python would need libasan preloaded)"
elif ! "$python" -c 'import numpy' 2>/dev/null; then
  echo "SKIP install (python): $python lacks numpy (apt-get install python3-numpy)"
else
  cd "$tmp"
  step env -u MOE_LIBRARY PYTHONPATH="$prefix/$pythondir" PYTHONDONTWRITEBYTECODE=1 "$python" -c '
import os, sys
import numpy as np
import libmoe
from libmoe import _lib
prefix = sys.argv[1]
assert libmoe.__file__.startswith(prefix + "/"), libmoe.__file__
assert os.path.realpath(_lib.lib._name) == os.path.realpath(prefix + "/" + sys.argv[2] + "/libmoe.so.0"), _lib.lib._name
layer = libmoe.Layer(D=8, H=16, E=4, top_k=2)
layer.init_params(1)
y, stats = layer.forward(np.ones((5, 8), dtype=np.float32))
assert y.shape == (5, 8) and stats.expert_counts.sum() == 10, (y.shape, stats.expert_counts)
' "$prefix" "$libdir"
  echo "install: the Python package imported from $prefix/$pythondir, on the installed libmoe.so.0"
fi
