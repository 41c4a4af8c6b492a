#!/usr/bin/python3
"""libmoe against PyTorch: the same MoE layer, the same BLAS, the same kernels, the same threads.

Runs `moe bench --json` (libmoe, dynamic and static dispatch) and two reference MoE layers written
as a competent PyTorch user would, then prints them side by side:
  GShardLayer    capacity-limited, dense (T,E,C) dispatch/combine tensors and einsums (GShard);
  DroplessLayer  written for speed: pairs sorted by expert once, one gather, torch.addmm / torch.mm per
                 expert into views of the sorted buffer, one index_add_ back, a hand-written backward.
Layer: y = sum_j w_j * W2_e relu(W1_e x + b1_e) + b2_e over the top-k experts e of a linear router
(with bias) + softmax; combine weights renormalized over the top-k when k > 1.
Loss for forward+backward: (y * dy).sum() + 0.01 * aux (GShard load-balancing loss), with a fixed dy;
gradients to every parameter and to x.

Debian's python3-torch links libblas.so.3, which the alternatives system points at OpenBLAS, the
library libmoe uses: the script checks which library is loaded and its kernel set.
OPENBLAS_CORETYPE must be set before torch is imported (OpenBLAS picks its kernels when loaded).

  bench/vs_pytorch.py [--cases S,M,L] [--routing uniform,skewed] [--threads N] [--reps R]
                      [--coretype NAME] [--moe PATH] [--torch-only] [--quick] [--json]
With --json the table and the setup lines go to stderr and one JSON object per case to stdout.
--quick: tiny shapes, torch layers only (a smoke test of a few seconds).
"""
import argparse, json, math, os, statistics, subprocess, sys, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {  # the standard cases of `moe bench`
    "S": dict(T=2048, D=512, H=2048, E=8, k=2),
    "M": dict(T=4096, D=1024, H=4096, E=16, k=2),
    "L": dict(T=4096, D=768, H=3072, E=64, k=1),
}
QUICK = {"Q1": dict(T=256, D=64, H=128, E=4, k=2), "Q2": dict(T=256, D=64, H=128, E=8, k=1)}
AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
AUX_COEF = 0.01

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--cases", default="S,M,L")
ap.add_argument("--routing", default="uniform,skewed")
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--coretype", default=None,
                help="OPENBLAS_CORETYPE (default: SKYLAKEX on AVX-512 CPUs; 'env': keep the environment's)")
ap.add_argument("--moe", default=os.path.join(REPO, "build", "moe"), help="the moe binary")
ap.add_argument("--torch-only", action="store_true", help="do not run moe bench")
ap.add_argument("--quick", action="store_true", help="tiny shapes, torch only (smoke test)")
ap.add_argument("--json", action="store_true", help="JSON lines on stdout, the table on stderr")
ap.add_argument("--malloc-default", action="store_true",
                help="keep glibc's malloc settings (by default large blocks are kept for reuse, see below)")
args = ap.parse_args()
out = sys.stderr if args.json else sys.stdout  # human-readable output


def say(*a):
    print(*a, file=out, flush=True)


# ---- 1. BLAS kernel set and threads, before torch (and its OpenBLAS) is loaded ----
def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# --coretype NAME wins; --coretype env keeps the environment's value (or none); by default SKYLAKEX
# on AVX-512 CPUs, even over an inherited value (which is reported), else the environment's.
inherited = os.environ.get("OPENBLAS_CORETYPE")
if args.coretype and args.coretype != "env":
    coretype = args.coretype
elif args.coretype is None and AVX512 <= cpu_flags():
    coretype = "SKYLAKEX"
else:
    coretype = inherited
if coretype:
    os.environ["OPENBLAS_CORETYPE"] = coretype
os.environ["OMP_NUM_THREADS"] = str(args.threads)

import ctypes  # noqa: E402

# PyTorch on CPU allocates each step's large tensors afresh; glibc serves blocks of 32 MB and more with
# mmap and hands them back on free, so every step pays a page fault per 4 KiB it touches (on this VM
# about as much as the experts' GEMMs at case S). Users are told to preload jemalloc or tcmalloc for
# this; the same effect without a package: no mmap for large blocks, no trimming of the heap, so freed
# blocks are reused (set before torch allocates anything). libmoe keeps its buffers between steps.
if not args.malloc_default:
    libc = ctypes.CDLL(None)
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
        sys.exit("vs_pytorch: mallopt refused the settings; rerun with --malloc-default")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)


