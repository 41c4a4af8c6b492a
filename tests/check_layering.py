#!/usr/bin/env python3
"""The library's layering (DESIGN section 1), read off the built objects' symbols (nm): the core
(base, kernels, formats, dist, layer, transports, sources) uses no symbol of a feature folder (flex,
adapt, serve, sim, shard), a client folder (model, lm) or the wiring, and no two core files use each
other's symbols in a circle, hierarchical experts calling the layer excepted.

    tests/check_layering.py OBJECT_DIR    (the moe_obj target's objects: BUILD/CMakeFiles/moe_obj.dir/src)

Prints each offending edge with the symbol that makes it, and exits 1 if there is any."""
import collections
import glob
import os
import subprocess
import sys

CORE = {"base", "kernels", "formats", "dist", "layer", "transports", "sources"}
ALLOWED_CYCLE = {frozenset({"sources/inner.c", "layer/layer.c"})}  # hierarchical experts call the layer


def symbols(objs):
    """{object: (symbols it defines, symbols it uses)}, from one nm over all of them (a process each took
    20 s for the library's objects)."""
    table = {o: (set(), set()) for o in objs}
    out = subprocess.run(["nm", "-A"] + objs, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        obj, _, rest = line.partition(":")
        f = rest.split()
        if len(f) == 3 and f[1] in "TDBRC":
            table[obj][0].add(f[2])
        elif len(f) == 2 and f[0] == "U":
            table[obj][1].add(f[1])
    return table


def main(root):
    objs = sorted(glob.glob(os.path.join(root, "*", "*.c.o")))
    if not objs:
        print(f"check_layering: no objects under {root}")
        return 1
    owner, uses = {}, {}
    for o, (d, u) in symbols(objs).items():
        name = os.path.relpath(o, root)[:-2]
        for s in d:
            owner[s] = name
        uses[name] = u
    folder = lambda n: n.split("/")[0]
    edges = collections.defaultdict(dict)  # file -> {file it uses: a symbol}
    for n, u in uses.items():
        for s in sorted(u):
            if s in owner and owner[s] != n:
                edges[n].setdefault(owner[s], s)
    bad = 0
    for n in sorted(edges):
        for d, s in sorted(edges[n].items()):
            if folder(n) in CORE and folder(d) not in CORE:
                print(f"core file {n} uses {s} of {d}")
                bad += 1
    # circles among core files: strongly connected components of the use graph
    graph = {n: [d for d in edges[n] if folder(d) in CORE] for n in uses if folder(n) in CORE}
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 and frozenset(comp) not in ALLOWED_CYCLE:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    for c in comps:
        print("core files in a circle: " + ", ".join(f"{a} uses {edges[a][b]} of {b}" for a in c for b in c if b in edges[a]))
        bad += 1
    print(f"check_layering: {len(objs)} objects, {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
