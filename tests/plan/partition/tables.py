"""Small layer tables built by hand (and one traced), in the catalog's conventions."""

from __future__ import annotations

from torch import nn

from dlcomm.workloads.catalog.base import Layer, ModelTable
from dlcomm.workloads.catalog.cnn import BasicBlock
from dlcomm.workloads.catalog.trace import trace_layers


def linear(name: str, c_in: int, c_out: int, bias: bool = False,
           shortcut_from: str | None = None) -> Layer:
    params = c_in * c_out + (c_out if bias else 0)
    return Layer(name, "linear", params, 2.0 * c_in * c_out, c_in, c_out, c_in, c_out,
                 shortcut_from=shortcut_from)


def table(name: str, layers: list[Layer], batch: int = 8) -> ModelTable:
    return ModelTable(name, "mlp", tuple(layers), "vector", 0.0, "tests", batch)


def mlp(dims: list[int], bias: bool = False, name: str = "mlp") -> ModelTable:
    """Linear layers dims[0] -> dims[1] -> ... (one per consecutive pair)."""
    return table(name, [linear(f"fc{i}", a, b, bias) for i, (a, b) in
                        enumerate(zip(dims, dims[1:]))])


def residual_mlp() -> ModelTable:
    """fc0 4->6, fc1 6->6, fc2 6->6 joined by fc0's output (a join on a partitioned layer)."""
    return table("residual-mlp", [linear("fc0", 4, 6), linear("fc1", 6, 6),
                                  linear("fc2", 6, 6, shortcut_from="fc0")])


def conv(name: str, c_in: int, c_out: int, k: int, side_in: int, side_out: int) -> Layer:
    return Layer(name, "conv", c_in * c_out * k * k, 2.0 * k * k * c_in * c_out * side_out ** 2,
                 c_in * side_in ** 2, c_out * side_out ** 2, c_in, c_out, k, side_in ** 2,
                 side_out ** 2)


def conv_chain(n: int, channels: int = 64, side: int = 28) -> ModelTable:
    """``n`` 3x3 convolutions, then a classifier: a long plain network."""
    layers = [conv("conv0", 3, channels, 3, side, side)]
    layers += [conv(f"conv{i}", channels, channels, 3, side, side) for i in range(1, n - 1)]
    layers.append(linear("fc", channels * side * side, 10))
    return ModelTable(f"chain{n}", "cnn", tuple(layers), "image", 0.0, "tests", 32)


class TinyResNet(nn.Module):
    """A stem, an identity block, a projection block, pooling and two FC layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(6)
        self.relu = nn.ReLU()
        self.block1 = BasicBlock(6, 6, 1)
        self.block2 = BasicBlock(6, 10, 2)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(40, 12)
        self.fc2 = nn.Linear(12, 5)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.block2(self.block1(x))
        return self.fc2(self.relu(self.fc(self.flatten(self.pool(x)))))


def tiny_resnet() -> ModelTable:
    return ModelTable("tiny-resnet", "cnn", trace_layers(TinyResNet, (3, 8, 8)), "3x8x8 image",
                      0.0, "tests", 8)