def blas_report():
    """Torch's build-time BLAS lines, and the BLAS library actually mapped into this process,
    asked for its version and kernel set through OpenBLAS's own API."""
    cfg = [l.strip() for l in torch.__config__.show().splitlines() if "BLAS" in l or "LAPACK" in l]
    for l in cfg:
        say("torch config:", " ".join(p for p in l.split(", ") if "BLAS" in p or "LAPACK" in p) or l)
    with open("/proc/self/maps") as f:
        libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and l.split()[-1].startswith("/")})
    say("BLAS libraries mapped:", ", ".join(libs) or "none")
    ob = [p for p in libs if "libopenblas" in os.path.basename(p)]
    if not ob:
        sys.exit("vs_pytorch: torch does not use OpenBLAS here; the comparison would not be like for like")
    lib = ctypes.CDLL(ob[0])  # the already-loaded library: same handle, same state
    lib.openblas_get_config.restype = lib.openblas_get_corename.restype = ctypes.c_char_p
    lib.openblas_set_num_threads(args.threads)  # torch.set_num_threads also reaches it via OpenMP
    say("torch BLAS: %s; kernels %s; OpenBLAS threads %d; torch threads %d; OPENBLAS_CORETYPE=%s" % (
        lib.openblas_get_config().decode(), lib.openblas_get_corename().decode(),
        lib.openblas_get_num_threads(), torch.get_num_threads(), coretype or "(unset)"))
    if inherited and inherited != coretype:
        say("note: OPENBLAS_CORETYPE=%s from the environment replaced by %s (--coretype env keeps it)"
            % (inherited, coretype))
    say("malloc: " + ("glibc defaults (--malloc-default)" if args.malloc_default
                      else "large blocks from the heap, never trimmed: freed tensors reused without page faults"))


# ---- 2. the reference layers ----
def make_weights(D, H, E, routing, seed=0):
    """One set of weights for both layers. Skewed routing: gate bias -log(e+1)."""
    g = torch.Generator().manual_seed(seed)
    u = lambda shape, fan_in: (torch.rand(shape, generator=g) * 2 - 1) / math.sqrt(fan_in)
    bg = -torch.log(torch.arange(E, dtype=torch.float32) + 1) if routing == "skewed" else torch.zeros(E)
    return dict(Wg=u((E, D), D), bg=bg, W1=u((E, H, D), D), b1=u((E, H), D),
                W2=u((E, D, H), H), b2=u((E, D), H))


class Router(nn.Module):
    """Linear(D,E) + softmax + top-k; combine weights renormalized for k > 1; GShard aux loss."""

    def __init__(self, w, k):
        super().__init__()
        E, D = w["Wg"].shape
        self.k, self.E = k, E
        self.gate = nn.Linear(D, E)
        with torch.no_grad():
            self.gate.weight.copy_(w["Wg"]), self.gate.bias.copy_(w["bg"])

    def forward(self, x):
        probs = torch.softmax(self.gate(x), dim=-1)  # (T,E)
        topw, topi = torch.topk(probs, self.k, dim=-1)  # (T,k)
        if self.k > 1:
            topw = topw / topw.sum(-1, keepdim=True)
        # aux = E * sum_e mean_t(probs[:, e]) * (fraction of tokens whose first choice is e)
        frac1 = torch.bincount(topi[:, 0], minlength=self.E).to(x.dtype) / x.shape[0]
        aux = self.E * (probs.mean(0) * frac1).sum()
        return topw, topi, aux


