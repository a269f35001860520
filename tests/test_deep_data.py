"""Offline datasets (nrpt.deep.data): digits split and standardisation, MNIST-1D generated without
touching the global RNGs, CIFAR read from fake python-version batches, and the batched
augmentation (crop, flip, erasing) checked on crafted images."""

from __future__ import annotations

import math
import pickle
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from nrpt.deep import data
from nrpt.deep.data import CifarAugment, load_dataset, random_crop, random_erasing, random_hflip

# ------------------------------------------------------------------------------ digits


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.reshape(x.shape[0], -1)}


def test_digits_shapes_split_and_standardisation():
    d = load_dataset("digits")
    assert d.input_shape == (1, 8, 8) and d.classes == 10 and d.augment is None
    assert d.x_train.shape == (1346, 1, 8, 8) and d.x_test.shape == (451, 1, 8, 8)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    # standardised with the training pixels' mean and (population) sd
    assert abs(d.x_train.double().mean().item()) < 1e-6
    assert d.x_train.double().std(correction=0).item() == pytest.approx(1.0, abs=1e-6)
    # stratified: every class has round(n_c / 4) test examples
    counts = np.bincount(np.concatenate([d.y_train.numpy(), d.y_test.numpy()]), minlength=10)
    assert d.y_test.bincount(minlength=10).tolist() == [math.floor(c / 4 + 0.5) for c in counts]
    # disjoint and complete (the 1797 digits images are all distinct)
    train, test = _rows(d.x_train), _rows(d.x_test)
    assert len(train) == 1346 and len(test) == 451 and not train & test
    # reproducible by seed; a different seed is a different split (negative control)
    again, other = load_dataset("digits", seed=0), load_dataset("digits", seed=1)
    assert torch.equal(again.x_test, d.x_test) and torch.equal(again.y_train, d.y_train)
    assert _rows(other.x_test) != test
    flat = load_dataset("digits", flatten=True, root="/ignored")
    assert flat.x_train.shape == (1346, 64) and flat.input_shape == (64,)
    assert torch.equal(flat.x_train, d.x_train.reshape(1346, 64))


# ------------------------------------------------------------------------------ MNIST-1D
def test_mnist1d_offline_deterministic_and_global_rngs_untouched():
    first = load_dataset("mnist1d")
    assert first.x_train.shape == (4000, 1, 40) and first.x_test.shape == (1000, 1, 40)
    assert first.input_shape == (1, 40) and first.classes == 10
    assert first.y_train.dtype == torch.int64 and set(first.y_train.unique().tolist()) == set(
        range(10))
    # generate again from scratch, with the global RNGs in states the package's own seeding
    # (42) would not reproduce; they must be left as they were (and are restored afterwards,
    # so this test leaks no global state either)
    data._mnist1d_arrays.cache_clear()
    saved = np.random.get_state(), random.getstate()
    try:
        np.random.seed(123)
        random.seed(456)
        np_state, py_state = np.random.get_state(), random.getstate()
        second = load_dataset("mnist1d")
        after, py_after = np.random.get_state(), random.getstate()
    finally:
        np.random.set_state(saved[0])
        random.setstate(saved[1])
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1])
    assert after[2:] == np_state[2:] and py_after == py_state
    assert torch.equal(first.x_train, second.x_train) and torch.equal(first.y_test, second.y_test)
    # callers get copies: mutating one load does not change the next
    second.x_train.zero_()
    assert torch.equal(load_dataset("mnist1d").x_train, first.x_train)


# ------------------------------------------------------------------------------ CIFAR
def _write_batch(path, n, label_key, classes, rng):
    d = {b"batch_label": b"fake", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
         label_key: rng.integers(0, classes, n).tolist(),
         b"filenames": [b"img%d.png" % i for i in range(n)]}
    with open(path, "wb") as fh:
        pickle.dump(d, fh, protocol=2)
    return d


