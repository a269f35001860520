"""Network builders for deep posteriors: plain ``torch.nn.Module`` s (no torchvision) mapping
``x[B, *input_shape]`` to logits ``[B, classes]``, vmappable (no in-place activations, no
data-dependent control flow).  Parameters are drawn from ``generator`` (default seeded with
0) on modules built on ``meta``: He-normal weights, zero biases, BatchNorm 1 / 0.

=========================  ===============  ===========
builder (10 classes)       input            parameters
=========================  ===============  ===========
``mlp`` (128, 128)         digits 64         26,122
``small_cnn`` width 16     digits (1, 8, 8)  24,058
``cnn1d`` width 32         MNIST-1D (1, 40)   8,106
``resnet(20)``             CIFAR (3, 32, 32) 269,722
``resnet(32)``             CIFAR             464,154
``resnet(56)``             CIFAR             853,018
=========================  ===============  ==========="""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MODELS", "BasicBlock", "ResNet", "build_model", "cnn1d", "init_parameters", "mlp",
           "resnet", "small_cnn"]

MODELS = ("mlp", "cnn", "cnn1d", "resnet20", "resnet32", "resnet56")
_FITS = ("mlp: any input shape (flattened); cnn, resnet20/32/56: images (C, H, W); "
         "cnn1d: sequences (C, L)")


# ------------------------------------------------------------------------------ initialisation
def init_parameters(module: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """(Re)initialise ``module`` in place from ``generator`` and return it.

    Conv/linear weights ~ N(0, 2 / fan_in) (He et al. 2015), biases 0; BatchNorm weight 1,
    bias 0, running mean 0, running variance 1, ``num_batches_tracked`` 0.  Draws are made on
    the CPU in module order, so a seed gives the same network on every device."""
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                w = torch.randn(m.weight.shape, generator=generator, dtype=torch.float64)
                m.weight.copy_(w * math.sqrt(2.0 / fan_in))
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.reset_parameters()         # weight 1, bias 0, running stats reset; no RNG
    return module


def _built(make, generator: torch.Generator | None) -> nn.Module:
    """Construct on ``meta`` (no global RNG draws, no memory), then allocate and initialise."""
    with torch.device("meta"):
        module = make()
    return init_parameters(module.to_empty(device="cpu"), generator)


# ------------------------------------------------------------------------------ builders
def mlp(in_features: int, classes: int, hidden: Sequence[int] = (128, 128), *,
        generator: torch.Generator | None = None) -> nn.Module:
    """Multi-layer perceptron: Flatten → [Linear → ReLU] per hidden width → Linear(classes).

    Takes ``[B, in_features]`` or any ``[B, ...]`` with ``in_features`` elements per example.
    Parameters: Σ (fan_in + 1) · fan_out over the layers (64 → 128 → 128 → 10: 26,122)."""
    widths = [in_features, *hidden]

    def make():
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], classes))
        return nn.Sequential(*layers)

    return _built(make, generator)


def small_cnn(in_channels: int, classes: int, width: int = 16, *,
              generator: torch.Generator | None = None) -> nn.Module:
    """Three 3×3 conv blocks for small images (8×8 digits up to 32×32 CIFAR).

    conv(w)-BN-ReLU-maxpool2 → conv(2w)-BN-ReLU-maxpool2 → conv(4w)-BN-ReLU → global average
    pool → Linear(4w, classes).  Works for any H, W ≥ 4 (8×8 → 4×4 → 2×2 → pool).  Convs have no
    bias (BatchNorm's shift replaces it).  Width 16, 1 channel, 10 classes: 24,058 parameters."""
    w = width

    def block(a, b):
        return [nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU()]

    def make():
        return nn.Sequential(*block(in_channels, w), nn.MaxPool2d(2),
                             *block(w, 2 * w), nn.MaxPool2d(2),
                             *block(2 * w, 4 * w),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, classes))

    return _built(make, generator)


