"""libmoe.torch: gradcheck of MoEFunction, and how MoELayer shares its parameters with the C layer."""
import copy
import tempfile
import unittest

import numpy as np
import torch

from common import G, assert_close, libmoe
from libmoe.torch import MoEFunction, MoELayer


class GradCheck(unittest.TestCase):
    def test_gradcheck_in_double(self):
        """torch.autograd.gradcheck with float64 x and parameters (the Function casts them to the float32
        the C layer computes in, and its outputs back): central differences with eps 1e-3, whose float32
        rounding error is about 1e-7 / 1e-3 = 1e-4 relative, so atol 1e-3 and rtol 1e-2 instead of
        gradcheck's float64 defaults. Smooth activations only (a relu kink within eps breaks finite
        differences); inputs drawn with routing margins far larger than eps, so no perturbation changes
        the experts chosen, and static dispatch with drops so that dropped assignments are covered."""
        for act, dispatch in (("gelu", "dynamic"), ("swiglu", "static")):
            with self.subTest(act=act, dispatch=dispatch):
                g = torch.Generator().manual_seed(7)
                layer = libmoe.Layer(D=4, H=6, E=3, top_k=2, act=act, dispatch=dispatch, capacity_setting=0.75,
                                     threads=1)
                layer.init_params(3)
                params = [torch.from_numpy(a.astype(np.float64) * 2).requires_grad_(True)
                          for a in layer.params.values()]
                x = torch.randn(6, 4, generator=g, dtype=torch.float64).requires_grad_(True)
                cfg = {"top_k": 2, "capacity_setting": "0.75", "activation": act, "normalize_topk": None,
                       "dispatch": dispatch, "priority": "index", "router": "linear"}
                with torch.no_grad():
                    r = G.moe_reference(dict(zip(layer.params, params)), x, cfg)
                self.assertGreater(G.routing_margins(r, cfg)[0], 0.1, "inputs too close to a routing tie")
                if dispatch == "static":
                    self.assertGreater(r["dropped"], 0)

                def f(x, *p):
                    y, aux, z = MoEFunction.apply(layer, x, *p)
                    return y, aux, z
                self.assertTrue(torch.autograd.gradcheck(f, (x, *params), eps=1e-3, atol=1e-3, rtol=1e-2))