class GShardLayer(nn.Module):
    """Capacity C = ceil(cf * k * T / E); slot-major positions (all first choices take slots before
    any second choice) via cumsum over one-hot masks; dense (T,E,C) dispatch and combine tensors."""

    def __init__(self, w, k, capacity_factor=1.25):
        super().__init__()
        self.router, self.k, self.cf = Router(w, k), k, capacity_factor
        self.W1, self.b1 = nn.Parameter(w["W1"].clone()), nn.Parameter(w["b1"].clone())
        self.W2, self.b2 = nn.Parameter(w["W2"].clone()), nn.Parameter(w["b2"].clone())

    def forward(self, x, capacity=None):
        T, E = x.shape[0], self.W1.shape[0]
        C = capacity or math.ceil(self.cf * self.k * T / E)
        topw, topi, aux = self.router(x)
        dispatch = x.new_zeros(T, E, C)
        combine = x.new_zeros(T, E, C)
        filled = x.new_zeros(E)  # slots taken in each expert by the earlier choices
        for s in range(self.k):
            mask = F.one_hot(topi[:, s], E).to(x.dtype)  # (T,E)
            loc = torch.cumsum(mask, dim=0) - 1 + filled  # position in the expert's buffer
            mask = mask * (loc < C)  # tokens over capacity are dropped
            filled = filled + mask.sum(0)
            pos = F.one_hot((loc * mask).sum(1).long(), C).to(x.dtype)  # (T,C)
            d = mask[:, :, None] * pos[:, None, :]  # (T,E,C)
            dispatch = dispatch + d
            combine = combine + topw[:, s, None, None] * d
        xe = torch.einsum("tec,td->ecd", dispatch, x)  # (E,C,D)
        h = torch.relu(torch.baddbmm(self.b1[:, None, :], xe, self.W1.transpose(1, 2)))  # (E,C,H)
        ye = torch.baddbmm(self.b2[:, None, :], h, self.W2.transpose(1, 2))  # (E,C,D)
        return torch.einsum("tec,ecd->td", combine, ye), aux


class SortedExperts(torch.autograd.Function):
    """The experts over the sorted buffer: one gather of the tokens in expert order, for each expert
    torch.addmm / torch.mm into views of preallocated buffers (no per-expert tensors, no torch.cat),
    the combine weights applied, one index_add_ back; backward written out the same way, so autograd
    records one node instead of a few per expert."""

    @staticmethod
    def forward(ctx, x, tok, counts, w, W1, b1, W2, b2):
        N, (E, H, D) = tok.numel(), W1.shape
        xs = x.index_select(0, tok)  # (N,D): the one gather
        h, ye = x.new_empty(N, H), x.new_empty(N, D)
        for e, (a, b) in enumerate(zip(counts[:-1], counts[1:])):
            if b > a:
                torch.addmm(b1[e], xs[a:b], W1[e].t(), out=h[a:b]).relu_()
                torch.addmm(b2[e], h[a:b], W2[e].t(), out=ye[a:b])
        ctx.save_for_backward(xs, h, ye, tok, w, W1, W2)
        ctx.counts, ctx.T = counts, x.shape[0]
        return x.new_zeros(x.shape).index_add_(0, tok, ye * w[:, None])  # the one scatter

    @staticmethod
    def backward(ctx, dy):
        xs, h, ye, tok, w, W1, W2 = ctx.saved_tensors
        dys = dy.index_select(0, tok)
        dw = (dys * ye).sum(1)
        dye = dys * w[:, None]
        dh, dxs = torch.empty_like(h), torch.empty_like(xs)
        dW1, dW2 = torch.empty_like(W1), torch.empty_like(W2)
        db1, db2 = W1.new_empty(W1.shape[:2]), W2.new_empty(W2.shape[:2])
        for e, (a, b) in enumerate(zip(ctx.counts[:-1], ctx.counts[1:])):
            if b == a:  # no rows: zero gradients, written once (not a zeroing pass over all of them)
                for g in (dW1, dW2, db1, db2):
                    g[e].zero_()
            else:
                torch.mm(dye[a:b].t(), h[a:b], out=dW2[e])
                torch.sum(dye[a:b], 0, out=db2[e])
                torch.mm(dye[a:b], W2[e], out=dh[a:b]).mul_(h[a:b] > 0)
                torch.mm(dh[a:b].t(), xs[a:b], out=dW1[e])
                torch.sum(dh[a:b], 0, out=db1[e])
                torch.mm(dh[a:b], W1[e], out=dxs[a:b])
        dx = dy.new_zeros(ctx.T, dy.shape[1]).index_add_(0, tok, dxs)
        return dx, None, None, dw, dW1, db1, dW2, db2


