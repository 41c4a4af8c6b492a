"""The shared library, its function prototypes, and moe_status -> MoeError.

The library is found, in this order: the path in $MOE_LIBRARY; libmoe.so of the source tree's build
directory (<repo>/build, when this package is <repo>/python/libmoe); the libmoe.so.0 installed with
this package by `cmake --install` (its directory in _installed.py, relative to the package's); the
system loader's libmoe.so.0, then libmoe.so.
"""
import ctypes as C
import os


def _blas_coretype():
    """The BLAS kernels `moe` runs with (cli/main.c restarts itself with OPENBLAS_CORETYPE=SKYLAKEX when
    moe_blas_better_coretype says OpenBLAS chose kernels without AVX-512 on a CPU that has it: Debian 12's
    OpenBLAS 0.3.21 does so on AMD's AVX-512 CPUs, Zen 4 and 5). The library's bits depend on the BLAS's
    kernels, so this process asks for the same before OpenBLAS loads (it reads the variable once), and a
    run started by `moe train` resumes here bit for bit, and the other way round."""
    if "OPENBLAS_CORETYPE" in os.environ or "MOE_KEEP_BLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read(1 << 16)
    except OSError:
        return
    vendor = flags = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = value.split()
    if vendor == "AuthenticAMD" and all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")):
        os.environ["OPENBLAS_CORETYPE"] = "SKYLAKEX"


_blas_coretype()  # before numpy, whose BLAS may be this OpenBLAS too

import numpy as np  # noqa: E402

from . import _structs as S  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
try:  # written by cmake --install only
    from ._installed import LIBDIR as _LIBDIR
    _INSTALLED = (os.path.normpath(os.path.join(_HERE, _LIBDIR, "libmoe.so.0")),)
except ImportError:
    _INSTALLED = ()
_CANDIDATES = (os.path.normpath(os.path.join(_HERE, os.pardir, os.pardir, "build", "libmoe.so")),) + _INSTALLED + (
    "libmoe.so.0", "libmoe.so")


def _load():
    env = os.environ.get("MOE_LIBRARY")
    if env:  # an explicit choice: no fallback that would hide a wrong path
        return C.CDLL(env)
    tried = []
    for name in _CANDIDATES:
        try:
            return C.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ImportError("libmoe: cannot load the shared library; set MOE_LIBRARY to its path "
                      "(e.g. build/libmoe.so). Tried:\n  " + "\n  ".join(tried))


lib = _load()
lib.moe_blas_better_coretype.restype = C.c_char_p
if lib.moe_blas_better_coretype():  # `moe` would restart with other kernels: its runs' bits differ from ours
    import warnings
    warnings.warn("libmoe: OpenBLAS chose kernels without AVX-512 here, where `moe` asks for %s: a run started by one "
                  "resumes in the other with other bits (set OPENBLAS_CORETYPE before importing libmoe)"
                  % lib.moe_blas_better_coretype().decode(), RuntimeWarning)