def _fake_cifar10(root):
    rng = np.random.default_rng(0)                  # a local generator, not the global one
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    batches = [_write_batch(base / f"data_batch_{i}", 4, b"labels", 10, rng) for i in range(1, 6)]
    test = _write_batch(base / "test_batch", 3, b"labels", 10, rng)
    return batches, test


def test_cifar10_from_fake_batches(tmp_path):
    batches, test = _fake_cifar10(tmp_path)
    d = load_dataset("cifar10", root=tmp_path)
    assert d.x_train.shape == (20, 3, 32, 32) and d.x_test.shape == (3, 3, 32, 32)
    assert d.input_shape == (3, 32, 32) and d.classes == 10 and d.x_train.dtype == torch.float32
    assert d.y_train.tolist() == sum((b[b"labels"] for b in batches), [])
    assert d.y_test.tolist() == test[b"labels"]
    u8 = np.concatenate([b[b"data"] for b in batches]).reshape(20, 3, 32, 32) / 255.0
    mean, sd = u8.mean(axis=(0, 2, 3)), u8.std(axis=(0, 2, 3))
    expect = (u8 - mean[None, :, None, None]) / sd[None, :, None, None]
    np.testing.assert_allclose(d.x_train.numpy(), expect, atol=1e-5)
    t8 = test[b"data"].reshape(3, 3, 32, 32) / 255.0
    np.testing.assert_allclose(d.x_test.numpy(),
                               (t8 - mean[None, :, None, None]) / sd[None, :, None, None],
                               atol=1e-5)
    x = d.x_train.double()
    assert x.mean(dim=(0, 2, 3)).abs().max() < 1e-6
    assert (x.std(dim=(0, 2, 3), correction=0) - 1).abs().max() < 1e-6
    # the crop pads with black before normalisation: -mean/sd per channel
    assert d.augment.fill == pytest.approx(tuple(-mean / sd), abs=1e-12)
    out = d.augment(d.x_train, torch.Generator().manual_seed(0))
    assert out.shape == d.x_train.shape
    flat = load_dataset("cifar10", root=str(tmp_path), flatten=True)
    assert flat.x_train.shape == (20, 3072) and flat.input_shape == (3072,)
    flat_out = flat.augment(flat.x_train, torch.Generator().manual_seed(0))
    assert torch.equal(flat_out, out.reshape(20, 3072))


def test_cifar100_fine_labels(tmp_path):
    rng = np.random.default_rng(1)
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    train = _write_batch(base / "train", 6, b"fine_labels", 100, rng)
    _write_batch(base / "test", 2, b"fine_labels", 100, rng)
    d = load_dataset("cifar100", root=tmp_path)
    assert d.classes == 100 and d.x_train.shape == (6, 3, 32, 32) and d.x_test.shape[0] == 2
    assert d.y_train.tolist() == train[b"fine_labels"]


def test_cifar_missing_files_say_what_to_put_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py does not exist") as err:
        load_dataset("cifar10", root=tmp_path)
    msg = str(err.value)
    for part in ("data_batch_1", "data_batch_5", "test_batch", "cifar-10-python.tar.gz",
                 "https://www.cs.toronto.edu/~kriz/cifar.html", str(tmp_path)):
        assert part in msg
    _fake_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="missing in .*: data_batch_3"):
        load_dataset("cifar10", root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"train, test in .*cifar-100-python.*"
                                                r"cifar-100-python\.tar\.gz"):
        load_dataset("cifar100", root=tmp_path)
    with pytest.raises(ValueError, match="pass root=DIR \\(CLI: --data-dir DIR\\)"):
        load_dataset("cifar10")
    with pytest.raises(ValueError, match="dataset must be one of digits, mnist1d, cifar10, "
                                         "cifar100"):
        load_dataset("mnist")


def test_cifar_pickles_may_hold_only_arrays(tmp_path):
    _fake_cifar10(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as fh:
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [Fraction(1, 2)]}, fh)
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle fractions.Fraction"):
        load_dataset("cifar10", root=tmp_path)


