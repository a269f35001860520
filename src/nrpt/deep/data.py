"""Offline datasets for deep posteriors (classification, and diabetes for regression), as
tensors, with batched augmentation.

:func:`load_dataset` returns a :class:`Dataset` (float32 ``x[n, *input_shape]``, int64
``y[n]`` in ``[0, classes)``, fixed train/test split, optional ``augment``).  Nothing is
downloaded:

=============  ==================================================  =============  ===========
name           source                                              train / test   input_shape
=============  ==================================================  =============  ===========
``digits``     scikit-learn's bundled ``load_digits`` (8×8, 0–16)  1346 / 451     (1, 8, 8)
``mnist1d``    the ``mnist1d`` package, generated offline           4000 / 1000    (1, 40)
``cifar10``    CIFAR-10 "python version" batches under ``root``    50000 / 10000  (3, 32, 32)
``cifar100``   CIFAR-100 "python version" (fine labels)            50000 / 10000  (3, 32, 32)
``synthetic-   CIFAR-shaped random images, 100 classes, generated  5000 / 1000    (3, 32, 32)
cifar``        from ``seed`` (throughput: benchmarks/deep_speed.py)
``diabetes``   scikit-learn's bundled ``load_diabetes`` (regression) 354 / 88      (10,)
=============  ==================================================  =============  ===========

``diabetes`` is a regression set (``classes`` 0, float32 targets ``y[n]``: disease progression
after one year, 25-346): a seeded 20 % test split, the ten raw features standardised with the
training split's mean and (population) sd; the targets stay in their original units
(:func:`nrpt.deep.fit` standardises them itself for ``likelihood="gaussian"``).

Normalisation from training statistics (digits: one mean and sd; CIFAR: per channel;
MNIST-1D: its package's).  CIFAR augmentation (:class:`CifarAugment`, Deng et al. 2023):
torchvision's ``RandomCrop(32, padding=4)`` (black padding) → ``RandomHorizontalFlip`` →
``Normalize`` → ``RandomErasing(p=0.5)`` (value 0), batched, per-example draws from the
given generator."""

from __future__ import annotations

import functools
import math
import pickle
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["DATASETS", "CifarAugment", "Dataset", "FlatAugment", "load_dataset",
           "random_crop", "random_erasing", "random_hflip"]

DATASETS = ("digits", "mnist1d", "cifar10", "cifar100", "synthetic-cifar", "diabetes")

Augment = Callable[[Tensor, torch.Generator], Tensor]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A dataset held in memory.

    ``x_train[n, *input_shape]`` / ``x_test`` are float32, ``y_train[n]`` / ``y_test`` int64 in
    ``[0, classes)`` (a regression set: ``classes`` 0 and float32 targets);
    ``input_shape == tuple(x_train.shape[1:])`` (``(prod,)`` when loaded with
    ``flatten=True``).  ``augment`` is ``None`` or ``augment(x[B, *input_shape], generator)``
    returning a new tensor of the same shape (training batches only; never the test set)."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    classes: int
    input_shape: tuple[int, ...]
    augment: Augment | None = field(default=None)

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}, train={self.x_train.shape[0]}, "
                f"test={self.x_test.shape[0]}, classes={self.classes}, "
                f"input_shape={self.input_shape}, augment={self.augment!r})")


# ------------------------------------------------------------------------------ augmentation
def _uniform(generator: torch.Generator, *shape: int) -> Tensor:
    return torch.rand(*shape, generator=generator, device=generator.device, dtype=torch.float64)


