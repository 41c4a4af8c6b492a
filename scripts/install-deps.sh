#!/bin/sh
# Installs the Debian packages the build needs, only those missing; safe to run again.
set -e
PKGS="cmake make gcc pkgconf libopenblas-openmp-dev libdnnl-dev libcjson-dev libpng-dev openmpi-bin libopenmpi-dev python3-numpy python3-torch"
# scripts/fuzz.sh: clang, its libFuzzer and sanitizer runtimes, and its OpenMP runtime.
PKGS="$PKGS clang libclang-rt-14-dev libomp-dev"
# moe serve: libmicrohttpd; its tests and bench/serve_load.sh: curl and ab (apache2-utils).
PKGS="$PKGS libmicrohttpd-dev curl apache2-utils"
# the tokenizer's pre-tokenizers: PCRE2 (Unicode classes); its normalizers: utf8proc (NFC, NFKC)
PKGS="$PKGS libpcre2-dev libutf8proc-dev"
missing=""
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing:$missing"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
