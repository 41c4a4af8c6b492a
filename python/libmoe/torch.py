"""PyTorch autograd over the C MoE layer (CPU): MoEFunction and the nn.Module MoELayer.

The layer computes in float32 on the CPU (its experts' GEMMs in bf16 with dtype="bf16"); inputs of
another floating dtype are converted, and the outputs come back in the input's dtype.
"""
import weakref

import torch
from torch import nn

from ._lib import fail
from .layer import Layer

_versions = weakref.WeakKeyDictionary()  # layer -> its parameters' (data_ptr, _version) at the last forward


def _use_params(layer, params):
    """Makes the C layer compute with `params` (tensors in the order of layer.params): a tensor that is
    not a view of the layer's own memory is copied into it; then, if any parameter was written since
    the last forward (torch counts in-place writes in _version, e.g. an optimizer step), the layer is
    told (moe_layer_params_changed: a bf16 layer remakes its bf16 expert weights)."""
    if len(params) != len(layer.params):
        raise fail("MOE_ERR_ARG", f"MoEFunction: {len(params)} parameters given, the layer has {len(layer.params)}")
    changed = False
    for (name, mine), p in zip(layer.params.items(), params):
        if tuple(p.shape) != mine.shape:
            raise fail("MOE_ERR_SHAPE", f"parameter {name} has shape {tuple(p.shape)}, want {mine.shape}")
        if p.data_ptr() != mine.ctypes.data or p.dtype != torch.float32 or not p.is_contiguous():
            mine[...] = p.detach().to(device="cpu", dtype=torch.float32).numpy()
            changed = True
    seen = tuple((p.data_ptr(), p._version) for p in params)
    if changed or _versions.get(layer) != seen:
        layer.params_changed()
        _versions[layer] = seen


def _float32_cpu(t, D, name):
    if t.device.type != "cpu":
        raise fail("MOE_ERR_ARG", f"{name} is on {t.device}: libmoe's layer runs on the CPU")
    if t.shape[-1:] != (D,):
        raise fail("MOE_ERR_SHAPE", f"{name} has shape {tuple(t.shape)}, want (..., D={D})")
    return t.detach().reshape(-1, D).to(torch.float32).numpy()


class MoEFunction(torch.autograd.Function):
    """y, aux_loss, z_loss = MoEFunction.apply(layer, x, *params): the libmoe Layer `layer` on x (..., D),
    with params the tensors of layer.params in its order (the layer's own memory, or any tensors of
    those shapes, which are then copied in). backward runs the C backward: gradients of x and of every
    parameter, with aux_loss's and z_loss's cotangents as moe_layer_backward's daux and dz.

    The C layer keeps only its last forward; backward of an earlier one (the layer applied twice in a
    graph, or retain_graph) runs that forward again first, from the saved input."""

    @staticmethod
    def forward(ctx, layer, x, *params):
        D = layer._c.cfg.D
        _use_params(layer, params)
        x32 = _float32_cpu(x, D, "x")
        y, stats = layer.forward(x32)
        ctx.layer, ctx.shape, ctx.dtype = layer, x.shape, x.dtype
        ctx.forwarded = layer._forwarded
        ctx.save_for_backward(x, *params)  # autograd then refuses a backward after an in-place write to them
        ctx.param_dtypes = [p.dtype for p in params]
        out = [torch.from_numpy(y).reshape(x.shape).to(x.dtype)]
        out += [torch.tensor(v, dtype=x.dtype) for v in (stats.aux_loss, stats.z_loss)]
        return tuple(out)

    @staticmethod
    def backward(ctx, dy, daux, dz):
        layer = ctx.layer
        x, *params = ctx.saved_tensors
        D = layer._c.cfg.D
        if layer._forwarded is not ctx.forwarded:
            _use_params(layer, params)
            layer.forward(_float32_cpu(x, D, "x"))
        layer.zero_grad()  # the C backward adds into the layer's grads: they start from zero here
        dx = layer.backward(_float32_cpu(dy, D, "dy"), float(daux), float(dz))
        grads = [torch.from_numpy(g.copy()).to(dt) for g, dt in zip(layer.grads.values(), ctx.param_dtypes)]
        return (None, torch.from_numpy(dx).reshape(ctx.shape).to(ctx.dtype), *grads)


class MoELayer(nn.Module):
    """An nn.Module over a libmoe Layer (CPU). MoELayer(D=..., H=..., E=..., seed=0, **options) takes the
    options of libmoe.Layer (act, top_k, dispatch, dtype="bf16", ...) and initializes the weights from
    seed as moe_layer_init_params does; MoELayer(layer=L) wraps an existing Layer (e.g. Layer.load).

    forward(x (..., D)) returns y (..., D); the balance and z losses of that forward are in
    self.aux_loss and self.z_loss (tensors in the graph: add aux_weight * aux_loss to the loss to
    train the router), its routing statistics in self.stats (a LayerStats).

    Parameters carry the C names ("gate.weight", "experts.fc1.weight", ...) in state_dict. They are
    float32 tensors over the C layer's own memory, so an optimizer step writes into the C layer
    directly, and their .grad comes from the C backward. Before each forward the module checks the
    parameters' version counters: any in-place write since the last forward (optimizer.step,
    load_state_dict, p.mul_) calls moe_layer_params_changed, so a bf16 layer remakes its bf16 expert
    weights; a parameter whose .data was replaced is copied back into the layer's memory. Writes that
    torch does not see (through self.layer.params) need self.layer.params_changed()."""

    def __init__(self, D=None, H=None, E=None, seed=0, layer=None, **options):
        super().__init__()
        if layer is None:
            layer = Layer(D=D, H=H, E=E, **options)
            layer.init_params(seed)
        elif D is not None or H is not None or E is not None or options:
            raise fail("MOE_ERR_ARG", "MoELayer: give either a layer or its options, not both")
        self.layer = layer
        self._names = list(layer.params)
        for name, a in layer.params.items():
            *path, leaf = name.split(".")
            owner = self
            for part in path:  # nested modules, so that state_dict keys are the C names
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, nn.Parameter(torch.from_numpy(a)))
        self.aux_loss = self.z_loss = self.stats = None

    @classmethod
    def load(cls, path, **overrides):
        """A module over Layer.load(path, **overrides)."""
        return cls(layer=Layer.load(path, **overrides))

    def save(self, path):
        """The weights and options as a safetensors file (Layer.save; moe layer-run reads it)."""
        _use_params(self.layer, self._params())
        self.layer.save(path)

    def _params(self):
        """The parameters in the layer's order, each again a view of the layer's memory if its .data was
        replaced (p.data = t, module.double()): its values are copied in first."""
        params = [self.get_parameter(n) for n in self._names]
        for p, mine in zip(params, self.layer.params.values()):
            if p.data_ptr() != mine.ctypes.data:
                mine[...] = p.detach().to(device="cpu", dtype=torch.float32).numpy()
                p.data = torch.from_numpy(mine)
                self.layer.params_changed()
        return params

    def forward(self, x):
        y, self.aux_loss, self.z_loss = MoEFunction.apply(self.layer, x, *self._params())
        self.stats = self.layer.stats
        return y

    def extra_repr(self):
        c = self.layer.config
        return ", ".join(f"{k}={c[k]}" for k in ("D", "H", "E", "top_k", "act", "dispatch", "dtype"))
