"""The MoE layer (moe_layer_t) with numpy arrays in and out."""
import ctypes as C
from dataclasses import dataclass

import numpy as np

from . import _config
from . import _structs as S
from ._lib import Owner, address, check, fail, lib, text, view

_F32 = C.POINTER(C.c_float)


def ptr(a):
    """A float32 / int32 array's data as the C pointer type its dtype is (NULL for None)."""
    if a is None:
        return None
    return a.ctypes.data_as(C.POINTER(C.c_int32) if a.dtype == np.int32 else _F32)


def as_f32(a, shape, name, copy=False):
    """a as a C-contiguous float32 array of `shape` (None in shape: any size); MOE_ERR_SHAPE otherwise."""
    a = np.array(a, dtype=np.float32, order="C") if copy else np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim != len(shape) or any(w is not None and g != w for g, w in zip(a.shape, shape)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise fail("MOE_ERR_SHAPE", f"{name} has shape {tuple(a.shape)}, want ({want})")
    return a


@dataclass
class LayerStats:
    """What a forward reported (moe_layer_stats), copied out of the layer."""
    aux_loss: float          # GShard balance loss
    z_loss: float            # mean over tokens of logsumexp(logits)^2
    capacity: int            # C used (static dispatch), or the largest expert count (dynamic)
    dropped: int             # assignments dropped for capacity
    expert_counts: np.ndarray  # (E) assignments per expert before dropping
    experts: np.ndarray      # (T, k) expert of each slot, slot 0 the most probable
    weights: np.ndarray      # (T, k) combine weights
    fresh: np.ndarray        # (T, k) the router's own top-k (differs from experts under caching)
    router_overlapped: bool

    @classmethod
    def from_c(cls, st, T, k, E, owner):
        def copy(p, shape, ctype=C.c_int32):
            return view(p, shape, owner, ctype).copy() if p else np.zeros(shape, np.dtype(ctype))
        return cls(float(st.aux_loss), float(st.z_loss), int(st.capacity), int(st.dropped),
                   copy(st.expert_counts, (E,)), copy(st.experts, (T, k)), copy(st.weights, (T, k), C.c_float),
                   copy(st.fresh, (T, k)), bool(st.router_overlapped))


def tensors(layer, owner, prefix=""):
    """(name, param view, grad view) of a moe_layer_t's tensors, then, for a hierarchical layer,
    those of its inner layers as experts.<e>.<name> (the names moe_model gives them)."""
    out, params, grads = [], address(layer.params), address(layer.grads)
    for i in range(layer.nparams):
        p = layer.info[i]
        shape = tuple(p.shape[:p.ndim])
        out.append((prefix + p.name.decode(), view(params + 4 * p.offset, shape, owner),
                    view(grads + 4 * p.offset, shape, owner)))
    for e in range(layer.cfg.E if layer.inner else 0):
        out += tensors(layer.inner[e], owner, f"{prefix}experts.{e}.")
    return out


class Layer(Owner):
    """An MoE layer of the C library, configured by the fields of moe_layer_config as keywords:
    D, H, E (required), top_k, capacity_setting, normalize_topk (None = auto), act ("relu", "gelu",
    "silu", "swiglu", "swiglu_oai" with swiglu_alpha and swiglu_limit), dispatch ("dynamic", "static"), priority ("index", "score"), router ("linear",
    "cosine"), proj_dim, gate_bias, expert_bias, threads (0 = all cores), inner_experts, inner_top_k,
    dtype ("f32", "bf16": the experts' GEMMs), and the routing of open models: score ("softmax",
    "sigmoid"), select_bias, n_group, topk_group, group_score ("max", "top2_sum"), routed_scale, shared_H,
    shared_gate. Unset fields take moe_layer_config_default's values.

    params / grads: {name: numpy float32 array} views of the layer's own memory (no copy): writing a
    parameter changes the layer (call params_changed() afterwards for a bf16 layer). backward adds into
    grads. The memory lives as long as this object or any of its views."""

    _free = lib.moe_layer_free

    def __init__(self, **config):
        cfg = S.LayerConfig()
        lib.moe_layer_config_default(C.byref(cfg))
        _config.apply(cfg, _config.LAYER, config, "Layer")
        self._c = S.Layer()
        check(lib.moe_layer_init(C.byref(self._c), C.byref(cfg)))
        self._bind()

    def _bind(self):
        self._forwarded = None  # (x, T, k) of the forward that backward would differentiate
        self.stats = None  # LayerStats of the last forward
        t = tensors(self._c, self)
        self.params = {n: p for n, p, _ in t}
        self.grads = {n: g for n, _, g in t}

    @classmethod
    def load(cls, path, **overrides):
        """A layer from a safetensors file (moe_layer_load: shapes, options from __metadata__); the
        keywords top_k, capacity_setting, normalize_topk, act, dispatch, priority, router, threads and
        dtype override the file's options."""
        o = S.LayerOverrides()
        lib.moe_layer_overrides_init(C.byref(o))
        _config.apply(o, _config.OVERRIDES, overrides, "Layer.load")
        f = C.c_void_p()
        check(lib.moe_st_open(C.byref(f), text(path)))
        self = cls.__new__(cls)
        self._c = S.Layer()
        try:
            check(lib.moe_layer_load(C.byref(self._c), f, C.byref(o)))
        finally:
            lib.moe_st_close(f)
        self._bind()
        return self

    def save(self, path, grads=False):
        """Writes the parameters (and with grads=True the gradients as grad.<name>) and the options to a
        safetensors file, atomically; a bf16 layer stores its expert matrices as BF16."""
        w = C.c_void_p()
        check(lib.moe_st_writer_new(C.byref(w)))
        try:
            check(lib.moe_layer_save_params(C.byref(self._c), w))
            if grads:
                check(lib.moe_layer_save_grads(C.byref(self._c), w, b"grad."))
            check(lib.moe_st_writer_save(w, text(path)))
        finally:
            lib.moe_st_writer_free(w)

    def __deepcopy__(self, memo=None):
        """A new layer with the same options and parameter values (copy.deepcopy of an nn.Module over it)."""
        new = Layer(**self.config)
        for name, a in self.params.items():
            new.params[name][...] = a
        new.params_changed()
        return new

    __copy__ = __deepcopy__

    @property
    def config(self):
        """The layer's options as keywords (a dict that Layer(**config) accepts)."""
        return _config.read(self._c.cfg, _config.LAYER)

    @property
    def top_k(self):
        return self._c.cfg.top_k

    @top_k.setter
    def top_k(self, k):
        check(lib.moe_layer_set_top_k(C.byref(self._c), int(k)))

    def set_threads(self, threads):
        lib.moe_layer_set_threads(C.byref(self._c), int(threads))

    def set_expert_capacity(self, capacities, tokens=0):
        """DynaMoE's per-expert capacities (static dispatch) for batches of `tokens`; None: back to
        capacity_setting."""
        cap = None if capacities is None else np.array(capacities, dtype=np.int32, order="C")
        if cap is not None and cap.shape != (self._c.cfg.E,):
            raise fail("MOE_ERR_SHAPE", f"capacities have shape {cap.shape}, want ({self._c.cfg.E},)")
        check(lib.moe_layer_set_expert_capacity(C.byref(self._c), ptr(cap), int(tokens)))

    def init_params(self, seed):
        """Uniform +-1/sqrt(fan_in) weights, zero biases, from seed (moe_layer_init_params)."""
        lib.moe_layer_init_params(C.byref(self._c), int(seed))

    def zero_grad(self):
        lib.moe_layer_zero_grad(C.byref(self._c))

    def params_changed(self):
        """After writing parameters: a bf16 layer remakes its bf16 expert weights before the next forward."""
        lib.moe_layer_params_changed(C.byref(self._c))

    @property
    def peak_bytes(self):
        return lib.moe_layer_peak_bytes(C.byref(self._c))

    def forward(self, x, spec=False):
        """x (T, D) -> (y (T, D), LayerStats, also kept in self.stats); with spec=True (y, stats, spec):
        spec (T*k, D) holds each assignment's unweighted expert output, zeros where it was dropped.
        Keeps what backward needs."""
        D, k = self._c.cfg.D, self._c.cfg.top_k
        x = as_f32(x, (None, D), "x", copy=True)  # the layer reads x again in backward
        T = x.shape[0]
        y = np.empty((T, D), np.float32)
        s = np.empty((T * k, D), np.float32) if spec else None
        st = S.LayerStats()
        self._forwarded = None
        check(lib.moe_layer_forward(C.byref(self._c), ptr(x), T, ptr(y), ptr(s), C.byref(st)))
        self._forwarded = (x, T, k)
        self.stats = LayerStats.from_c(st, T, k, self._c.cfg.E, self)
        return (y, self.stats, s) if spec else (y, self.stats)

    def backward(self, dy=None, daux=0.0, dz=0.0, dspec=None, dweights=None):
        """Gradients of <dy, y> + daux aux_loss + dz z_loss + <dspec, spec> + <dweights, weights> for the
        last forward (once per forward): returns dx (T, D) and adds the parameters' into grads."""
        if self._forwarded is None:  # no forward to differentiate: the C layer says so
            check(lib.moe_layer_backward(C.byref(self._c), None, 0.0, 0.0, None, None, None))
        T, k = self._forwarded[1:]
        D = self._c.cfg.D
        dy = None if dy is None else as_f32(dy, (T, D), "dy")
        dspec = None if dspec is None else as_f32(dspec, (T * k, D), "dspec")
        dweights = None if dweights is None else as_f32(dweights, (T, k), "dweights")
        dx = np.empty((T, D), np.float32)
        try:  # x stays referenced until the C backward has read it
            check(lib.moe_layer_backward(C.byref(self._c), ptr(dy), float(daux), float(dz), ptr(dspec),
                                         ptr(dweights), ptr(dx)))
        finally:
            self._forwarded = None  # the C layer allows one backward per forward
        return dx
