#!/usr/bin/python3
"""libmoe against PyTorch: the same MoE layer, the same BLAS, the same kernels, the same threads.

Runs `moe bench --json` (libmoe, dynamic and static dispatch) and two reference MoE layers written
as a competent PyTorch user would, then prints them side by side:
  GShardLayer    capacity-limited, dense (T,E,C) dispatch/combine tensors and einsums (GShard);
  DroplessLayer  sort tokens by expert, torch.split, one nn.Linear pair per expert, index_add back.
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


class DroplessLayer(nn.Module):
    """Sort the T*k (token, expert) pairs by expert, split by the per-expert counts, run each
    expert's nn.Linear pair on its rows, scale by the combine weights, index_add_ into y."""

    def __init__(self, w, k):
        super().__init__()
        self.router, self.k = Router(w, k), k
        E, H, D = w["W1"].shape
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, D)) for _ in range(E))
        with torch.no_grad():
            for e, m in enumerate(self.experts):
                m[0].weight.copy_(w["W1"][e]), m[0].bias.copy_(w["b1"][e])
                m[2].weight.copy_(w["W2"][e]), m[2].bias.copy_(w["b2"][e])

    def forward(self, x):
        topw, topi, aux = self.router(x)
        flat_e = topi.reshape(-1)  # (T*k,) expert of each assignment
        _, order = torch.sort(flat_e, stable=True)
        tok = order // self.k  # token of each sorted assignment
        counts = torch.bincount(flat_e, minlength=len(self.experts)).tolist()
        parts = torch.split(x[tok], counts)
        ys = torch.cat([m(p) for m, p in zip(self.experts, parts)])
        ys = ys * topw.reshape(-1)[order, None]
        return x.new_zeros(x.shape).index_add_(0, tok, ys), aux


# ---- 5. both references compute the same function (nothing dropped: C = T) ----
def check_same(T=128, D=32, H=64, E=4, k=2, routing="skewed"):
    w = make_weights(D, H, E, routing, seed=1)
    gs, dl = GShardLayer(w, k), DroplessLayer(w, k)
    x = (torch.rand(T, D, generator=torch.Generator().manual_seed(2)) * 2 - 1).requires_grad_()
    dy = torch.randn(T, D, generator=torch.Generator().manual_seed(3))
    grads = []
    for run in (lambda: gs(x, capacity=T), lambda: dl(x)):
        x.grad = None
        y, aux = run()
        ((y * dy).sum() + AUX_COEF * aux).backward()
        grads.append((y.detach(), x.grad.clone()))
    for name, a, b in (("y", grads[0][0], grads[1][0]), ("dx", grads[0][1], grads[1][1])):
        rel = ((a - b).abs().max() / b.abs().max()).item()
        assert rel < 1e-4, "GShard and dropless %s differ: max relative error %.3g" % (name, rel)
        say("check T=%d D=%d H=%d E=%d k=%d %s: GShard (C=T) vs dropless %s max rel err %.2g: ok"
            % (T, D, H, E, k, routing, name, rel))


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
    # moe first, before torch has started its OpenMP threads, so they cannot compete with it
    moe = run_moe(cases, routings) if use_moe else {}
    if use_moe:
        say("moe: blas %s, threads %s" % (next(iter(moe.values()), {}).get("blas"),
                                          next(iter(moe.values()), {}).get("threads")))
    check_same()

    hdr = "%-4s %-7s | %9s %9s %9s %9s %7s %7s | %9s %9s %9s %9s %7s %7s | %8s" % (
        "case", "routing", "dyn", "static", "dropless", "gshard", "x drop", "x gs",
        "dyn", "static", "dropless", "gshard", "x drop", "x gs", "peak MB")
    say("%-12s | %-63s | %-63s |" % ("", "forward+backward ms (x: torch ms / moe dynamic ms)", "forward ms"))
    say(hdr)
    say("-" * len(hdr))
    fmt = lambda v, f="%9.2f": (f % v) if v is not None else "%*s" % (len(f % 0), "-")
    for c in cases:
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
            row["moe_peak_bytes"] = dyn.get("peak_bytes")
            row["moe_blas"] = dyn.get("blas")
            cols = []
            for p in ("fwdbwd", "fwd"):
                cols += [fmt(row["moe_dynamic_%s_ms" % p]), fmt(row["moe_static_%s_ms" % p]),
                         fmt(row["dropless_%s_ms" % p]), fmt(row["gshard_%s_ms" % p]),
                         fmt(row["speedup_%s_vs_dropless" % p], "%7.2f"),
                         fmt(row["speedup_%s_vs_gshard" % p], "%7.2f")]
            pk = row["moe_peak_bytes"]
            say("%-4s %-7s | %s | %s | %s" % (c, r, " ".join(cols[:6]), " ".join(cols[6:]),
                                             fmt(pk / 2**20 if pk is not None else None, "%8.1f")))
            if args.json:
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