def _check_images(x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a batch of images [B, C, H, W], got {shape}")


def random_crop(x: Tensor, generator: torch.Generator, padding: int = 4,
                fill: float | Sequence[float] = 0.0) -> Tensor:
    """Pad each image by ``padding`` pixels of ``fill`` (a number, or one per channel) and cut
    an ``H × W`` window at a uniformly random offset in ``{0, …, 2·padding}²`` per image
    (torchvision's ``RandomCrop(H, padding)``).  Draws: ``top[B]`` then ``left[B]``."""
    _check_images(x)
    b, c, h, w = x.shape
    p = int(padding)
    if p < 0:
        raise ValueError(f"padding must be >= 0, got {padding!r}")
    fill_t = torch.as_tensor(fill, dtype=x.dtype, device=x.device).reshape(-1)
    if fill_t.numel() not in (1, c):
        raise ValueError(f"fill must be a number or {c} numbers (one per channel), "
                         f"got {fill_t.numel()}")
    padded = fill_t.reshape(1, -1, 1, 1).expand(b, c, h + 2 * p, w + 2 * p).clone()
    padded[:, :, p:p + h, p:p + w] = x
    top = (_uniform(generator, b) * (2 * p + 1)).floor().long().to(x.device)
    left = (_uniform(generator, b) * (2 * p + 1)).floor().long().to(x.device)
    rows = top[:, None] + torch.arange(h, device=x.device)              # [B, H]
    cols = left[:, None] + torch.arange(w, device=x.device)             # [B, W]
    batch = torch.arange(b, device=x.device)[:, None, None]
    # advanced indices around a slice put their broadcast dims first: [B, H, W, C]
    out = padded[batch, :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


def random_hflip(x: Tensor, generator: torch.Generator, p: float = 0.5) -> Tensor:
    """Mirror each image left–right with probability ``p``.  Draws: ``u[B]``."""
    _check_images(x)
    flip = (_uniform(generator, x.shape[0]) < p).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def random_erasing(x: Tensor, generator: torch.Generator, p: float = 0.5,
                   scale: tuple[float, float] = (0.02, 0.33),
                   ratio: tuple[float, float] = (0.3, 3.3), value: float = 0.0,
                   attempts: int = 10) -> Tensor:
    """Random erasing (Zhong et al. 2020; torchvision's ``RandomErasing`` algorithm), batched:
    with probability ``p`` one rectangle of area ``s·H·W`` (``s ~ U(scale)``) and aspect ``r``
    (``log r ~ U(log ratio)``) set to ``value``; the first of ``attempts`` that fits, else none."""
    _check_images(x)
    b, _, hh, ww = x.shape
    if not (scale[0] <= scale[1] and ratio[0] <= ratio[1] and ratio[0] > 0):
        raise ValueError(f"scale and ratio must be (low, high) ranges with ratio > 0, "
                         f"got scale={scale}, ratio={ratio}")
    apply = _uniform(generator, b) < p
    area = hh * ww * (scale[0] + (scale[1] - scale[0]) * _uniform(generator, b, attempts))
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (hi - lo) * _uniform(generator, b, attempts))
    h = torch.round(torch.sqrt(area * aspect)).long()
    w = torch.round(torch.sqrt(area / aspect)).long()
    fits = (h < hh) & (w < ww)
    first = fits.long().argmax(dim=1, keepdim=True)          # first fitting attempt (or 0)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    top = (_uniform(generator, b) * (hh - h + 1)).floor().long()
    left = (_uniform(generator, b) * (ww - w + 1)).floor().long()
    erase = (apply & fits.any(dim=1)).to(x.device)
    top, left, h, w = (t.to(x.device) for t in (top, left, h, w))
    r = torch.arange(hh, device=x.device)[None, :]
    c = torch.arange(ww, device=x.device)[None, :]
    in_rows = (r >= top[:, None]) & (r < (top + h)[:, None])                 # [B, H]
    in_cols = (c >= left[:, None]) & (c < (left + w)[:, None])               # [B, W]
    mask = in_rows[:, :, None] & in_cols[:, None, :] & erase[:, None, None]  # [B, H, W]
    return torch.where(mask[:, None], x.new_full((), value), x)


@dataclass(frozen=True)
class CifarAugment:
    """The AAAI paper's CIFAR augmentation: :func:`random_crop` (``padding``, ``fill``) →
    :func:`random_hflip` (p 0.5) → :func:`random_erasing` (``erase_p``, torchvision's defaults).

    ``fill`` is the crop's padding per channel in normalised units; :func:`load_dataset` sets it
    to ``-mean/sd`` (black before normalisation, as torchvision pads the PIL image)."""

    fill: tuple[float, ...] = (0.0,)
    padding: int = 4
    erase_p: float = 0.5

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        x = random_crop(x, generator, self.padding, self.fill)
        x = random_hflip(x, generator)
        return random_erasing(x, generator, p=self.erase_p)


@dataclass(frozen=True)
class FlatAugment:
    """``augment`` of a flattened dataset: reshape ``[B, prod]`` to ``[B, *shape]``, apply the
    image augmentation, flatten back."""

    inner: Augment
    shape: tuple[int, ...]

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        out = self.inner(x.reshape(x.shape[0], *self.shape), generator)
        return out.reshape(x.shape[0], -1)


# ------------------------------------------------------------------------------ digits
def _digits(seed: int):
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:                      # pragma: no cover - depends on the env
        raise ImportError("dataset 'digits' needs scikit-learn: pip install 'nrpt[deep]'") from err
    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float64).reshape(-1, 1, 8, 8) / 16.0
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    # stratified 25 % test: walk a seeded permutation, and per class send the first
    # round(n_c / 4) examples met to the test set
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=gen)
    test = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        where = (y[perm] == c).nonzero()[:, 0]
        test[where[: int(math.floor(len(where) / 4 + 0.5))]] = True
    tr, te = perm[~test], perm[test]
    mean, sd = x[tr].mean(), x[tr].std(correction=0)
    x = ((x - mean) / sd).to(torch.float32)
    return x[tr], y[tr], x[te], y[te], 10, None