# ------------------------------------------------------------------------------ augmentation
def _crafted(b: int, c: int = 2, h: int = 6, w: int = 5) -> torch.Tensor:
    """Distinct positive values, so any shifted window is recognisable."""
    return (1 + torch.arange(b * c * h * w, dtype=torch.float64)).reshape(b, c, h, w)


def test_random_crop_is_a_shifted_copy_with_zero_padding():
    x = _crafted(64)
    out = random_crop(x, torch.Generator().manual_seed(0), padding=2)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    offsets = set()
    for i in range(64):
        hits = [(t, s) for t in range(5) for s in range(5)
                if torch.equal(out[i], padded[i, :, t:t + 6, s:s + 5])]
        assert len(hits) == 1, i                  # exactly one shift explains the image
        offsets.add(hits[0])
    assert len(offsets) > 15                      # 25 offsets possible, each image its own draw
    # a per-channel fill pads each channel with its own value
    filled = random_crop(x[:1], torch.Generator().manual_seed(3), padding=6, fill=(-1.0, -2.0))
    assert set(filled[0, 0][filled[0, 0] <= 0].tolist()) <= {-1.0}
    assert (filled[0, 1] == -2.0).any() and not (filled[0, 1] == -1.0).any()


def test_random_hflip_mirrors_about_half():
    x = _crafted(2000, c=1, h=2, w=3)
    out = random_hflip(x, torch.Generator().manual_seed(1))
    same = (out == x).flatten(1).all(1)
    mirrored = (out == x.flip(-1)).flatten(1).all(1)
    assert bool((same ^ mirrored).all())          # each image exactly one of the two
    # binomial(2000, .5): sd .0112, 5 sd
    assert abs(mirrored.double().mean().item() - 0.5) < 5 * math.sqrt(0.25 / 2000)
    assert torch.equal(random_hflip(x, torch.Generator(), p=1.0), x.flip(-1))


def test_random_erasing_zeros_one_rectangle_in_about_half():
    n = 2000
    x = torch.ones(n, 3, 32, 32)
    out = random_erasing(x, torch.Generator().manual_seed(2))
    assert out.shape == x.shape and set(out.unique().tolist()) <= {0.0, 1.0}
    zero = out == 0
    assert torch.equal(zero, zero[:, :1].expand_as(zero))      # same rectangle in every channel
    erased = zero.flatten(1).any(1)
    # P(erase) = .5 (less the chance that none of 10 candidates fits, < 1e-9): 5 sd of
    # binomial(2000, .5)
    assert abs(erased.double().mean().item() - 0.5) < 5 * math.sqrt(0.25 / n)
    fractions = []
    for i in erased.nonzero()[:, 0].tolist():
        z = zero[i, 0]
        rows, cols = z.any(1).nonzero()[:, 0], z.any(0).nonzero()[:, 0]
        # a rectangle: the zeros are exactly the product of a contiguous row and column range
        assert rows[-1] - rows[0] + 1 == len(rows) and cols[-1] - cols[0] + 1 == len(cols)
        assert int(z.sum()) == len(rows) * len(cols)
        assert len(rows) < 32 and len(cols) < 32
        fractions.append(len(rows) * len(cols) / 1024)
    # areas s.HW with s ~ U(.02, .33) up to the rounding of h and w
    assert 0.01 < min(fractions) and max(fractions) < 0.40
    assert sum(fractions) / len(fractions) == pytest.approx(0.175, abs=0.02)
    assert not random_erasing(x, torch.Generator().manual_seed(2), p=0.0).eq(0).any()


def test_augment_is_keyed_by_the_generator():
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    aug = CifarAugment(fill=(-1.0, -2.0, -3.0))
    a = aug(x, torch.Generator().manual_seed(7))
    b = aug(x, torch.Generator().manual_seed(7))
    c = aug(x, torch.Generator().manual_seed(8))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, x)
    state = torch.random.get_rng_state()
    aug(x, torch.Generator().manual_seed(9))
    assert torch.equal(torch.random.get_rng_state(), state)       # no global RNG draws
    with pytest.raises(ValueError, match=r"x must be a batch of images \[B, C, H, W\]"):
        aug(x[0], torch.Generator())
