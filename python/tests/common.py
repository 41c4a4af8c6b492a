"""What the tests share: this source tree's libmoe package and the PyTorch reference of the MoE layer
(dev/gen_fixtures.py, which makes the C suite's fixtures; dev/gen_bf16_fixtures.py for bf16 experts)."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "dev")]

import gen_bf16_fixtures as GB  # noqa: E402
import gen_fixtures as G  # noqa: E402
import libmoe  # noqa: E402

__all__ = ["ROOT", "G", "GB", "libmoe", "RTOL", "ATOL", "BF16_TOL", "max_rel_err", "assert_close", "rel_norm",
           "layer_options", "raises"]

# as the C suite's fixture test: max |got - want| <= RTOL * max |want| + ATOL
RTOL, ATOL = 1e-5, 1e-7
# bf16 experts against their reference: |got - want| <= BF16_TOL |want| (Frobenius), as the C suite:
# float32 sums that land on the other side of a bf16 rounding boundary move single values by 2^-8
BF16_TOL = 1e-2


def max_rel_err(got, want):
    """max |got - want| / max |want| (the measure RTOL bounds)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), ATOL)) if want.size else 0.0


def assert_close(name, got, want, rtol=RTOL, atol=ATOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape}, want {want.shape}")
    err = np.abs(got - want)
    tol = rtol * (np.abs(want).max() if want.size else 0) + atol
    if want.size and not err.max() <= tol:
        i = np.unravel_index(err.argmax(), err.shape)
        raise AssertionError(f"{name}: max abs err {err.max():.3g} at {i} ({got[i]:.9g} vs {want[i]:.9g}), "
                             f"tolerance {tol:.3g} (rtol {rtol:g} of max|want| {np.abs(want).max():.3g})")


def rel_norm(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def layer_options(c):
    """libmoe.Layer keywords of a gen_fixtures case."""
    return dict(D=c["D"], H=c["H"], E=c["E"], top_k=c["k"], capacity_setting=float(c["cap"]),
                normalize_topk=c["normalize"], act=c["act"], dispatch=c["dispatch"], priority=c["priority"],
                router=c["router"], proj_dim=c["P"], gate_bias=c["bias"], expert_bias=c["bias"], threads=1,
                score=c["score"], select_bias=c["select_bias"], n_group=c["n_group"], topk_group=c["topk_group"],
                group_score=c["group_score"], routed_scale=float(c["routed_scale"]), shared_H=c["shared_H"],
                shared_gate=c["shared_gate"], swiglu_alpha=float(c["swiglu_alpha"]),
                swiglu_limit=float(c["swiglu_limit"]), seq_aux_alpha=float(c["seq_aux_alpha"]), seq_len=c["seq_len"])


def raises(test, name, fn, *args, contains=None, **kw):
    """fn(*args, **kw) must raise MoeError with status `name` (and a message containing `contains`)."""
    with test.assertRaises(libmoe.MoeError) as e:
        fn(*args, **kw)
    err = e.exception
    test.assertEqual(err.name, name, str(err))
    test.assertEqual(str(err), f"{name}: {err.message}")
    if contains:
        test.assertIn(contains, err.message)
    return err