class DroplessLayer(nn.Module):
    """Dropless, written for speed: the T*k (token, expert) pairs sorted by expert once, the experts
    run on row ranges of the sorted buffer (SortedExperts), stacked (E,H,D) weights."""

    def __init__(self, w, k):
        super().__init__()
        self.router, self.k = Router(w, k), k
        self.W1, self.b1 = nn.Parameter(w["W1"].clone()), nn.Parameter(w["b1"].clone())
        self.W2, self.b2 = nn.Parameter(w["W2"].clone()), nn.Parameter(w["b2"].clone())

    def forward(self, x):
        topw, topi, aux = self.router(x)
        flat_e = topi.reshape(-1)  # (T*k,) expert of each assignment
        _, order = torch.sort(flat_e, stable=True)
        counts = [0] + torch.bincount(flat_e, minlength=self.W1.shape[0]).cumsum(0).tolist()
        y = SortedExperts.apply(x, order // self.k, counts, topw.reshape(-1)[order],
                                self.W1, self.b1, self.W2, self.b2)
        return y, aux

    def gemm_floor_ms(self, x, reps):
        """Median ms of the same forward+backward GEMMs alone (six per expert, the routing's row
        counts): what the layer costs without the gather, scatter, router and autograd."""
        with torch.no_grad():
            _, topi, _ = self.router(x)
            n = torch.bincount(topi.reshape(-1), minlength=self.W1.shape[0]).tolist()
            E, H, D = self.W1.shape
            a, g, hb = x.new_ones(max(n), D), x.new_ones(max(n), D), x.new_ones(max(n), H)
            def run():
                for e, c in enumerate(n):
                    if c:
                        torch.mm(a[:c], self.W1[e].t(), out=hb[:c])
                        torch.mm(hb[:c], self.W2[e].t(), out=g[:c])
                        torch.mm(g[:c].t(), hb[:c])
                        torch.mm(g[:c], self.W2[e], out=hb[:c])
                        torch.mm(hb[:c].t(), a[:c])
                        torch.mm(hb[:c], self.W1[e], out=g[:c])
            run()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                run()
                ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)


# ---- 5. both references compute the same function (nothing dropped: C = T) ----
def check_same(T=128, D=32, H=64, E=4, k=2, routing="skewed"):
    """y, dx and every parameter's gradient of the two layers; the dropless layer's hand-written
    backward is checked here against the GShard layer's autograd."""
    w = make_weights(D, H, E, routing, seed=1)
    gs, dl = GShardLayer(w, k), DroplessLayer(w, k)
    x = (torch.rand(T, D, generator=torch.Generator().manual_seed(2)) * 2 - 1).requires_grad_()
    dy = torch.randn(T, D, generator=torch.Generator().manual_seed(3))
    res = []
    for layer, run in ((gs, lambda: gs(x, capacity=T)), (dl, lambda: dl(x))):
        x.grad = None
        y, aux = run()
        ((y * dy).sum() + AUX_COEF * aux).backward()
        res.append(dict(y=y.detach(), dx=x.grad.clone(), **{n: p.grad for n, p in layer.named_parameters()}))
    for name in res[0]:
        a, b = res[0][name], res[1][name]
        rel = ((a - b).abs().max() / b.abs().max()).item()
        assert rel < 1e-4, "GShard and dropless %s differ: max relative error %.3g" % (name, rel)
    say("check T=%d D=%d H=%d E=%d k=%d %s: GShard (C=T) vs dropless, y, dx and %d parameter gradients"
        " within 1e-4 relative: ok" % (T, D, H, E, k, routing, len(res[0]) - 2))


def time_layer(layer, x, dy, reps):
    """Median ms of forward (no_grad) and of forward+backward, after one warm-up of each."""
    def fwd():
        with torch.no_grad():
            layer(x)

    def fwdbwd():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        y, aux = layer(x)
        ((y * dy).sum() + AUX_COEF * aux).backward()

    res = []
    for fn in (fwd, fwdbwd):
        fn()  # warm-up
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        res.append(statistics.median(ts))
    return res  # fwd_ms, fwdbwd_ms


def run_torch(shape, routing, reps):
    T, D, H, E, k = (shape[n] for n in "TDHEk")
    w = make_weights(D, H, E, routing)
    g = torch.Generator().manual_seed(4)
    x = (torch.rand(T, D, generator=g) * 2 - 1).requires_grad_()
    dy = torch.randn(T, D, generator=g)
    r = {}
    for name, layer in (("dropless", DroplessLayer(w, k)), ("gshard", GShardLayer(w, k))):
        r[name + "_fwd_ms"], r[name + "_fwdbwd_ms"] = time_layer(layer, x, dy, reps)
        if name == "dropless":
            r["mm_floor_fwdbwd_ms"] = layer.gemm_floor_ms(x, reps)
        del layer
    return r