def cnn1d(classes: int, in_channels: int = 1, width: int = 32, *,
          generator: torch.Generator | None = None) -> nn.Module:
    """1-D CNN for MNIST-1D (Greydanus 2020; sequences of length 40).

    conv5(w)-BN-ReLU-maxpool2 → conv3(w)-BN-ReLU-maxpool2 → conv3(w)-BN-ReLU →
    adaptive average pool to 5 positions → Flatten → Linear(5w, classes).  Keeping 5 positions
    (not a global pool) keeps where a feature is, which MNIST-1D's digits need; any L ≥ 5
    works (40 → 20 → 10 → 5).  Width 32, 10 classes: 8,106 parameters."""
    w = width

    def make():
        return nn.Sequential(
            nn.Conv1d(in_channels, w, 5, padding=2, bias=False), nn.BatchNorm1d(w), nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(w, w, 3, padding=1, bias=False), nn.BatchNorm1d(w), nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(w, w, 3, padding=1, bias=False), nn.BatchNorm1d(w), nn.ReLU(),
            nn.AdaptiveAvgPool1d(5), nn.Flatten(), nn.Linear(5 * w, classes))

    return _built(make, generator)


class BasicBlock(nn.Module):
    """conv3×3(stride)-BN-ReLU-conv3×3-BN, plus the shortcut, then ReLU (He et al. 2016, Fig. 2).

    The shortcut is the identity, or, when the block halves the resolution and widens the
    channels, the paper's option A for CIFAR: subsample by 2 and pad the new channels with
    zeros (parameter-free, which is what gives ResNet-20 its 0.27 M parameters)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.stride = stride
        self.extra = planes - in_planes           # channels the shortcut pads with zeros
        if self.extra < 0:
            raise ValueError(f"BasicBlock cannot shrink channels ({in_planes} -> {planes})")

    def shortcut(self, x: Tensor) -> Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra:
            lo = self.extra // 2
            x = F.pad(x, (0, 0, 0, 0, lo, self.extra - lo))
        return x

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def _check_depth(depth: int) -> int:
    """n of depth = 6n + 2, or a ValueError."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"depth must be 6n + 2 for n >= 1 (20, 32, 56, ...), got {depth!r}")
    return (depth - 2) // 6


class ResNet(nn.Module):
    """CIFAR ResNet of He et al. 2016 (Sec. 4.2): depth = 6n + 2.

    conv3×3(16)-BN-ReLU → n BasicBlocks of 16 channels → n of 32 (first stride 2) → n of 64
    (first stride 2) → global average pool → Linear(64, classes).  Shortcuts: identity, option A
    (zero-padded, subsampled) where the shape changes — see :class:`BasicBlock`.  Input
    ``[B, in_channels, H, W]`` (32×32 in the paper; any H, W ≥ 4 works)."""

    def __init__(self, depth: int, classes: int, in_channels: int = 3) -> None:
        super().__init__()
        n = _check_depth(depth)
        self.depth = depth
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        blocks, planes = [], 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                blocks.append(BasicBlock(planes, width, stride if i == 0 else 1))
                planes = width
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(out), 1))


def resnet(depth: int, classes: int, in_channels: int = 3, *,
           generator: torch.Generator | None = None) -> nn.Module:
    """CIFAR ResNet-``depth`` (:class:`ResNet`); 10 classes: ResNet-20 269,722 parameters
    (≈ 0.27 M, the paper's Table 6), ResNet-32 464,154, ResNet-56 853,018."""
    _check_depth(depth)
    return _built(lambda: ResNet(depth, classes, in_channels), generator)


# ------------------------------------------------------------------------------ by name
def build_model(name: str, dataset_input_shape: Sequence[int], classes: int, *,
                generator: torch.Generator | None = None) -> nn.Module:
    """The model ``name`` for examples of shape ``dataset_input_shape`` (``Dataset.input_shape``).

    ``mlp`` takes any shape (flattened); ``cnn`` (:func:`small_cnn`) and ``resnet20/32/56``
    need images ``(C, H, W)``; ``cnn1d`` needs sequences ``(C, L)``."""
    shape = tuple(int(s) for s in dataset_input_shape)
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)} ({_FITS}), got {name!r}")
    if not isinstance(classes, int) or classes < 2:
        raise ValueError(f"classes must be an integer >= 2, got {classes!r}")
    if name == "mlp":
        return mlp(math.prod(shape), classes, generator=generator)
    if name == "cnn1d":
        if len(shape) != 2:
            raise ValueError(f"model cnn1d needs a 1-D input (C, L), got input shape {shape} "
                             f"({_FITS})")
        return cnn1d(classes, in_channels=shape[0], generator=generator)
    if len(shape) != 3:
        raise ValueError(f"model {name} needs an image input (C, H, W), got input shape {shape} "
                         f"({_FITS})")
    if name == "cnn":
        return small_cnn(shape[0], classes, generator=generator)
    return resnet(int(name.removeprefix("resnet")), classes, in_channels=shape[0],
                  generator=generator)
