"""IDX data sets (the MNIST format), read by the library's strict reader (moe_dataset_load_idx)."""
import ctypes as C
import os
from dataclasses import dataclass

import numpy as np

from . import _structs as S
from ._lib import check, lib, text, view


@dataclass
class Dataset:
    images: np.ndarray  # (n, rows * cols) float32, pixel / 255
    labels: np.ndarray  # (n) uint8
    rows: int
    cols: int
    classes: int        # largest label + 1


def load_idx(images_path, labels_path):
    """An IDX3 ubyte image file and its IDX1 ubyte labels; MoeError naming the file and field when they
    are malformed or do not match."""
    d = S.Dataset()
    check(lib.moe_dataset_load_idx(C.byref(d), text(images_path), text(labels_path)))
    try:
        return Dataset(view(d.images, (d.n, d.rows * d.cols), None).copy(),
                       view(d.labels, (d.n,), None, C.c_uint8).copy(), d.rows, d.cols, d.classes)
    finally:
        lib.moe_dataset_free(C.byref(d))


def load_split(directory, split):
    """Split "train" or "t10k" of an IDX directory (as moe train reads --data): DIR/<split>-images-idx3-ubyte
    and DIR/<split>-labels-idx1-ubyte."""
    return load_idx(os.path.join(directory, f"{split}-images-idx3-ubyte"),
                    os.path.join(directory, f"{split}-labels-idx1-ubyte"))
