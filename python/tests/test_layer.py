"""The numpy Layer: its ctypes mirrors of moe.h, options, parameter views, files, and MoeError."""
import ctypes
import os
import tempfile
import unittest

import numpy as np

from common import assert_close, libmoe, raises
from libmoe import _structs


class Abi(unittest.TestCase):
    @unittest.skipUnless(os.environ.get("MOE_ABI"), "MOE_ABI not set (tests/test_python.c sets it from sizeof)")
    def test_struct_sizes_match_the_header(self):
        """tests/test_python.c passes sizeof of every mirrored struct as compiled from moe.h."""
        want = dict(kv.split("=") for kv in os.environ["MOE_ABI"].split())
        self.assertEqual(set(want), set(_structs.MIRRORS))
        for name, mirror in _structs.MIRRORS.items():
            self.assertEqual(ctypes.sizeof(mirror), int(want[name]), name)

    def test_layer_fields_read_back(self):
        """The mirror reads what moe_layer_init wrote: config, tensor table, and the params pointer
        where moe_layer_param finds each tensor."""
        layer = libmoe.Layer(D=6, H=10, E=3, act="swiglu", gate_bias=False, router="cosine", proj_dim=5)
        c = layer._c
        self.assertEqual((c.cfg.D, c.cfg.H, c.cfg.E, c.cfg.proj_dim), (6, 10, 3, 5))
        shapes = {n: a.shape for n, a in layer.params.items()}
        self.assertEqual(shapes, {"gate.weight": (3, 5), "gate.proj.weight": (5, 6), "gate.proj.bias": (5,),
                                  "gate.logit_scale": (1,), "experts.fc1.weight": (3, 10, 6),
                                  "experts.fc1.bias": (3, 10), "experts.fc2.weight": (3, 6, 10),
                                  "experts.fc2.bias": (3, 6), "experts.fc3.weight": (3, 10, 6)})
        self.assertGreaterEqual(c.numel, sum(a.size for a in layer.params.values()))  # aligned tensors
        moe_layer_param = libmoe.lib.moe_layer_param
        moe_layer_param.restype, moe_layer_param.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
        for n, a in layer.params.items():
            self.assertEqual(moe_layer_param(ctypes.addressof(c), n.encode()), a.ctypes.data, n)


