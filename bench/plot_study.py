#!/usr/bin/env python3
"""Test accuracy against normalized training time (DynaMoE Figure 9) from the JSON logs that
bench/capacity_study.sh keeps, as an SVG line chart. Standard library only.
Usage: plot_study.py DIR OUT.svg"""
import json
import os
import sys

RUNS = ["1.0", "2.0", "3.0", "4.0", "dynamic"]
COLORS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#e8590c"]


def curve(path):
    """(cumulative seconds, test accuracy) after each epoch of one run."""
    t, pts = 0.0, []
    for line in open(path):
        if line.startswith('{"epoch"') and "test_accuracy" in line:  # not the run's closing {"test_accuracy": ...}
            e = json.loads(line)
            steps = e["steps"] - (pts[-1][2] if pts else 0)
            t += steps / e["steps_per_s"]
            pts.append((t, e["test_accuracy"], e["steps"]))
    return [(a, b) for a, b, _ in pts]


def main():
    d, out = sys.argv[1], sys.argv[2]
    curves = {r: curve(os.path.join(d, r + ".jsonl")) for r in RUNS if os.path.exists(os.path.join(d, r + ".jsonl"))}
    base = curves["1.0"][-1][0]  # normalized by the total time of capacity factor 1.0
    W, H, L, R, T, B = 640, 400, 70, 150, 40, 50
    x0, x1 = 0.0, max(c[-1][0] for c in curves.values()) / base
    y0, y1 = 0.90, 0.99
    X = lambda v: L + (v - x0) / (x1 - x0) * (W - L - R)
    Y = lambda v: H - B - (min(max(v, y0), y1) - y0) / (y1 - y0) * (H - T - B)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="14">MNIST test accuracy against training time (normalized to capacity 1.0)</text>']
    for i in range(10):
        v = y0 + i * (y1 - y0) / 9
        s.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{L - 8}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for i in range(6):
        v = x0 + i * (x1 - x0) / 5
        s.append(f'<text x="{X(v):.1f}" y="{H - B + 18}" text-anchor="middle">{v:.2f}</text>')
    s.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">normalized training time</text>')
    s.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" text-anchor="middle">test accuracy</text>')
    for k, (r, c) in enumerate(curves.items()):
        col = COLORS[RUNS.index(r)]
        pts = " ".join(f"{X(t / base):.1f},{Y(a):.1f}" for t, a in c)
        s.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="2"/>')
        label = "dynamic" if r == "dynamic" else f"static {r}"
        s.append(f'<line x1="{W - R + 15}" x2="{W - R + 40}" y1="{T + 20 + 20 * k}" y2="{T + 20 + 20 * k}" stroke="{col}" stroke-width="3"/>')
        s.append(f'<text x="{W - R + 46}" y="{T + 24 + 20 * k}">{label}</text>')
    s.append("</svg>")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(s) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    print("wrote", out)


if __name__ == "__main__":
    main()