class Module(unittest.TestCase):
    def make(self, **kw):
        opts = dict(D=8, H=16, E=4, top_k=2, act="swiglu", threads=1, seed=5)
        opts.update(kw)
        return MoELayer(**opts)

    def test_parameters_are_the_c_layers_memory(self):
        m = self.make()
        self.assertEqual([n for n, _ in m.named_parameters()], list(m.layer.params))
        for n, p in m.named_parameters():
            self.assertEqual(p.data_ptr(), m.layer.params[n].ctypes.data, n)
            self.assertEqual(p.dtype, torch.float32)
        self.assertEqual(list(m.state_dict()), list(m.layer.params))

    def test_optimizer_step_reaches_the_bf16_copies(self):
        """After optimizer.step() (in-place writes into the C memory) the bf16 layer computes with the
        new weights: the same output as a fresh layer made from them."""
        m = self.make(dtype="bf16")
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        m(x).square().sum().backward()
        opt.step()
        y = m(x).detach()
        fresh = MoELayer(**{k: v for k, v in m.layer.config.items()})
        fresh.load_state_dict(m.state_dict())
        np.testing.assert_array_equal(y.numpy(), fresh(x).detach().numpy())
        self.assertGreater(float((y - MoELayer(**m.layer.config, seed=5)(x)).abs().max()), 1e-3)

    def test_replaced_parameter_data_is_copied_in(self):
        m = self.make()
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
        w = m.experts.fc2.weight
        w.data = w.data * 0.5  # a new tensor, outside the C memory
        y = m(x)
        self.assertEqual(w.data_ptr(), m.layer.params["experts.fc2.weight"].ctypes.data)
        np.testing.assert_array_equal(m.layer.params["experts.fc2.weight"], w.detach().numpy())
        ref = MoELayer(**m.layer.config)
        ref.load_state_dict(m.state_dict())
        np.testing.assert_array_equal(y.detach().numpy(), ref(x).detach().numpy())

    def test_layer_twice_in_one_graph(self):
        """The C layer keeps one forward; the first application's backward runs it again: the gradients
        equal those of two separate modules with the same weights."""
        m, a, b = self.make(), self.make(), self.make()
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(3), requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        (m(m(x)) * 0.5 + m.aux_loss).sum().backward()
        (b(a(x2)) * 0.5 + b.aux_loss).sum().backward()
        assert_close("grad.x", x.grad, x2.grad)
        for n, p in m.named_parameters():
            assert_close(n, p.grad, a.get_parameter(n).grad + b.get_parameter(n).grad)

    def test_retain_graph_and_batch_dims_and_double(self):
        m = self.make(act="gelu")
        x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64,
                        requires_grad=True)
        y = m(x)
        self.assertEqual((y.shape, y.dtype), (x.shape, torch.float64))
        y.sum().backward(retain_graph=True)
        first = x.grad.clone()
        x.grad = None
        y.sum().backward()
        assert_close("second backward", x.grad, first)
        ref = libmoe.Layer(**m.layer.config)
        for n, a in m.layer.params.items():
            ref.params[n][...] = a
        yr, _ = ref.forward(x.detach().reshape(10, 8).numpy())
        assert_close("y", y.detach().reshape(10, 8), yr)

    def test_in_place_write_after_forward_is_refused(self):
        m = self.make()
        y = m(torch.randn(4, 8))
        with torch.no_grad():
            m.gate.weight.mul_(2)
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            y.sum().backward()

    def test_deepcopy_is_independent(self):
        m = self.make(dtype="bf16")
        c = copy.deepcopy(m)
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(8))
        np.testing.assert_array_equal(c(x).detach().numpy(), m(x).detach().numpy())
        with torch.no_grad():
            c.experts.fc1.weight.mul_(2)
        self.assertGreater(float((c(x) - m(x)).abs().max()), 1e-3)
        self.assertNotEqual(c.layer.params["experts.fc1.weight"].ctypes.data,
                            m.layer.params["experts.fc1.weight"].ctypes.data)

    def test_errors(self):
        m = self.make()
        with self.assertRaises(libmoe.MoeError) as e:
            m(torch.randn(4, 7))
        self.assertEqual(e.exception.name, "MOE_ERR_SHAPE")
        self.assertIn("D=8", str(e.exception))
        with self.assertRaises(libmoe.MoeError) as e:
            m(torch.full((4, 8), float("nan")))
        self.assertEqual(e.exception.name, "MOE_ERR_VALUE")
        with self.assertRaises(libmoe.MoeError) as e:
            MoELayer(D=8, H=16, E=4, top_k=5)
        self.assertEqual(e.exception.name, "MOE_ERR_ARG")

    def test_save_and_load(self):
        m = self.make(dtype="bf16", dispatch="static")
        with tempfile.TemporaryDirectory() as d:
            m.save(f"{d}/w.safetensors")
            n = MoELayer.load(f"{d}/w.safetensors")
        saved = ("D", "H", "E", "top_k", "capacity_setting", "act", "dispatch", "priority", "router", "dtype")
        self.assertEqual({k: n.layer.config[k] for k in saved}, {k: m.layer.config[k] for k in saved})
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(6))
        np.testing.assert_array_equal(m(x).detach().numpy(), n(x).detach().numpy())


class Training(unittest.TestCase):
    def test_a_few_steps_lower_the_loss(self):
        """A small classifier around the module, AdamW with the aux loss: the training loss falls."""
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 16, generator=g)
        labels = (x[:, :4].argmax(1) + 4 * (x[:, 4] > 0)).long()
        moe = MoELayer(D=16, H=32, E=4, act="gelu", threads=1, seed=1)
        head = torch.nn.Linear(16, 8)
        opt = torch.optim.AdamW(list(moe.parameters()) + list(head.parameters()), lr=1e-2)
        losses = []
        for _ in range(30):
            loss = torch.nn.functional.cross_entropy(head(x + moe(x)), labels)
            opt.zero_grad()
            (loss + 0.01 * moe.aux_loss).backward()
            opt.step()
            losses.append(float(loss))
        self.assertLess(losses[-1], 0.5 * losses[0], losses)


if __name__ == "__main__":
    unittest.main()
