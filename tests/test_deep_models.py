"""Network builders (nrpt.deep.models): shapes, the ResNet parameter count, initialisation from
an explicit generator only, and agreement of vmap(functional_call) over stacked copies with a
per-copy loop in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from nrpt.deep.models import MODELS, ResNet, build_model, cnn1d, mlp, resnet, small_cnn

F64 = torch.float64

# (name, input shape): the datasets they are meant for; the deeper ResNets on 16x16 to stay fast
CASES = [("mlp", (64,)), ("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("cnn", (3, 32, 32)),
         ("cnn1d", (1, 40)), ("resnet20", (3, 32, 32)), ("resnet32", (3, 16, 16)),
         ("resnet56", (3, 16, 16))]


def _x(shape, batch, seed, dtype=torch.float32):
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("name, shape", CASES)
def test_output_shapes(name, shape):
    model = build_model(name, shape, 7).eval()
    assert model(_x(shape, 3, 0)).shape == (3, 7)


def _resnet_count(n: int, in_channels: int = 3, classes: int = 10) -> int:
    """He et al.'s CIFAR ResNet with option-A shortcuts: bias-free 3x3 convs, BN (2 per
    channel), a parameter-free shortcut, a 64 -> classes linear head."""
    def conv(a, b):
        return 9 * a * b

    total, planes = conv(in_channels, 16) + 2 * 16, 16
    for width in (16, 32, 64):
        for _ in range(n):
            total += conv(planes, width) + conv(width, width) + 2 * 2 * width
            planes = width
    return total + 64 * classes + classes


def test_resnet_parameter_counts():
    counts = {d: sum(p.numel() for p in resnet(d, 10).parameters()) for d in (20, 32, 56)}
    assert counts == {20: _resnet_count(3), 32: _resnet_count(5), 56: _resnet_count(9)}
    assert counts[20] == 269_722
    assert abs(counts[20] - 0.27e6) / 0.27e6 < 0.02          # the paper's "0.27M"
    assert sum(p.numel() for p in mlp(64, 10).parameters()) == 26_122
    assert sum(p.numel() for p in small_cnn(1, 10).parameters()) == 24_058
    assert sum(p.numel() for p in cnn1d(10).parameters()) == 8_106


def test_initialisation_uses_only_the_given_generator():
    state = torch.random.get_rng_state()
    a = build_model("cnn", (1, 8, 8), 10, generator=torch.Generator().manual_seed(1))
    b = build_model("cnn", (1, 8, 8), 10, generator=torch.Generator().manual_seed(1))
    c = build_model("cnn", (1, 8, 8), 10, generator=torch.Generator().manual_seed(2))
    d = build_model("cnn", (1, 8, 8), 10)
    e = build_model("cnn", (1, 8, 8), 10)
    assert torch.equal(torch.random.get_rng_state(), state)        # global RNG untouched
    pa, pb, pc = (torch.nn.utils.parameters_to_vector(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert all(torch.equal(p, q) for p, q in zip(d.parameters(), e.parameters(), strict=True))
    # He-normal weights: the first conv (fan_in 9) has sd sqrt(2/9) ~ .47
    w = a[0].weight
    assert w.std().item() == pytest.approx((2 / 9) ** 0.5, rel=0.25)
    assert torch.equal(a[1].running_var, torch.ones(16))


def _randomise_buffers(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Non-trivial BatchNorm statistics, so eval mode really uses each copy's own."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen, dtype=buf.dtype))
            elif name.endswith("running_var"):
                buf.copy_(0.5 + torch.rand(buf.shape, generator=gen, dtype=buf.dtype))


@pytest.mark.parametrize("name, shape", CASES)
def test_vmap_functional_call_equals_the_per_copy_loop(name, shape):
    copies = []
    for seed in (11, 12):
        m = build_model(name, shape, 5, generator=torch.Generator().manual_seed(seed))
        m = m.to(F64).eval()
        _randomise_buffers(m, torch.Generator().manual_seed(seed + 100))
        copies.append(m)
    params, buffers = stack_module_state(copies)
    base = copy.deepcopy(copies[0]).to("meta")

    def f(p, b, x):
        return functional_call(base, (p, b), (x,))

    x = _x(shape, 3, 1, dtype=F64)
    xs = torch.stack([x, 2 * x])                       # each copy its own batch
    batched = vmap(f)(params, buffers, xs)
    loop = torch.stack([m(xi) for m, xi in zip(copies, xs, strict=True)])
    assert batched.shape == (2, 3, 5)
    assert (batched - loop).abs().max().item() < 1e-10
    assert not torch.allclose(loop[0], loop[1])        # the copies really differ


def test_option_a_shortcut_is_parameter_free_and_zero_pads():
    net = ResNet(20, 10)
    block = net.layers[3]                               # first block of the 32-channel stage
    assert block.stride == 2 and block.extra == 16
    x = torch.arange(2 * 16 * 4 * 4, dtype=F64).reshape(2, 16, 4, 4)
    s = block.shortcut(x)
    assert s.shape == (2, 32, 2, 2)
    assert torch.equal(s[:, 8:24], x[:, :, ::2, ::2])
    assert not s[:, :8].any() and not s[:, 24:].any()


def test_build_model_errors_name_what_fits():
    with pytest.raises(ValueError, match="model must be one of mlp, cnn, cnn1d, resnet20"):
        build_model("vgg", (3, 32, 32), 10)
    with pytest.raises(ValueError, match=r"cnn1d needs a 1-D input \(C, L\)"):
        build_model("cnn1d", (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"resnet20 needs an image input \(C, H, W\)"):
        build_model("resnet20", (1, 40), 10)
    with pytest.raises(ValueError, match=r"cnn needs an image input"):
        build_model("cnn", (64,), 10)
    with pytest.raises(ValueError, match="depth must be 6n"):
        resnet(21, 10)
    assert set(MODELS) == {"mlp", "cnn", "cnn1d", "resnet20", "resnet32", "resnet56"}


def test_train_mode_batchnorm_under_vmap_is_per_copy():
    """In train() mode each copy normalises with its own batch statistics and updates its own
    running buffers, as the module docstring says."""
    copies = [build_model("cnn", (1, 8, 8), 5, generator=torch.Generator().manual_seed(s))
              .to(F64).train() for s in (1, 2)]
    params, buffers = stack_module_state(copies)
    base = copy.deepcopy(copies[0]).to("meta")
    xs = _x((2, 4, 1, 8, 8), 1, 3, dtype=F64)[0]
    batched = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)))(params, buffers, xs)
    loop = torch.stack([m(x) for m, x in zip(copies, xs, strict=True)])
    assert (batched - loop).abs().max().item() < 1e-10
    for i, m in enumerate(copies):
        assert torch.allclose(buffers["1.running_mean"][i], m[1].running_mean, atol=1e-12)
        assert int(buffers["1.num_batches_tracked"][i]) == 1


class _Tied(torch.nn.Module):
    """A decoder whose output layer shares the encoder's weight (a tied parameter)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.enc = torch.nn.Linear(5, 4, bias=False)
        self.dec = torch.nn.Linear(4, 5, bias=True)
        with torch.no_grad():
            self.enc.weight.copy_(torch.randn(4, 5, generator=g))
        self.dec.weight = self.enc.weight  # tied: dec reads it transposed in forward
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        h = torch.relu(self.bn(x @ self.enc.weight.t()))
        return h @ self.dec.weight + self.dec.bias


