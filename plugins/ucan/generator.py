"""UCAN's noise parameter generator (NPG) of the certification-wise noise: v(x) ∈ [-1, 1]^d.

For image inputs [C, H, W] the architecture of UCAN's ``noisegenerator.py``
(``NoiseGenerator``, as its training and certification scripts build it: ``nf = gc = 16``,
one ``Fusion_Block``): a 3×3 convolution C → nf, the fusion block (four densely connected
3×3 convolutions with LeakyReLU(0.2), then a fifth over all of their outputs, no
activation), a 3×3 convolution nf → C and tanh. Every convolution keeps H × W (padding 1),
so v has the input's shape. The code's unused parts (``trunk_conv_variance``, the channel
attention, ``conv_variance``) are left out: they take no part in the output. Written here
with the channel counts of the tensors it concatenates (equal to the code's at nf = gc).

UCAN has no generator for inputs that are not images; for those (e.g. the 2-d synthetic
datasets) this plugin uses a small MLP of its own, d → width → width → d with
LeakyReLU(0.2) and a tanh output, so that v lies in the same range.

Both are initialized by PyTorch's defaults (as UCAN's code), drawn from a seeded CPU
generator (:func:`initial_generator`) so that one seed gives one network.
"""

from __future__ import annotations

import math

import torch
from torch import nn

NF = 16
"""Feature channels of the image generator (UCAN's ``nf``)."""
GC = 16
"""Growth channels of its fusion block (UCAN's ``gc``)."""
MLP_WIDTH = 64
"""Hidden width of the generator for inputs that are not images (this plugin's choice)."""


class FusionBlock(nn.Module):
    """UCAN's ``Fusion_Block``: four densely connected 3×3 convolutions, then one over all."""

    def __init__(self, nf: int = NF, gc: int = GC) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(nf, gc, 3, 1, 1)
        self.conv2 = nn.Conv2d(nf + gc, gc, 3, 1, 1)
        self.conv3 = nn.Conv2d(nf + 2 * gc, nf, 3, 1, 1)
        self.conv4 = nn.Conv2d(2 * nf + 2 * gc, gc, 3, 1, 1)
        self.conv_mean = nn.Conv2d(2 * nf + 3 * gc, nf, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        return self.conv_mean(torch.cat((x, x1, x2, x3, x4), 1))


class ImageGenerator(nn.Module):
    """UCAN's ``NoiseGenerator`` for inputs [B, C, H, W]: tanh of conv(fusion(conv(x)))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.first = nn.Conv2d(channels, NF, 3, 1, 1)
        self.fusion = FusionBlock()
        self.last = nn.Conv2d(NF, channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.last(self.fusion(self.first(x))))


class VectorGenerator(nn.Module):
    """This plugin's generator for inputs that are not images: an MLP with a tanh output,
    answering the input's shape."""

    def __init__(self, dim: int, width: int = MLP_WIDTH) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, width), nn.LeakyReLU(0.2),
            nn.Linear(width, width), nn.LeakyReLU(0.2),
            nn.Linear(width, dim),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.layers(x.flatten(1))).view(x.shape)


def is_image(input_shape: tuple[int, ...]) -> bool:
    """Whether inputs of ``input_shape`` get UCAN's convolutional generator ([C, H, W])."""
    return len(input_shape) == 3


def build_generator(input_shape: tuple[int, ...]) -> nn.Module:
    """An untrained generator for inputs of ``input_shape`` (PyTorch's default initialization,
    from the global CPU generator: seed it with :func:`initial_generator`)."""
    if is_image(input_shape):
        return ImageGenerator(int(input_shape[0]))
    return VectorGenerator(math.prod(input_shape))


def initial_generator(input_shape: tuple[int, ...], seed: int) -> nn.Module:
    """:func:`build_generator` initialized from ``seed``, leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_generator(input_shape)
