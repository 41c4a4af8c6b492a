"""libmoe from Python: the C library's MoE layer, classifier, optimizers, checkpoints and IDX reader
over ctypes (no compilation step), with numpy arrays in and out. libmoe.torch adds a
torch.autograd.Function and an nn.Module over the layer; libmoe.chat renders chat templates; LM and
Engine load a language model checkpoint, generate from it and batch requests; Trainer trains one with
the library's loop.
Failures raise MoeError, which carries the status name and moe_last_error()."""
from ._lib import MoeError, lib
from .chat import render_chat, render_chat_template
from .data import Dataset, load_idx, load_split
from .layer import Layer, LayerStats
from .lm import LM, Engine
from .tokenizer import Tokenizer
from .trainer import Trainer, lm_stream
from .model import Model, ModelStats, Optimizer, TrainState, load_checkpoint, lr_schedule, save_checkpoint


def blas_info():
    """The BLAS in use and its kernel set, e.g. "OpenBLAS 0.3.21 (kernels SkylakeX, OpenMP)"."""
    return lib.moe_blas_info().decode()


__all__ = ["MoeError", "Dataset", "load_idx", "load_split", "Layer", "LayerStats", "Model", "ModelStats",
           "Optimizer", "TrainState", "load_checkpoint", "lr_schedule", "save_checkpoint", "blas_info",
           "render_chat", "render_chat_template", "LM", "Engine", "Tokenizer", "Trainer", "lm_stream"]