_p = C.POINTER
_status = C.c_int
_str = C.c_char_p
_layer = _p(S.Layer)
_model = _p(S.Model)
_f32 = _p(C.c_float)
_i32 = _p(C.c_int32)
_PROTOTYPES = {
    "moe_status_name": (_str, [_status]),
    "moe_last_error": (_str, []),
    "moe_blas_info": (_str, []),
    "moe_act_name": (_str, [C.c_int]),
    "moe_dispatch_name": (_str, [C.c_int]),
    "moe_priority_name": (_str, [C.c_int]),
    "moe_router_name": (_str, [C.c_int]),
    "moe_reuse_name": (_str, [C.c_int]),
    "moe_score_name": (_str, [C.c_int]),
    "moe_group_score_name": (_str, [C.c_int]),
    "moe_compute_dtype_name": (_str, [C.c_int]),
    "moe_loss_name": (_str, [C.c_int]),
    "moe_opt_name": (_str, [C.c_int]),
    "moe_act_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_dispatch_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_priority_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_router_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_reuse_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_score_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_group_score_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_dtype_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_loss_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_opt_parse": (_status, [_str, _str, _p(C.c_int)]),
    "moe_layer_config_default": (None, [_p(S.LayerConfig)]),
    "moe_layer_init": (_status, [_layer, _p(S.LayerConfig)]),
    "moe_layer_free": (None, [_layer]),
    "moe_layer_init_params": (None, [_layer, C.c_uint64]),
    "moe_layer_zero_grad": (None, [_layer]),
    "moe_layer_params_changed": (None, [_layer]),
    "moe_layer_set_top_k": (_status, [_layer, C.c_int]),
    "moe_layer_set_threads": (None, [_layer, C.c_int]),
    "moe_layer_set_expert_capacity": (_status, [_layer, _i32, C.c_int]),
    "moe_layer_forward": (_status, [_layer, _f32, C.c_int, _f32, _f32, _p(S.LayerStats)]),
    "moe_layer_backward": (_status, [_layer, _f32, C.c_float, C.c_float, _f32, _f32, _f32]),
    "moe_layer_peak_bytes": (C.c_size_t, [_layer]),
    "moe_layer_overrides_init": (None, [_p(S.LayerOverrides)]),
    "moe_layer_load": (_status, [_layer, C.c_void_p, _p(S.LayerOverrides)]),
    "moe_layer_save_params": (_status, [_layer, C.c_void_p]),
    "moe_layer_save_grads": (_status, [_layer, C.c_void_p, _str]),
    "moe_st_open": (_status, [_p(C.c_void_p), _str]),
    "moe_st_close": (None, [C.c_void_p]),
    "moe_st_writer_new": (_status, [_p(C.c_void_p)]),
    "moe_st_writer_free": (None, [C.c_void_p]),
    "moe_st_writer_save": (_status, [C.c_void_p, _str]),
    "moe_model_config_default": (None, [_p(S.ModelConfig)]),
    "moe_model_init": (_status, [_model, _p(S.ModelConfig)]),
    "moe_model_free": (None, [_model]),
    "moe_model_init_params": (None, [_model, C.c_uint64]),
    "moe_model_zero_grad": (None, [_model]),
    "moe_model_forward": (_status, [_model, _f32, _p(C.c_uint8), C.c_int, _p(S.ModelStats)]),
    "moe_model_predictions": (_i32, [_model]),
    "moe_model_layer_stats": (_p(S.LayerStats), [_model, C.c_int]),
    "moe_model_backward": (_status, [_model]),
    "moe_model_set_threads": (None, [_model, C.c_int]),
    "moe_optim_config_default": (None, [_p(S.OptimConfig)]),
    "moe_optim_init": (_status, [_p(S.Optim), _p(S.OptimConfig), _model]),
    "moe_optim_free": (None, [_p(S.Optim)]),
    "moe_optim_step": (None, [_p(S.Optim), _model, C.c_float]),
    "moe_lr_schedule": (C.c_float, [C.c_float, C.c_int64, C.c_int64, C.c_int64]),
    "moe_checkpoint_save": (_status, [_str, _model, _p(S.Optim), _p(S.TrainState)]),
    "moe_checkpoint_load": (_status, [_str, _model, _p(S.Optim), _p(S.TrainState)]),
    "moe_dataset_load_idx": (_status, [_p(S.Dataset), _str, _str]),
    "moe_dataset_free": (None, [_p(S.Dataset)]),
}
for _name, (_res, _args) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


class MoeError(Exception):
    """A libmoe call failed: `status` is the moe_status code, `name` its name ("MOE_ERR_SHAPE") and
    `message` moe_last_error(), which names the file, tensor, field and value at fault."""

    def __init__(self, status, message):
        self.status = int(status)
        self.name = lib.moe_status_name(self.status).decode()
        self.message = message
        super().__init__(f"{self.name}: {message}")


class Owner:
    """A Python object owning the C struct self._c, which the C function _free releases when the object
    goes (after the last numpy view of its memory, since views keep it alive)."""
    _free = None

    def __copy__(self):  # a copy of the struct would free the same memory twice
        raise TypeError(f"a libmoe {type(self).__name__} owns C memory and cannot be copied")

    __deepcopy__ = __copy__

    def __del__(self):
        if getattr(self, "_c", None) is not None:
            self._free(C.byref(self._c))


def check(status):
    """Raises MoeError for a failed call, with this thread's moe_last_error()."""
    if status != 0:
        raise MoeError(status, lib.moe_last_error().decode(errors="replace"))


# the status names in enum order, from the library itself
STATUS = []
while not STATUS or STATUS[-1] != "MOE_ERR_UNKNOWN":
    STATUS.append(lib.moe_status_name(len(STATUS)).decode())
STATUS.pop()


def fail(name, message):
    """A MoeError for a check made on the Python side (status by its name, e.g. "MOE_ERR_SHAPE")."""
    return MoeError(STATUS.index(name), message)


def text(s):
    """A str, bytes or path as the bytes a C string argument takes."""
    return os.fsencode(s)


def address(p):
    """A ctypes pointer's address (None for NULL)."""
    return C.cast(p, C.c_void_p).value


def view(addr, shape, owner, ctype=C.c_float):
    """A numpy array over C memory at addr (an int or a ctypes pointer; no copy), keeping owner (what
    frees that memory) alive."""
    addr = addr if isinstance(addr, int) else address(addr)
    n = int(np.prod(shape, dtype=np.int64))
    buf = (ctype * n).from_address(addr) if n else (ctype * 0)()
    buf._owner = owner
    return np.frombuffer(buf, dtype=np.dtype(ctype)).reshape(shape)