# ---- 3. libmoe: moe bench --json, same threads and kernels ----
def run_moe(cases, routings):
    if not os.access(args.moe, os.X_OK):
        sys.exit("vs_pytorch: no moe binary at %s (build it, or pass --moe PATH / --torch-only)" % args.moe)
    cmd = [args.moe, "bench", "--json", "--cases", ",".join(cases), "--routing", ",".join(routings),
           "--dispatch", "dynamic,static", "--threads", str(args.threads), "--reps", str(args.reps)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    say("running:", " ".join(cmd))
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("vs_pytorch: `%s` failed (exit %d); does this moe have the bench command?\n%s"
                 % (" ".join(cmd), p.returncode, p.stderr.strip()))
    rows = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            rows[(j["case"], j["routing"], j["dispatch"])] = j
    missing = [k for k in ((c, r, d) for c in cases for r in routings for d in ("dynamic", "static"))
               if k not in rows]
    if missing:
        say("warning: moe bench printed no result for", ", ".join("/".join(k) for k in missing))
    for (c, r, d), j in rows.items():  # moe's cases must be the shapes torch runs
        if c in CASES and any(int(j[n]) != v for n, v in CASES[c].items()):
            sys.exit("vs_pytorch: moe case %s has shape %s, expected %s" % (c, {n: j[n] for n in "TDHEk"}, CASES[c]))
    return rows


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def main():
    table = QUICK if args.quick else CASES
    cases = list(table) if args.quick else [c.strip() for c in args.cases.split(",") if c.strip()]
    routings = [r.strip() for r in args.routing.split(",") if r.strip()]
    for c in cases:
        if c not in table:
            sys.exit("vs_pytorch: unknown case %s (known: %s)" % (c, ",".join(table)))
    for r in routings:
        if r not in ("uniform", "skewed"):
            sys.exit("vs_pytorch: unknown routing %s (uniform or skewed)" % r)
    blas_report()
    use_moe = not (args.quick or args.torch_only)
    check_same()

    hdr = "%-4s %-7s | %9s %9s %9s %9s %9s %7s %7s %7s | %9s %9s %9s %9s %7s %7s | %8s" % (
        "case", "routing", "dyn", "static", "dropless", "mm only", "gshard", "x drop", "x gs", "drop/mm",
        "dyn", "static", "dropless", "gshard", "x drop", "x gs", "peak MB")
    say("%-12s | %-83s | %-63s |" % ("", "forward+backward ms (x: torch ms / moe dynamic ms)", "forward ms"))
    say(hdr)
    say("-" * len(hdr))
    fmt = lambda v, f="%9.2f": (f % v) if v is not None else "%*s" % (len(f % 0), "-")
    for c in cases:
        # interleaved: each case's moe bench right before its torch layers, so a slower spell of a
        # shared machine falls on both sides
        moe = run_moe([c], routings) if use_moe else {}
        for r in routings:
            row = dict(case=c, routing=r, threads=args.threads, reps=args.reps,
                       coretype=coretype, **table[c])
            row.update(run_torch(table[c], r, args.reps))
            dyn, sta = moe.get((c, r, "dynamic"), {}), moe.get((c, r, "static"), {})
            for p in ("fwd", "fwdbwd"):
                row["moe_dynamic_%s_ms" % p] = dyn.get(p + "_ms")
                row["moe_static_%s_ms" % p] = sta.get(p + "_ms")
                row["speedup_%s_vs_dropless" % p] = ratio(row["dropless_%s_ms" % p], row["moe_dynamic_%s_ms" % p])
                row["speedup_%s_vs_gshard" % p] = ratio(row["gshard_%s_ms" % p], row["moe_dynamic_%s_ms" % p])
            row["dropless_over_mm_floor"] = ratio(row["dropless_fwdbwd_ms"], row["mm_floor_fwdbwd_ms"])
            row["moe_peak_bytes"] = dyn.get("peak_bytes")
            row["moe_blas"] = dyn.get("blas")
            cols = []
            for p in ("fwdbwd", "fwd"):
                mm = [fmt(row["mm_floor_fwdbwd_ms"])] if p == "fwdbwd" else []
                cols.append(" ".join([fmt(row["moe_dynamic_%s_ms" % p]), fmt(row["moe_static_%s_ms" % p]),
                                      fmt(row["dropless_%s_ms" % p])] + mm + [fmt(row["gshard_%s_ms" % p]),
                                      fmt(row["speedup_%s_vs_dropless" % p], "%7.2f"),
                                      fmt(row["speedup_%s_vs_gshard" % p], "%7.2f")] +
                                     ([fmt(row["dropless_over_mm_floor"], "%7.2f")] if mm else [])))
            pk = row["moe_peak_bytes"]
            say("%-4s %-7s | %s | %s | %s" % (c, r, cols[0], cols[1],
                                             fmt(pk / 2**20 if pk is not None else None, "%8.1f")))
            if args.json:
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