class Options(unittest.TestCase):
    def test_defaults_come_from_the_library(self):
        c = libmoe.Layer(D=4, H=8, E=4).config
        self.assertEqual((c["top_k"], c["capacity_setting"], c["normalize_topk"], c["act"], c["dispatch"],
                          c["priority"], c["router"], c["dtype"]),
                         (2, 1.0, None, "relu", "dynamic", "index", "linear", "f32"))
        again = libmoe.Layer(**libmoe.Layer(D=4, H=8, E=4, act="gelu", normalize_topk=False,
                                            dispatch="static", dtype="bf16").config).config
        self.assertEqual((again["act"], again["normalize_topk"], again["dispatch"], again["dtype"]),
                         ("gelu", False, "static", "bf16"))

    def test_swiglu_oai(self):
        """gpt-oss's clamped SwiGLU: its options read back, fc3's bias, and one expert's output as numpy computes it."""
        layer = libmoe.Layer(D=4, H=6, E=1, top_k=1, act="swiglu_oai", swiglu_alpha=1.5, swiglu_limit=0.5, threads=1)
        self.assertEqual((layer.config["act"], layer.config["swiglu_alpha"], layer.config["swiglu_limit"]),
                         ("swiglu_oai", 1.5, 0.5))
        self.assertEqual(layer.params["experts.fc3.bias"].shape, (1, 6))
        rng = np.random.default_rng(4)
        for a in layer.params.values():
            a[...] = rng.standard_normal(a.shape)
        x = rng.standard_normal((5, 4)).astype(np.float32)
        y, _ = layer.forward(x)
        p = {n: a[0].astype(np.float64) for n, a in layer.params.items() if n.startswith("experts.")}
        g = np.minimum(x @ p["experts.fc1.weight"].T + p["experts.fc1.bias"], 0.5)
        u = np.clip(x @ p["experts.fc3.weight"].T + p["experts.fc3.bias"], -0.5, 0.5)
        want = ((u + 1) * g / (1 + np.exp(-1.5 * g))) @ p["experts.fc2.weight"].T + p["experts.fc2.bias"]
        assert_close("swiglu_oai y", y, want)
        raises(self, "MOE_ERR_ARG", libmoe.Layer, D=4, H=6, E=2, act="swiglu_oai", swiglu_limit=0,
               contains="swiglu_limit > 0")

    def test_top_k_per_call(self):
        layer = libmoe.Layer(D=4, H=8, E=4, threads=1)
        layer.init_params(1)
        layer.top_k = 3
        y, st = layer.forward(np.ones((5, 4)))
        self.assertEqual(st.experts.shape, (5, 3))
        self.assertEqual(int(st.expert_counts.sum()), 15)
        raises(self, "MOE_ERR_ARG", setattr, layer, "top_k", 5, contains="top_k must be in [1, 4], got 5")

    def test_micro_batches_give_the_same_bits(self):
        x = np.random.default_rng(3).standard_normal((40, 8), dtype=np.float32)
        out = []
        for opts in ({}, {"pipeline": 3, "memory_reuse": "s4"}):
            layer = libmoe.Layer(D=8, H=16, E=6, act="swiglu", threads=1, **opts)
            layer.init_params(5)
            y, _ = layer.forward(x)
            out.append((y.copy(), layer.backward(np.ones_like(y)).copy()))
        self.assertTrue(np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1]))
        raises(self, "MOE_ERR_ARG", libmoe.Layer, D=8, H=16, E=6, memory_reuse="s9", contains="none|s4")

    def test_expert_capacity(self):
        layer = libmoe.Layer(D=4, H=8, E=4, dispatch="static", top_k=1, threads=1)
        layer.init_params(2)
        x = np.random.default_rng(0).standard_normal((32, 4))
        counts = layer.forward(x)[1].expert_counts
        layer.set_expert_capacity([1, 1, 1, 1])
        st = layer.forward(x)[1]
        self.assertEqual(st.dropped, int(np.maximum(counts - 1, 0).sum()))
        raises(self, "MOE_ERR_SHAPE", layer.set_expert_capacity, [1, 1])


class Views(unittest.TestCase):
    def test_params_are_views_and_grads_accumulate(self):
        layer = libmoe.Layer(D=4, H=8, E=2, top_k=1, normalize_topk=True, threads=1)
        layer.init_params(3)
        x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
        y0, _ = layer.forward(x)
        layer.params["experts.fc2.bias"][...] += 1.0  # every token's one expert adds 1 * weight 1
        y1, _ = layer.forward(x)
        assert_close("y + 1", y1, y0 + 1)
        layer.zero_grad()
        layer.backward(np.ones_like(y1))
        g = layer.grads["experts.fc2.bias"].copy()
        self.assertEqual(float(g.sum()), 6 * 4)
        layer.forward(x)
        layer.backward(np.ones_like(y1))
        assert_close("grads add up", layer.grads["experts.fc2.bias"], 2 * g)

    def test_views_keep_the_layer_alive(self):
        w = libmoe.Layer(D=4, H=8, E=2).params["gate.weight"]
        w[...] = 3.0  # the Layer object is gone, its memory is not
        self.assertEqual(float(w.sum()), 3.0 * 8)

    def test_hierarchical_layer_names_inner_tensors(self):
        layer = libmoe.Layer(D=4, H=8, E=2, inner_experts=3, inner_top_k=1, threads=1)
        layer.init_params(4)
        self.assertIn("experts.1.experts.fc1.weight", layer.params)
        self.assertEqual(layer.params["experts.1.gate.weight"].shape, (3, 4))
        y, _ = layer.forward(np.ones((3, 4)))
        layer.backward(np.ones_like(y))
        self.assertGreater(float(np.abs(layer.grads["experts.0.experts.fc2.bias"]).sum() +
                                 np.abs(layer.grads["experts.1.experts.fc2.bias"]).sum()), 0)


