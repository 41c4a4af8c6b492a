"""The classifier, its optimizer and checkpoints, the learning-rate schedule and the IDX reader."""
import copy
import math
import struct
import tempfile
import unittest

import numpy as np

from common import assert_close, libmoe, raises


def toy(n=96, seed=0):
    """Separable 12-feature data with 3 classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n).astype(np.uint8)
    x = rng.standard_normal((n, 12)).astype(np.float32) * 0.3
    x[np.arange(n), labels] += 2.0
    return x, labels


def write_idx(path, magic, array):
    with open(path, "wb") as f:
        f.write(struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes())


class ModelTest(unittest.TestCase):
    def make(self, **kw):
        opts = dict(in_dim=12, classes=3, D=8, H=16, E=4, act="gelu", threads=1)
        opts.update(kw)
        m = libmoe.Model(**opts)
        m.init_params(1)
        return m

    def test_tensors_and_config(self):
        m = self.make(blocks=2, aux_weight=0.05)
        self.assertEqual(m.params["in.weight"].shape, (8, 12))
        self.assertEqual(m.params["blocks.1.moe.experts.fc1.weight"].shape, (4, 16, 8))
        self.assertEqual(list(m.params), list(m.grads))
        c = m.config
        self.assertEqual((c["blocks"], c["loss"], c["act"], c["E"]), (2, "cooperation", "gelu", 4))
        self.assertAlmostEqual(c["aux_weight"], 0.05, places=6)

    def test_training_fits_and_the_checkpoint_restores_it(self):
        m = self.make()
        opt = libmoe.Optimizer(m, weight_decay=0.01)
        x, labels = toy()
        first = m.forward(x, labels)
        for step in range(40):
            m.zero_grad()
            st = m.forward(x, labels)
            m.backward()
            opt.step(libmoe.lr_schedule(1e-2, step, 5, 40))
        self.assertLess(st.loss, 0.5 * first.loss)
        self.assertGreaterEqual(st.correct, 90)
        self.assertEqual(opt.steps, 40)
        self.assertEqual(m.layer_stats(0).expert_counts.sum(), 2 * len(x))
        m.forward(x)
        pred = m.predictions()
        self.assertEqual(int((pred == labels).sum()), m.forward(x, labels).correct)
        with tempfile.TemporaryDirectory() as d:
            libmoe.save_checkpoint(f"{d}/c.safetensors", m, opt, libmoe.TrainState(epoch=3, step=40, seed=9,
                                                                                  extra="lr=0.01"))
            m2, opt2, ts = libmoe.load_checkpoint(f"{d}/c.safetensors")
            self.assertEqual((ts.epoch, ts.step, ts.seed, ts.extra), (3, 40, 9, "lr=0.01"))
            self.assertEqual(opt2.steps, 40)
            m2.forward(x)
            np.testing.assert_array_equal(m2.predictions(), pred)
            for n, a in m.params.items():
                np.testing.assert_array_equal(m2.params[n], a, n)
            libmoe.save_checkpoint(f"{d}/w.safetensors", m)
            self.assertIsNone(libmoe.load_checkpoint(f"{d}/w.safetensors")[1])
            raises(self, "MOE_ERR_IO", libmoe.load_checkpoint, f"{d}/missing.safetensors")

    def test_errors(self):
        raises(self, "MOE_ERR_ARG", libmoe.Model, in_dim=12, classes=1, D=8, H=16, E=4, contains="classes")
        raises(self, "MOE_ERR_ARG", libmoe.Model, in_dim=12, classes=3, D=8, H=16, E=4, loss="hinge")
        m = self.make()
        raises(self, "MOE_ERR_STATE", m.backward)
        raises(self, "MOE_ERR_VALUE", m.forward, np.zeros((2, 12)), [0, 7], contains="label 7")
        raises(self, "MOE_ERR_VALUE", m.forward, np.zeros((2, 12)), [0, 256], contains="[0, 256]")
        raises(self, "MOE_ERR_VALUE", m.forward, np.zeros((2, 12)), [0.5, 1], contains="float64")
        with self.assertRaisesRegex(TypeError, "owns C memory"):
            copy.copy(m)
        raises(self, "MOE_ERR_SHAPE", m.forward, np.zeros((2, 11)))
        raises(self, "MOE_ERR_ARG", libmoe.Optimizer, m, kind="lbfgs")


class Schedule(unittest.TestCase):
    def test_warmup_then_cosine(self):
        self.assertAlmostEqual(libmoe.lr_schedule(1.0, 0, 10, 110), 0.1, places=6)
        self.assertAlmostEqual(libmoe.lr_schedule(1.0, 9, 10, 110), 1.0, places=6)
        self.assertAlmostEqual(libmoe.lr_schedule(1.0, 60, 10, 110), 0.5 * (1 + math.cos(math.pi / 2)), places=6)
        self.assertEqual(libmoe.lr_schedule(1.0, 110, 10, 110), 0.0)


class Idx(unittest.TestCase):
    def test_read_and_refuse(self):
        images = np.arange(2 * 3 * 4).reshape(2, 3, 4) * 10
        with tempfile.TemporaryDirectory() as d:
            write_idx(f"{d}/t10k-images-idx3-ubyte", 0x803, images)
            write_idx(f"{d}/t10k-labels-idx1-ubyte", 0x801, np.array([4, 1]))
            ds = libmoe.load_split(d, "t10k")
            self.assertEqual((ds.rows, ds.cols, ds.classes), (3, 4, 5))
            assert_close("pixels", ds.images, images.reshape(2, 12) / 255.0)
            np.testing.assert_array_equal(ds.labels, [4, 1])
            write_idx(f"{d}/bad", 0x801, np.array([1, 2, 3]))
            raises(self, "MOE_ERR_SHAPE", libmoe.load_idx, f"{d}/t10k-images-idx3-ubyte", f"{d}/bad")
            raises(self, "MOE_ERR_FORMAT", libmoe.load_idx, f"{d}/bad", f"{d}/t10k-labels-idx1-ubyte",
                   contains=f"{d}/bad")


if __name__ == "__main__":
    unittest.main()
