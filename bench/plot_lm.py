#!/usr/bin/env python3
"""Validation loss against wall time of the MoE and dense language models (bench/lm_moe_vs_dense.sh),
from their JSON logs, as an SVG line chart; prints the points. Standard library only.
Usage: plot_lm.py DIR OUT.svg"""
import json
import os
import sys

RUNS = [("moe", "MoE, 8 experts top-2", "#e8590c"), ("dense", "dense, same active size", "#3b528b")]


def curve(path):
    """(seconds of training so far, validation loss) at each report (the train_seconds each gives)."""
    pts = []
    for line in open(path):
        e = json.loads(line)
        if "train_seconds" in e:
            pts.append((e["train_seconds"], e["valid_loss"]))
    return pts


def main():
    d, out = sys.argv[1], sys.argv[2]
    curves = [(label, color, curve(os.path.join(d, name + ".jsonl"))) for name, label, color in RUNS]
    for label, _, pts in curves:
        print(label + ": " + ", ".join("%.0f s %.3f" % p for p in pts))
    W, H, L, R, T, B = 640, 400, 60, 20, 20, 50
    xmax = max(p[0] for _, _, c in curves for p in c)
    ys = [p[1] for _, _, c in curves for p in c]
    ymin, ymax = min(ys), max(ys)
    ymax = ymax if ymax > ymin else ymin + 1  # one point, or all equal
    X = lambda x: L + (W - L - R) * x / xmax
    Y = lambda y: T + (H - T - B) * (ymax - y) / (ymax - ymin)
    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
         % (W, H), '<rect width="100%" height="100%" fill="white"/>']
    s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - R, H - B))
    s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, T, L, H - B))
    for i in range(6):
        x, y = xmax * i / 5, ymin + (ymax - ymin) * i / 5
        s.append('<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>' % (X(x), H - B + 16, x))
        s.append('<text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (L - 4, Y(y) + 4, y))
    s.append('<text x="%d" y="%d" text-anchor="middle">training seconds</text>' % ((W + L) // 2, H - 12))
    s.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">validation loss</text>'
             % ((H - B) // 2, (H - B) // 2))
    for i, (label, color, pts) in enumerate(curves):
        s.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                 % (color, " ".join("%.1f,%.1f" % (X(x), Y(y)) for x, y in pts)))
        s.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - R - 200, T + 16 + 16 * i, color, label))
    s.append("</svg>")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(s) + "\n")
    os.replace(tmp, out)


main()