class Files(unittest.TestCase):
    def test_save_load_round_trip(self):
        for dtype in ("f32", "bf16"):
            with self.subTest(dtype=dtype), tempfile.TemporaryDirectory() as d:
                a = libmoe.Layer(D=4, H=8, E=3, act="gelu", dispatch="static", capacity_setting=1.5,
                                 dtype=dtype, threads=1)
                a.init_params(5)
                x = np.random.default_rng(2).standard_normal((7, 4))
                a.forward(x)
                a.backward(np.ones((7, 4)))
                a.save(f"{d}/w.safetensors", grads=True)
                with self.assertRaises(libmoe.MoeError) as e:  # the grads are not layer tensors
                    libmoe.Layer.load(f"{d}/w.safetensors")
                self.assertEqual(e.exception.name, "MOE_ERR_FORMAT")
                a.save(f"{d}/w.safetensors")
                b = libmoe.Layer.load(f"{d}/w.safetensors", threads=1)
                self.assertEqual((b.config["act"], b.config["dispatch"], b.config["capacity_setting"],
                                  b.config["dtype"]), ("gelu", "static", 1.5, dtype))
                np.testing.assert_array_equal(a.forward(x)[0], b.forward(x)[0])
                c = libmoe.Layer.load(f"{d}/w.safetensors", top_k=1, dispatch="dynamic")
                self.assertEqual((c.top_k, c.config["dispatch"]), (1, "dynamic"))


class Errors(unittest.TestCase):
    """moe_last_error() and the status name reach Python as MoeError, for failures of the C library
    and for the arguments the package checks itself."""

    def test_c_failures(self):
        raises(self, "MOE_ERR_ARG", libmoe.Layer, D=0, H=8, E=4)
        raises(self, "MOE_ERR_ARG", libmoe.Layer, D=4, H=8, E=4, act="tanh", contains="act: unknown value 'tanh'")
        raises(self, "MOE_ERR_ARG", libmoe.Layer, D=4, H=8, E=4, dtype="f16", contains="dtype")
        layer = libmoe.Layer(D=4, H=8, E=4, threads=1)
        layer.init_params(1)
        raises(self, "MOE_ERR_STATE", layer.backward, contains="no forward pass")
        x = np.zeros((3, 4))
        x[1, 2] = np.inf
        raises(self, "MOE_ERR_VALUE", layer.forward, x, contains="x[1, 2] is inf")
        raises(self, "MOE_ERR_IO", libmoe.Layer.load, "/nonexistent/w.safetensors",
               contains="/nonexistent/w.safetensors")
        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/bad.safetensors", "wb") as f:
                f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
            raises(self, "MOE_ERR_FORMAT", libmoe.Layer.load, f"{d}/bad.safetensors")

    def test_python_side_checks(self):
        layer = libmoe.Layer(D=4, H=8, E=4, threads=1)
        raises(self, "MOE_ERR_ARG", libmoe.Layer, D=4, H=8, E=4, experts=3, contains="unknown option 'experts'")
        raises(self, "MOE_ERR_SHAPE", layer.forward, np.zeros((3, 5)), contains="want (*, 4)")
        layer.forward(np.zeros((3, 4)))
        raises(self, "MOE_ERR_SHAPE", layer.backward, np.zeros((2, 4)), contains="dy has shape (2, 4)")

    def test_the_exception_carries_the_status(self):
        err = raises(self, "MOE_ERR_ARG", libmoe.Layer, D=4, H=8, E=4, top_k=9)
        self.assertEqual(err.status, 1)
        self.assertIsInstance(err, Exception)


if __name__ == "__main__":
    unittest.main()
