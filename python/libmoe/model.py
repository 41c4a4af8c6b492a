"""The classifier of the C library (moe_model_t), its optimizers and checkpoints."""
import ctypes as C
from dataclasses import dataclass

import numpy as np

from . import _config
from . import _structs as S
from ._lib import Owner, check, fail, lib, text, view
from .layer import LayerStats, as_f32, ptr


@dataclass
class ModelStats:
    """moe_model_stats of a forward."""
    loss: float        # mean over the batch of the training loss (without aux and z terms)
    aux: float         # sums over blocks
    z: float
    correct: int       # argmax hits (when labels were given)
    dropped: int       # assignments dropped, over blocks
    capacity_max: int  # largest capacity (or expert count) over blocks


class Model(Owner):
    """Dense input projection, `blocks` pre-norm MoE blocks, LayerNorm and softmax head (moe.h):
    keywords in_dim, classes (required), blocks, loss ("cooperation", "specification"), aux_weight,
    z_weight, and those of Layer for every block's MoE layer (D, H, E, ...). params / grads:
    {name: numpy view} of every tensor, named as in checkpoints ("blocks.0.moe.gate.weight")."""

    _free = lib.moe_model_free

    def __init__(self, **config):
        cfg = S.ModelConfig()
        lib.moe_model_config_default(C.byref(cfg))
        mine, layer = _config.split(config, _config.MODEL)
        _config.apply(cfg, _config.MODEL, mine, "Model")
        _config.apply(cfg.moe, _config.LAYER, layer, "Model")
        self._c = S.Model()
        check(lib.moe_model_init(C.byref(self._c), C.byref(cfg)))
        self._bind()

    def _bind(self):
        self._B = 0
        refs = [self._c.refs[i] for i in range(self._c.nrefs)]
        shapes = [tuple(r.shape[:r.ndim]) for r in refs]
        self.params = {r.name.decode(): view(r.data, s, self) for r, s in zip(refs, shapes)}
        self.grads = {r.name.decode(): view(r.grad, s, self) for r, s in zip(refs, shapes)}

    @property
    def config(self):
        """The model's options as keywords (a dict that Model(**config) accepts)."""
        c = self._c.cfg
        return {**_config.read(c, _config.MODEL), **_config.read(c.moe, _config.LAYER)}

    def init_params(self, seed):
        lib.moe_model_init_params(C.byref(self._c), int(seed))

    def zero_grad(self):
        lib.moe_model_zero_grad(C.byref(self._c))

    def set_threads(self, threads):
        lib.moe_model_set_threads(C.byref(self._c), int(threads))

    def forward(self, x, labels=None):
        """x (B, in_dim), labels (B) or None -> ModelStats; predictions() and layer_stats(i) then hold
        this forward's. Keeps what backward needs (with labels)."""
        x = as_f32(x, (None, self._c.cfg.in_dim), "x", copy=True)  # read again by backward
        B = x.shape[0]
        if labels is not None:
            given = np.asarray(labels)
            if given.shape != (B,):
                raise fail("MOE_ERR_SHAPE", f"labels have shape {given.shape}, want ({B},)")
            if B and (given.dtype.kind not in "iu" or given.min() < 0 or given.max() > 255):
                raise fail("MOE_ERR_VALUE", f"labels must be integers in [0, classes), got {given.dtype} "
                                            f"in [{given.min()}, {given.max()}]")
            labels = np.ascontiguousarray(given, dtype=np.uint8)
        st = S.ModelStats()
        self._x = x
        lab = None if labels is None else labels.ctypes.data_as(C.POINTER(C.c_uint8))
        check(lib.moe_model_forward(C.byref(self._c), ptr(x), lab, B, C.byref(st)))
        self._B = B
        return ModelStats(st.loss, st.aux, st.z, st.correct, st.dropped, st.capacity_max)

    def predictions(self):
        """(B) int32: the predicted classes of the last forward."""
        return view(lib.moe_model_predictions(C.byref(self._c)), (self._B,), self, C.c_int32).copy()

    def layer_stats(self, i):
        """Block i's LayerStats of the last forward."""
        if not 0 <= i < self._c.cfg.blocks:
            raise fail("MOE_ERR_ARG", f"block {i} out of range [0, {self._c.cfg.blocks})")
        layer = self._c.layers[i]
        st = lib.moe_model_layer_stats(C.byref(self._c), i).contents
        return LayerStats.from_c(st, self._B, layer.cfg.top_k, layer.cfg.E, self)

    def backward(self):
        """Adds the gradients of the last forward's loss (it needs labels) into grads."""
        check(lib.moe_model_backward(C.byref(self._c)))


class Optimizer(Owner):
    """AdamW or SGD over a Model's parameters (moe_optim_t): keywords kind ("adam", "sgd"), beta1,
    beta2, eps, momentum, weight_decay (on weight matrices only), defaults moe_optim_config_default's."""

    _free = lib.moe_optim_free

    def __init__(self, model, **config):
        cfg = S.OptimConfig()
        lib.moe_optim_config_default(C.byref(cfg))
        _config.apply(cfg, _config.OPTIM, config, "Optimizer")
        self._c, self._model = S.Optim(), model
        check(lib.moe_optim_init(C.byref(self._c), C.byref(cfg), C.byref(model._c)))

    @property
    def config(self):
        return _config.read(self._c.cfg, _config.OPTIM)

    @property
    def steps(self):
        return self._c.step

    def step(self, lr):
        """One update with the model's grads (also refreshes a bf16 model's expert copies)."""
        lib.moe_optim_step(C.byref(self._c), C.byref(self._model._c), float(lr))


def lr_schedule(base, step, warmup, total):
    """moe train's learning rate at step of total: linear warm-up over warmup steps, then cosine to 0."""
    return lib.moe_lr_schedule(base, step, warmup, total)


@dataclass
class TrainState:
    epoch: int = 0     # epochs completed
    step: int = 0      # optimizer steps done
    seed: int = 0
    extra: str = ""    # the caller's options as "key=value;...", kept in __metadata__["train"]


def save_checkpoint(path, model, optimizer=None, state=None):
    """Writes a checkpoint (the format of moe train) atomically: weights, optimizer state when given,
    the configuration, and state (a TrainState)."""
    s = state or TrainState()
    ts = S.TrainState(s.epoch, s.step, s.seed, s.extra.encode())
    opt = C.byref(optimizer._c) if optimizer is not None else None
    check(lib.moe_checkpoint_save(text(path), C.byref(model._c), opt, C.byref(ts)))


def load_checkpoint(path):
    """(Model, Optimizer or None when the file has no optimizer state, TrainState) from a checkpoint."""
    m = Model.__new__(Model)
    m._c = S.Model()
    o = Optimizer.__new__(Optimizer)
    o._c, o._model = S.Optim(), m
    ts = S.TrainState()
    check(lib.moe_checkpoint_load(text(path), C.byref(m._c), C.byref(o._c), C.byref(ts)))
    m._bind()
    state = TrainState(ts.epoch, ts.step, ts.seed, ts.extra.decode())
    return m, (o if o._c.m else None), state
