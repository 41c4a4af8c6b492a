"""libmoe.Trainer: the library's training loop (moe_trainer) from Python, over a language model or the
classifier: the batch order, the warm-up + cosine schedule (or a time budget), evaluations, checkpoints
(the language model's `moe train --task lm --resume` continues bit for bit), keep-best, the NaN guard and
DynaMoE's adjustments, one step per call, and a callback with each step's numbers. lm_stream turns a
text into the token stream the trainer reads, as `moe train` does."""
import ctypes as C
import math

import numpy as np

from . import _structs as S
from ._lib import check, lib, text
from .lm import LM

_P, _I32 = C.POINTER, C.POINTER(C.c_int32)
for _name, (_res, _args) in {
        "moe_trainer_config_default": (None, [_P(S.TrainerConfig)]),
        "moe_train_lm": (C.c_int, [_P(S.TrainModel), _P(S.LM), C.c_void_p, _I32, C.c_size_t, _I32, C.c_size_t,
                                   _P(S.TrainerConfig)]),
        "moe_train_classifier": (C.c_int, [_P(S.TrainModel), _P(S.Model), _P(S.Dataset), _P(S.Dataset),
                                           _P(S.Augment), _P(S.TrainerConfig)]),
        "moe_trainer_new": (C.c_int, [_P(C.c_void_p), _P(S.TrainerConfig), _P(S.TrainModel)]),
        "moe_trainer_free": (None, [C.c_void_p]),
        "moe_trainer_done": (C.c_int, [C.c_void_p]),
        "moe_trainer_step": (C.c_int, [C.c_void_p, _P(S.TrainStep)]),
        "moe_trainer_evaluate": (C.c_int, [C.c_void_p, _P(C.c_double)]),
        "moe_trainer_save": (C.c_int, [C.c_void_p, C.c_char_p]),
        "moe_trainer_state_read": (C.c_int, [C.c_char_p, _P(S.TrainerConfig), _P(S.LayerConfig), C.c_void_p]),
        "moe_trainer_resume": (C.c_int, [C.c_void_p, C.c_char_p]),
        "moe_trainer_get_info": (None, [C.c_void_p, _P(S.TrainerInfo)]),
        "moe_lm_stream_encode": (C.c_int, [C.c_void_p, C.c_char_p, C.c_size_t, _P(_I32), _P(C.c_size_t)]),
        "moe_free": (None, [C.c_void_p])}.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args

_ON_NAN = {"stop": 0, "skip": 1}
# the trainer's options: moe_trainer_config fields (weight_decay is optim's, the rest adjust's)
_TOP = ("lr", "steps", "warmup", "time_budget", "stop_after", "eval_every", "context", "batch", "eval_windows", "seed",
        "bias_rate")
_OPTIM = ("optimizer", "weight_decay", "momentum", "beta1", "beta2", "eps")
_ADJUST = ("dynamic_capacity", "delta_launch", "headroom", "cache_assignments")
_CACHE = {"cache_on": "on", "cache_off": "off", "cache_min_epoch": "min_epoch"}


def lm_stream(tokenizer, data):
    """The token stream of a text (str or bytes): its documents (separated by an empty line) each after
    <|endoftext|> (moe_lm_stream_encode), as int32."""
    b = data.encode() if isinstance(data, str) else bytes(data)
    p, n = _I32(), C.c_size_t()
    check(lib.moe_lm_stream_encode(tokenizer._t, b, len(b), C.byref(p), C.byref(n)))
    try:
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy() if n.value else np.zeros(0, np.int32)
    finally:
        lib.moe_free(p)


def _config(options):
    c = S.TrainerConfig()
    lib.moe_trainer_config_default(C.byref(c))
    for k, v in options.items():
        if k in _TOP:
            setattr(c, k, v)
        elif k == "optimizer":
            c.optim.kind = {"adam": 0, "sgd": 1}[v]
        elif k in _OPTIM:
            setattr(c.optim, k, v)
        elif k == "on_nan":
            c.on_nan = _ON_NAN[v]
        elif k in _ADJUST:
            setattr(c.adjust, k, v)
        elif k in _CACHE:
            setattr(c.adjust.cache, _CACHE[k], v)
        else:
            raise TypeError(f"Trainer: unknown option {k!r}")
    return c


