"""ImageNet CNNs (AlexNet, VGG, ResNet) as small torch.nn modules, traced on the meta device.

The definitions follow the architectures of their papers in the variants torchvision
ships (so parameter counts can be checked against torchvision's published numbers):

- AlexNet: the single-tower variant of Krizhevsky, "One weird trick for parallelizing
  convolutional neural networks" (arXiv:1404.5997), 64-192-384-256-256 filters.
- VGG: Simonyan & Zisserman, ICLR 2015, configurations D (16) and E (19), no batch norm.
- ResNet: He et al., CVPR 2016, Table 1; bottleneck blocks stride in the 3x3 convolution
  ("ResNet v1.5", as torchvision and MLPerf do); projection shortcuts (1x1 conv + BN) where
  the shape changes.

Tables (see :mod:`.trace`): every conv, linear, batch-norm and pool module is a layer;
ReLU, dropout and flatten are folded into the layer before them. In a residual block the
projection shortcut is computed first, so it precedes the main path in the table and every
``shortcut_from`` names an earlier layer; the join (``bn3`` of a bottleneck, ``bn2`` of a
basic block) carries ``shortcut_from`` = the projection's batch norm, or the layer that
produced the block's input.
"""

from __future__ import annotations

from torch import nn

from dlcomm.workloads.catalog.base import ModelTable, register_model
from dlcomm.workloads.catalog.trace import Add, trace_layers

__all__ = ["AlexNet", "VGG", "ResNet", "BasicBlock", "Bottleneck", "IMAGE"]

IMAGE = (3, 224, 224)
_SAMPLE = "3x224x224 image"
_TORCHVISION = "torchvision.models documentation, ImageNet-1K weights table"


class AlexNet(nn.Module):
    """AlexNet, single-tower variant (arXiv:1404.5997), 61.1M parameters."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(6)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
            nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(),
            nn.Linear(4096, classes))

    def forward(self, x):
        x = self.features(x)                         # (B, 256, 6, 6)
        return self.classifier(self.flatten(self.avgpool(x)))


# Output channels per 3x3 convolution, "M" a 2x2 max pool (Simonyan & Zisserman, Table 1).
VGG_CONFIGS = {
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
         512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """VGG-16/19 without batch norm."""

    def __init__(self, depth: int, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG_CONFIGS[depth]:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU()]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(),
            nn.Linear(4096, classes))

    def forward(self, x):
        x = self.features(x)                         # (B, 512, 7, 7)
        return self.classifier(self.flatten(self.avgpool(x)))


def _projection(c_in: int, c_out: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and c_in == c_out:
        return None
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(c_out))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and an identity (or projection) shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.downsample = _projection(c_in, width, stride)
        self.conv1 = nn.Conv2d(c_in, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.add = Add()

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(self.add(out, shortcut))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand x4, and a shortcut (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.downsample = _projection(c_in, c_out, stride)
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.add = Add()

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(self.add(out, shortcut))


# Blocks per stage (He et al. 2016, Table 1).
RESNET_CONFIGS: dict[int, tuple[type[nn.Module], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)), 34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)), 101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
}


class ResNet(nn.Module):
    """ResNet-18/34/50/101/152 for 224x224 ImageNet images."""

    def __init__(self, depth: int, classes: int = 1000) -> None:
        super().__init__()
        block, counts = RESNET_CONFIGS[depth]
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        c_in = 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), counts), start=1):
            blocks = []
            for i in range(count):
                stride = 2 if stage > 1 and i == 0 else 1
                blocks.append(block(c_in, width, stride))
                c_in = width * block.expansion
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))   # (B, 64, 56, 56)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (B, C, 7, 7)
        return self.fc(self.flatten(self.avgpool(x)))


def _table(name: str, build, published: float, source: str, batch: int) -> ModelTable:
    return ModelTable(name, "cnn", trace_layers(build, IMAGE), _SAMPLE, published, source,
                      batch)


@register_model("alexnet", "AlexNet (one-tower, 61.1M), 224x224 ImageNet")
def alexnet() -> ModelTable:
    return _table("alexnet", AlexNet, 61.1e6,
                  f"{_TORCHVISION}: alexnet 61,100,840 (arXiv:1404.5997 architecture)", 128)


@register_model("vgg16", "VGG-16 (138.4M), 224x224 ImageNet")
def vgg16() -> ModelTable:
    return _table("vgg16", lambda: VGG(16), 138.4e6,
                  f"{_TORCHVISION}: vgg16 138,357,544 (Simonyan & Zisserman 2015, Table 2: "
                  "138M)", 64)


@register_model("vgg19", "VGG-19 (143.7M), 224x224 ImageNet")
def vgg19() -> ModelTable:
    return _table("vgg19", lambda: VGG(19), 143.7e6,
                  f"{_TORCHVISION}: vgg19 143,667,240 (Simonyan & Zisserman 2015, Table 2: "
                  "144M)", 64)


def _resnet(depth: int, published: float, exact: str, batch: int) -> ModelTable:
    return _table(f"resnet{depth}", lambda: ResNet(depth), published,
                  f"{_TORCHVISION}: resnet{depth} {exact} (He et al. 2016)", batch)


@register_model("resnet18", "ResNet-18 (11.7M), 224x224 ImageNet")
def resnet18() -> ModelTable:
    return _resnet(18, 11.7e6, "11,689,512", 256)


@register_model("resnet34", "ResNet-34 (21.8M), 224x224 ImageNet")
def resnet34() -> ModelTable:
    return _resnet(34, 21.8e6, "21,797,672", 256)


@register_model("resnet50", "ResNet-50 (25.6M), 224x224 ImageNet")
def resnet50() -> ModelTable:
    return _resnet(50, 25.6e6, "25,557,032", 256)


@register_model("resnet101", "ResNet-101 (44.5M), 224x224 ImageNet")
def resnet101() -> ModelTable:
    return _resnet(101, 44.5e6, "44,549,160", 128)


@register_model("resnet152", "ResNet-152 (60.2M), 224x224 ImageNet")
def resnet152() -> ModelTable:
    return _resnet(152, 60.2e6, "60,192,808", 128)
