"""libmoe against the PyTorch reference layer of dev/gen_fixtures.py (float64, DESIGN 4.1) on every case
of that script: outputs, losses and every gradient within RTOL = 1e-5 of the largest reference value
(as the C suite's fixture test), through libmoe.torch.MoELayer (autograd) and through the numpy Layer
(with the spec output and its cotangent). bf16 experts against dev/gen_bf16_fixtures.py's reference
within BF16_TOL (Frobenius). Run as a script, prints the largest relative error of each case."""
import sys
import unittest

import numpy as np
import torch

from common import BF16_TOL, G, GB, assert_close, layer_options, libmoe, max_rel_err, rel_norm
from libmoe.torch import MoELayer


def reference(c, bf16=False, spec=True):
    """(inputs in float32, reference forward dict, reference gradients) of case c; spec=False leaves the
    spec term out of the loss (the module has no spec output)."""
    w, x, dy, daux, dz, dspec = G.make_inputs(c)
    if bf16:  # the stored expert weights are bf16 values, as in the bf16 fixtures
        w = {n: GB.bf(t) if n in GB.BF16_WEIGHTS else t for n, t in w.items()}
    if not spec:
        dspec = torch.zeros_like(dspec)
    d = lambda t: t.to(torch.float64)  # noqa: E731
    grads_of = GB.bf16_reference_grads if bf16 else G.moe_reference_grads
    r, g = grads_of({n: d(t) for n, t in w.items()}, d(x), G.cfg_of(c), d(dy), float(daux), float(dz), d(dspec))
    return (w, x, dy, float(daux), float(dz), dspec), r, g


def module_run(c, dtype="f32"):
    """The module on case c: {name: (got, want)} for y, the losses and every gradient."""
    (w, x, dy, daux, dz, _), r, g = reference(c, bf16=dtype == "bf16", spec=False)
    m = MoELayer(**layer_options(c), dtype=dtype)
    m.load_state_dict(w)
    x = x.clone().requires_grad_(True)
    y = m(x)
    ((dy * y).sum() + daux * m.aux_loss + dz * m.z_loss).backward()
    out = {"y": (y, r["y"]), "aux_loss": (m.aux_loss, r["aux_loss"]), "z_loss": (m.z_loss, r["z_loss"]),
           "experts": (torch.from_numpy(m.stats.experts), r["topk_idx"]), "grad.x": (x.grad, g["x"])}
    out.update({"grad." + n: (p.grad, g[n]) for n, p in m.named_parameters()})
    return {n: (a.detach().numpy(), b.detach().numpy()) for n, (a, b) in out.items()}


def layer_run(c):
    """The numpy Layer on case c, spec included: {name: (got, want)}."""
    (w, x, dy, daux, dz, dspec), r, g = reference(c)
    layer = libmoe.Layer(**layer_options(c))
    for n, t in w.items():
        layer.params[n][...] = t.numpy()
    y, st, spec = layer.forward(x.numpy(), spec=True)
    dx = layer.backward(dy.numpy(), daux, dz, dspec=dspec.numpy())
    out = {"y": (y, r["y"]), "spec": (spec, r["spec"]), "aux_loss": (st.aux_loss, r["aux_loss"]),
           "z_loss": (st.z_loss, r["z_loss"]), "grad.x": (dx, g["x"])}
    out.update({"grad." + n: (layer.grads[n], g[n]) for n in w})
    return {n: (np.asarray(a), np.asarray(b.detach().numpy())) for n, (a, b) in out.items()}


class Parity(unittest.TestCase):
    def test_module_matches_reference(self):
        for c in G.CASES:
            with self.subTest(case=c["name"]):
                res = module_run(c)
                got, want = res.pop("experts")
                np.testing.assert_array_equal(got, want, err_msg=f"{c['name']}: routing")
                for n, (got, want) in res.items():
                    assert_close(f"{c['name']} {n}", got, want)

    def test_numpy_layer_matches_reference(self):
        for c in G.CASES:
            with self.subTest(case=c["name"]):
                for n, (got, want) in layer_run(c).items():
                    assert_close(f"{c['name']} {n}", got, want)

    def test_bf16_module_matches_bf16_reference(self):
        for c in GB.CASES:
            with self.subTest(case=c["name"]):
                res = module_run(c, "bf16")
                got, want = res.pop("experts")
                np.testing.assert_array_equal(got, want, err_msg=f"{c['name']}: routing")
                for n, (got, want) in res.items():
                    err = rel_norm(got, want)
                    self.assertLessEqual(err, BF16_TOL, f"{c['name']} {n}: relative Frobenius error {err:.3g}")
                # and the experts did compute in bf16: the fp32 layer's y is farther than that
                (w, x, *_), _, _ = reference(c, bf16=True)
                with torch.no_grad():
                    fp32 = G.moe_reference({n: t.double() for n, t in w.items()}, x.double(), G.cfg_of(c))["y"]
                self.assertGreater(rel_norm(res["y"][0], fp32), 1e-4, f"{c['name']}: y as the fp32 layer's")


def figures():
    """The largest error of each case (the tests' measures) as a table."""
    rows = [("fp32 module", G.CASES, lambda c: module_run(c), max_rel_err),
            ("fp32 numpy layer", G.CASES, layer_run, max_rel_err),
            ("bf16 module", GB.CASES, lambda c: module_run(c, "bf16"), rel_norm)]
    for what, cases, run, measure in rows:
        print(f"{what} ({'max |err| / max |ref|' if measure is max_rel_err else '|err| / |ref| (Frobenius)'}):")
        for c in cases:
            res = run(c)
            res.pop("experts", None)
            worst = max(res, key=lambda n: measure(*res[n]))
            print(f"  {c['name']:36s} worst {worst:22s} {measure(*res[worst]):.2e}")


if __name__ == "__main__":
    figures() if sys.argv[1:] == ["--figures"] else unittest.main()