def _dataset(d):
    """A moe_dataset over a libmoe.Dataset's arrays (kept by the caller)."""
    return S.Dataset(len(d.labels), d.rows, d.cols, d.classes, d.images.ctypes.data_as(C.POINTER(C.c_float)),
                     d.labels.ctypes.data_as(C.POINTER(C.c_uint8)))


class Trainer:
    """Trainer(lm, train, valid, tokenizer=None, checkpoint=None, keep_best=None, callback=None, **options):
    trains lm (a libmoe.LM, e.g. LM.create) on the token streams train and valid (lm_stream) with
    moe_trainer. Options (moe_trainer_config; `moe train --task lm`'s defaults): lr 1e-3, steps 1000,
    warmup (steps / 20), time_budget (seconds; 0: steps decide), stop_after, eval_every 100, optimizer
    "adam" | "sgd", weight_decay 0.1, momentum, on_nan "stop" | "skip", context 64, batch 8,
    eval_windows 64, seed 1, dynamic_capacity, delta_launch, headroom, cache_assignments, cache_on,
    cache_off, cache_min_epoch, bias_rate (0: off; DeepSeek-V3's aux-loss-free balancing of the selection
    bias after each step, e.g. 0.001; an error for a model without one). checkpoint: the directory written at each evaluation (the model,
    tokenizer.json with a tokenizer, trainer_state.safetensors). step() runs one step and returns its
    numbers, which callback (a callable) gets too; run() steps until done. Trainer.resume(DIR, ...) goes
    on from a checkpoint; Trainer.classifier(model, train, valid, ...) trains the classifier."""

    def __init__(self, lm, train, valid, tokenizer=None, checkpoint=None, keep_best=None, callback=None, _state=None,
                 **options):
        self._t, self.callback = None, callback
        self._keep = (lm, tokenizer, np.ascontiguousarray(train, np.int32), np.ascontiguousarray(valid, np.int32))
        self._paths = [None if p is None else text(p) for p in (checkpoint, keep_best)]
        c = _config(options) if _state is None else _state
        c.checkpoint, c.keep_best = self._paths
        tr, va = self._keep[2], self._keep[3]
        model = S.TrainModel()
        check(lib.moe_train_lm(C.byref(model), C.byref(lm._c), tokenizer._t if tokenizer else None,
                               tr.ctypes.data_as(_I32), tr.size, va.ctypes.data_as(_I32), va.size, C.byref(c)))
        self._start(c, model)

    def _start(self, c, model):
        t = C.c_void_p()
        check(lib.moe_trainer_new(C.byref(t), C.byref(c), C.byref(model)))  # owns model from here on
        self._t = t

    @classmethod
    def classifier(cls, model, train, valid, epochs=60, augment=(2, 15.0, 0.15), checkpoint=None, callback=None,
                   **options):
        """The classifier (a libmoe.Model, its parameters initialized) trained as `moe train` trains it
        (moe_train_classifier): epochs passes over train (a libmoe.Dataset) in batches (option batch, 64),
        each a new order from the seed with the training images augmented by augment (shift pixels,
        rotate degrees, scale), the rate warming up over the first epoch (`warmup` steps) and decaying
        over all of them, and after each epoch the accuracy on valid (valid_accuracy; valid_loss is the
        error rate) and the one-file checkpoint (libmoe.load_checkpoint reads it). Options as
        Trainer's, with `moe train`'s defaults: lr 2e-3, weight_decay 0.01, seed 1. The same model
        options, seed and flags give `moe train`'s losses bit for bit."""
        self = cls.__new__(cls)
        self._t, self.callback = None, callback
        batch = options.get("batch", 64)
        steps = len(train.labels) // batch
        if steps < 1:
            raise TypeError(f"Trainer.classifier: batch {batch} is larger than the {len(train.labels)} samples")
        opts = dict(lr=2e-3, warmup=steps, weight_decay=0.01, batch=batch, seed=1)
        opts.update(options)
        opts.update(steps=epochs * steps, eval_every=steps)
        c = _config(opts)
        self._paths = [None if checkpoint is None else text(checkpoint), None]
        c.checkpoint = self._paths[0]
        tr, va = _dataset(train), _dataset(valid)
        aug = S.Augment(*augment)
        self._keep = (model, train, valid, tr, va, aug)
        m = S.TrainModel()
        check(lib.moe_train_classifier(C.byref(m), C.byref(model._c), C.byref(tr), C.byref(va), C.byref(aug),
                                       C.byref(c)))
        self._start(c, m)
        return self

    @classmethod
    def resume(cls, path, train, valid, tokenizer=None, checkpoint=None, keep_best=None, stop_after=0, threads=0,
               callback=None):
        """A checkpoint directory's run (`moe train --task lm`'s or a Trainer's) going on from its step:
        the model loaded with the layers' options its trainer state keeps, the schedule and options
        from there too, saving to checkpoint (default: path) as `moe train --resume` does. .lm is the
        model."""
        cfg, c = S.LMConfig(), _config({})
        check(lib.moe_lm_read_config(text(path), C.byref(cfg)))
        check(lib.moe_trainer_state_read(text(path), C.byref(c), C.byref(cfg.moe), None))
        cfg.moe.threads = threads
        c.stop_after = stop_after
        lm = LM.__new__(LM)
        lm._c, lm.eos = None, []
        m = S.LM()
        check(lib.moe_lm_load(C.byref(m), text(path), C.byref(cfg)))
        lm._c = m
        self = cls(lm, train, valid, tokenizer, path if checkpoint is None else checkpoint, keep_best, callback,
                   _state=c)
        check(lib.moe_trainer_resume(self._t, text(path)))
        return self

    lm = property(lambda self: self._keep[0])

    @property
    def done(self):
        return bool(lib.moe_trainer_done(self._t))

    def info(self):
        """Steps done, the last step of this run, updates skipped, training seconds, best validation loss."""
        i = S.TrainerInfo()
        lib.moe_trainer_get_info(self._t, C.byref(i))
        return {"step": i.step, "last": i.last, "skipped": i.skipped, "train_seconds": i.train_seconds,
                "best_loss": i.best_loss}

    def step(self):
        """One step (and the evaluation and checkpoint it is due): step, lr, loss, ce (the cross-entropy),
        tokens, dropped, aux and correct (the classifier's), seconds, skipped, and valid_loss and
        valid_accuracy (None when no evaluation followed, or the model has no accuracy); callback, when
        set, is called with them."""
        s = S.TrainStep()
        check(lib.moe_trainer_step(self._t, C.byref(s)))
        b = s.batch
        ev = lambda v: v if s.evaluated and not math.isnan(v) else None
        out = {"step": s.step, "lr": s.lr, "loss": b.loss, "ce": b.ce, "tokens": b.tokens, "dropped": b.dropped,
               "aux": b.aux, "correct": b.correct, "seconds": s.seconds, "skipped": bool(s.skipped),
               "valid_loss": ev(s.valid_loss), "valid_accuracy": ev(s.valid_accuracy)}
        if self.callback is not None:
            self.callback(out)
        return out

    def run(self):
        """Steps until done; the list of their step() dicts."""
        out = []
        while not self.done:
            out.append(self.step())
        return out

    def evaluate(self):
        v = C.c_double()
        check(lib.moe_trainer_evaluate(self._t, C.byref(v)))
        return v.value

    def save(self, path):
        """A checkpoint now (moe_trainer_save)."""
        check(lib.moe_trainer_save(self._t, text(path)))

    def __del__(self):
        if getattr(self, "_t", None):
            lib.moe_trainer_free(self._t)
            self._t = None
