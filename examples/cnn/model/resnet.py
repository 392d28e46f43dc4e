"""ResNets of SINGA's examples/cnn/model/resnet.py (after torchvision's design; 224x224 inputs)."""
from singa_jax import layer

from .classifier import Classifier


def conv3x3(in_planes, out_planes, stride=1):
    """3x3 convolution with padding 1 and no bias (batch norm follows)."""
    return layer.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


class Downsample(layer.Layer):
    """1x1 strided convolution + batch norm: matches the shortcut to the block's output shape."""

    def __init__(self, in_planes, out_planes, stride):
        super().__init__()
        self.conv = layer.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)
        self.bn = layer.BatchNorm2d(out_planes)

    def forward(self, x):
        return self.bn(self.conv(x))


class ResidualBlock(layer.Layer):
    """A stack of conv + batch-norm (+ ReLU between them) whose output is added to the input."""

    def __init__(self, convs, widths, downsample=None):
        super().__init__()
        self.convs = convs
        self.bns = [layer.BatchNorm2d(width) for width in widths]
        self.relus = [layer.ReLU() for _ in convs]
        self.register_layers(*self.convs, *self.bns, *self.relus)
        self.downsample = downsample
        self.add = layer.Add()

    def forward(self, x):
        out = x
        last = len(self.convs) - 1
        for i, (conv, bn, relu) in enumerate(zip(self.convs, self.bns, self.relus)):
            out = bn(conv(out))
            if i < last:  # the final ReLU comes after the residual addition
                out = relu(out)
        residual = x if self.downsample is None else self.downsample(x)
        return self.relus[last](self.add(out, residual))


class BasicBlock(ResidualBlock):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__([conv3x3(inplanes, planes, stride), conv3x3(planes, planes)],
                         [planes, planes], downsample)


class Bottleneck(ResidualBlock):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__([
            layer.Conv2d(inplanes, planes, 1, bias=False),
            layer.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False),
            layer.Conv2d(planes, planes * self.expansion, 1, bias=False),
        ], [planes, planes, planes * self.expansion], downsample)


class ResNet(Classifier):
    """``input_size`` (not in SINGA) must be a multiple of 32; the final average pooling covers
    the whole input_size/32 feature map (7x7 for SINGA's 224)."""

    def __init__(self, block, layers, num_classes=10, num_channels=3, input_size=224):
        if input_size % 32:
            raise ValueError(f"ResNet: input_size must be a multiple of 32, got {input_size}")
        super().__init__(num_classes=num_classes, input_size=input_size)
        self.inplanes = 64
        self.conv1 = layer.Conv2d(num_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = layer.BatchNorm2d(64)
        self.relu = layer.ReLU()
        self.maxpool = layer.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.stages = []
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            self.stages += self._make_layer(block, planes, blocks, stride=1 if i == 0 else 2)
        self.register_layers(*self.stages)
        self.avgpool = layer.AvgPool2d(input_size // 32, stride=1)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = Downsample(self.inplanes, planes * block.expansion, stride)
        stage = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        stage += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return stage

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for block in self.stages:
            x = block(x)
        return self.fc(self.flatten(self.avgpool(x)))


# depth -> (block type, blocks per stage)
_CONFIGS = {
    18: (BasicBlock, [2, 2, 2, 2]),
    34: (BasicBlock, [3, 4, 6, 3]),
    50: (Bottleneck, [3, 4, 6, 3]),
    101: (Bottleneck, [3, 4, 23, 3]),
    152: (Bottleneck, [3, 8, 36, 3]),
}


def _factory(depth):
    block, layers = _CONFIGS[depth]

    def create(pretrained=False, **kwargs):
        return ResNet(block, layers, **kwargs)

    create.__name__ = f'resnet{depth}'
    create.__doc__ = (f"Constructs a ResNet-{depth} model (``pretrained`` is accepted for SINGA "
                      f"compatibility; no weights ship).")
    return create


resnet18, resnet34, resnet50, resnet101, resnet152 = (_factory(d) for d in sorted(_CONFIGS))

__all__ = ['ResNet', 'resnet18', 'resnet34', 'resnet50', 'resnet101', 'resnet152']
