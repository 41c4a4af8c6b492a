#!/usr/bin/env python3
"""Tokens/s against concurrency of moe serve (bench/serve_load.sh's results.jsonl): ab's non-streamed
and the asyncio client's streamed, all experts resident and --cache E/4, as an SVG line chart (log2
concurrency axis). Standard library only. Usage: plot_serve.py RESULTS.jsonl OUT.svg"""
import json
import math
import sys

rows = [json.loads(l) for l in open(sys.argv[1])]
series = [("all resident, ab", 0, "ab", "#3b528b", ""), ("all resident, streamed", 0, "st", "#3b528b", "6,4"),
          ("--cache E/4, ab", 2, "ab", "#e8590c", ""), ("--cache E/4, streamed", 2, "st", "#e8590c", "6,4")]
W, H, L, R, T, B = 640, 400, 70, 190, 30, 50
xs = sorted({r["stream"]["concurrency"] for r in rows})
val = lambda r, k: r["ab_tokens_per_s"] if k == "ab" else r["stream"]["tokens_per_s"]
top = max(val(r, k) for r in rows for k in ("ab", "st")) * 1.1 or 1
px = lambda c: L + (W - L - R) * (math.log2(c) - math.log2(xs[0])) / max(1e-9, math.log2(xs[-1]) - math.log2(xs[0]))
py = lambda v: H - B - (H - T - B) * v / top
out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
       '<rect width="100%" height="100%" fill="white"/>',
       '<text x="%d" y="18" font-size="14">moe serve: tokens/s against concurrency (noisy: shared machine)</text>' % L]
for c in xs:
    out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%d</text>'
               % (px(c), T, px(c), H - B, px(c), H - B + 16, c))
for i in range(6):
    v = top * i / 5
    out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>'
               % (L, py(v), W - R, py(v), L - 6, py(v) + 4, v))
out.append('<text x="%d" y="%d" text-anchor="middle">concurrent clients</text>' % ((L + W - R) // 2, H - 12))
for n, (name, cache, k, color, dash) in enumerate(series):
    pts = sorted((r["stream"]["concurrency"], val(r, k)) for r in rows if r["cache"] == cache)
    out.append('<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>'
               % (color, dash, " ".join("%.1f,%.1f" % (px(c), py(v)) for c, v in pts)))
    y = T + 20 * n + 10
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>'
               '<text x="%d" y="%d">%s</text>' % (W - R + 10, y, W - R + 40, y, color, dash, W - R + 46, y + 4, name))
    print(name, pts)
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