# ------------------------------------------------------------------------------ diabetes
def _diabetes(seed: int):
    try:
        from sklearn.datasets import load_diabetes
    except ImportError as err:                      # pragma: no cover - depends on the env
        raise ImportError("dataset 'diabetes' needs scikit-learn: pip install 'nrpt[deep]'"
                          ) from err
    bunch = load_diabetes(scaled=False)
    x = torch.as_tensor(bunch.data, dtype=torch.float64)
    y = torch.as_tensor(bunch.target, dtype=torch.float64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(math.floor(len(y) / 5 + 0.5))
    te, tr = perm[:n_test], perm[n_test:]
    mean, sd = x[tr].mean(0), x[tr].std(0, correction=0)
    x = ((x - mean) / sd).to(torch.float32)
    y = y.to(torch.float32)
    return x[tr], y[tr], x[te], y[te], 0, None


# ------------------------------------------------------------------------------ MNIST-1D
@functools.lru_cache(maxsize=1)
def _mnist1d_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate MNIST-1D with the package's default arguments (seed 42), once per process.

    ``make_dataset`` seeds and draws from numpy's and Python's global RNGs; both states are
    saved and restored around it, so loading leaves the caller's global RNGs as they were."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as err:                      # pragma: no cover - depends on the env
        raise ImportError("dataset 'mnist1d' needs the mnist1d package: "
                          "pip install 'nrpt[deep]'") from err
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(get_dataset_args())        # never get_dataset(): that one downloads
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    arrays = (d["x"], d["y"], d["x_test"], d["y_test"])
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _mnist1d():
    x, y, xt, yt = _mnist1d_arrays()

    def xs(a):
        return torch.tensor(a, dtype=torch.float32).unsqueeze(1)         # [n, 1, 40], a copy

    return (xs(x), torch.tensor(y, dtype=torch.int64), xs(xt),
            torch.tensor(yt, dtype=torch.int64), 10, None)


# ------------------------------------------------------------------------------ CIFAR
_CIFAR_PAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"
_CIFAR = {
    # name: (folder, train files, test files, label key, classes, tarball)
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                b"labels", 10, "cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", 100,
                 "cifar-100-python.tar.gz"),
}