def test_functional_net_binds_rows_as_functional_call_does_tied_weights_included():
    """FunctionalNet binds a row's parameters and buffers into the module without walking the
    tree per call; it computes what ``torch.func.functional_call`` computes (ties honoured: the
    tied weight is one row entry, read by both layers), and leaves the module's own tensors in
    place afterwards.  Negative control: binding only the first occurrence of the tied weight
    (the second layer keeps the module's own) changes the output."""
    from nrpt.deep.replicas import FunctionalNet

    model = _Tied()
    net = FunctionalNet(model)
    assert net.names == ["enc.weight", "dec.bias", "bn.weight", "bn.bias"]
    theta = torch.randn(net.dim, generator=torch.Generator().manual_seed(1))
    x = _x((5,), 6, 2)
    params, bufs = net.params(theta), net._own_buffers(net.pack()[1])
    ours = net._call(params, bufs, x)
    ref_bufs = net._own_buffers(net.pack()[1])
    ref = functional_call(net.module, (params, ref_bufs), (x,))
    assert torch.equal(ours, ref)
    for name in net.buffer_names:  # BatchNorm updated the handed-over copies alike
        assert torch.equal(bufs[name], ref_bufs[name])
    own = dict(net.module.named_parameters())
    assert own["enc.weight"] is net.module.dec.weight  # the module's tie is restored
    assert not torch.equal(own["enc.weight"], params["enc.weight"])
    # negative control: the tied layer left on the module's own weight
    half = [s for s in net._slots if not (s[1] is net.module.dec and s[2] == "weight")]
    net._slots, full = half, net._slots
    wrong = net._call(params, net._own_buffers(net.pack()[1]), x)
    net._slots = full
    assert not torch.allclose(wrong, ref)