def _how_to_get(name: str, root: str) -> str:
    folder, train, test, _, _, tarball = _CIFAR[name]
    return (f"{name} is read from the 'python version' files {', '.join(train + test)} in "
            f"{root}/{folder}/. Download {tarball} from {_CIFAR_PAGE} and extract it into "
            f"{root} (tar -xzf {tarball} -C {root}); nrpt never downloads.")


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays (the CIFAR files' content): a pickle
    naming any other global is refused instead of run."""

    _ALLOWED = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): __import__("codecs").encode,
        # numpy >= 2 names numpy._core, older pickles numpy.core: resolve both to the function
        # this numpy's arrays reduce with (no import of the deprecated alias)
        **{(mod, "_reconstruct"): np.zeros(1).__reduce__()[0]
           for mod in ("numpy.core.multiarray", "numpy._core.multiarray")},
        **{(mod, "scalar"): np.float64(0).__reduce__()[0]
           for mod in ("numpy.core.multiarray", "numpy._core.multiarray")},
    }

    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: CIFAR files hold only numpy arrays "
                f"and lists") from None


def _read_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        d = _ArrayUnpickler(fh, encoding="bytes").load()
    if not isinstance(d, dict) or b"data" not in d or label_key not in d:
        raise ValueError(f"{path} is not a CIFAR python-version batch "
                         f"(a dict with b'data' and {label_key!r})")
    data = np.asarray(d[b"data"], dtype=np.uint8)
    labels = np.asarray(d[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: b'data' must be uint8 [n, 3072] with n labels, got "
                         f"{data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _read_split(name: str, split: str, files: list[Path], key: bytes,
                classes: int) -> tuple[np.ndarray, np.ndarray]:
    parts = [_read_batch(f, key) for f in files]
    xs = np.concatenate([p[0] for p in parts])
    ys = np.concatenate([p[1] for p in parts])
    if ys.size and (ys.min() < 0 or ys.max() >= classes):
        raise ValueError(f"{name} {split} labels must lie in [0, {classes}), got "
                         f"[{ys.min()}, {ys.max()}]")
    return xs, ys


def _channel_moments(name: str, x_u8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population sd of the pixels in [0, 1], exactly, from the
    histogram of the 256 byte values."""
    values = np.arange(256, dtype=np.float64) / 255.0
    mean, sd = np.empty(3), np.empty(3)
    for c in range(3):
        hist = np.bincount(x_u8[:, c].ravel(), minlength=256).astype(np.float64)
        hist /= hist.sum()
        mean[c] = hist @ values
        sd[c] = math.sqrt(hist @ (values - mean[c]) ** 2)
    if not (sd > 0).all():
        raise ValueError(f"{name}: a channel of the training images is constant (sd 0)")
    return mean, sd


def _cifar(name: str, root):
    if root is None:
        raise ValueError(f"dataset {name!r} is read from disk: pass root=DIR (CLI: --data-dir "
                         f"DIR). " + _how_to_get(name, "DIR"))
    root = Path(root).expanduser()
    folder, train_files, test_files, key, classes, _ = _CIFAR[name]
    base = root / folder
    missing = [f for f in train_files + test_files if not (base / f).is_file()]
    if missing:
        what = f"{base} does not exist" if not base.is_dir() else \
            f"missing in {base}: {', '.join(missing)}"
        raise FileNotFoundError(f"{what}. " + _how_to_get(name, str(root)))
    x_tr, y_tr = _read_split(name, "train", [base / f for f in train_files], key, classes)
    x_te, y_te = _read_split(name, "test", [base / f for f in test_files], key, classes)
    mean, sd = _channel_moments(name, x_tr)

    def norm(u8: np.ndarray) -> Tensor:
        x = torch.from_numpy(u8).to(torch.float32).div_(255.0)
        m = torch.as_tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        s = torch.as_tensor(sd, dtype=torch.float32).view(1, 3, 1, 1)
        return x.sub_(m).div_(s)

    augment = CifarAugment(fill=tuple(float(-m / s) for m, s in zip(mean, sd, strict=True)))
    return (norm(x_tr), torch.from_numpy(y_tr), norm(x_te), torch.from_numpy(y_te), classes,
            augment)


# ------------------------------------------------------------------------------ synthetic CIFAR
#: sizes of ``synthetic-cifar`` (a tenth of CIFAR-100's, its shapes and class count)
SYNTHETIC_CIFAR = {"train": 5000, "test": 1000, "classes": 100, "shape": (3, 32, 32)}


def _synthetic_cifar(seed: int):
    """CIFAR-shaped data for throughput measurements: standard-normal images ``[3, 32, 32]``
    smoothed by a 2x2 average (so crops and flips change them as they change photographs), and
    labels that a network can learn: the argmax over 100 classes of a fixed random linear map
    of the 4x4-pooled image plus Gumbel noise.  Everything is drawn from one CPU generator
    seeded from ``seed``: the same seed gives the same tensors on every machine."""
    from nrpt import rng

    g = torch.Generator().manual_seed(rng.key(seed, rng.Stream.USER + 503))
    n_tr, n_te, classes = (SYNTHETIC_CIFAR[k] for k in ("train", "test", "classes"))
    c, h, w = SYNTHETIC_CIFAR["shape"]
    raw = torch.randn(n_tr + n_te, c, h + 1, w + 1, generator=g)
    x = 0.25 * (raw[..., 1:, 1:] + raw[..., :-1, 1:] + raw[..., 1:, :-1] + raw[..., :-1, :-1])
    x = (x / x.std()).contiguous()
    pooled = torch.nn.functional.avg_pool2d(x, 8).reshape(n_tr + n_te, -1)  # [n, 48]
    weights = torch.randn(pooled.shape[1], classes, generator=g)
    gumbel = -torch.log(-torch.log(torch.rand(n_tr + n_te, classes, generator=g)
                                   .clamp_(1e-12, 1 - 1e-7)))
    y = (4.0 * pooled @ weights + gumbel).argmax(-1)
    return (x[:n_tr], y[:n_tr], x[n_tr:], y[n_tr:], classes, CifarAugment(fill=(0.0,) * c))


# ------------------------------------------------------------------------------ entry point
def load_dataset(name: str, *, root: str | Path | None = None, seed: int = 0,
                 flatten: bool = False) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`) as a :class:`Dataset`.

    Args:
        name: ``digits``, ``mnist1d``, ``cifar10``, ``cifar100``, ``synthetic-cifar`` or
            ``diabetes``.
        root: CIFAR only: the directory holding ``cifar-10-batches-py/`` or ``cifar-100-python/``.
        seed: the digits split (stratified 25 % test set), the diabetes one (20 %), the
            synthetic set's draws; no
            effect on the fixed splits.
        flatten: ``x`` as ``[n, prod(input_shape)]`` (``input_shape = (prod,)``).

    Raises:
        ValueError: an unknown name, or CIFAR without ``root``.
        FileNotFoundError: CIFAR files missing (the message says which, and where to get them)."""
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {name!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if name == "digits":
        x, y, xt, yt, classes, augment = _digits(seed)
    elif name == "mnist1d":
        x, y, xt, yt, classes, augment = _mnist1d()
    elif name == "diabetes":
        x, y, xt, yt, classes, augment = _diabetes(seed)
    elif name == "synthetic-cifar":
        x, y, xt, yt, classes, augment = _synthetic_cifar(seed)
    else:
        x, y, xt, yt, classes, augment = _cifar(name, root)
    shape = tuple(x.shape[1:])
    if flatten:
        x, xt = x.reshape(x.shape[0], -1), xt.reshape(xt.shape[0], -1)
        if augment is not None:
            augment = FlatAugment(augment, shape)
        shape = (math.prod(shape),)
    return Dataset(name, x, y, xt, yt, classes, shape, augment)
