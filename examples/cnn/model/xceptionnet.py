"""Xception of SINGA's examples/cnn/model/xceptionnet.py (https://arxiv.org/abs/1610.02357)."""
from singa_jax import layer

from .classifier import Classifier


class Block(layer.Layer):
    """ReLU + separable conv + batch norm repeated ``reps`` times, a strided max pool when
    ``strides`` > 1, and a (1x1 conv + batch norm) shortcut when the shape changes."""

    def __init__(self, in_filters, out_filters, reps, strides=1, padding=0,
                 start_with_relu=True, grow_first=True):
        super().__init__()
        if out_filters != in_filters or strides != 1:
            self.skip = layer.Conv2d(in_filters, out_filters, 1, stride=strides,
                                     padding=padding, bias=False)
            self.skipbn = layer.BatchNorm2d(out_filters)
        else:
            self.skip = None

        # (input, output) channels of each separable convolution
        widths = [(in_filters, out_filters)] if grow_first else []
        widths += [(out_filters if grow_first else in_filters,) * 2] * (reps - 1)
        if not grow_first:
            widths.append((in_filters, out_filters))
        self.layers = []
        for cin, cout in widths:
            self.layers += [layer.ReLU(),
                            layer.SeparableConv2d(cin, cout, 3, stride=1, padding=1, bias=False),
                            layer.BatchNorm2d(cout)]
        if not start_with_relu:
            self.layers = self.layers[1:]
        if strides != 1:
            self.layers.append(layer.MaxPool2d(3, strides, padding + 1))
        self.register_layers(*self.layers)
        self.add = layer.Add()

    def forward(self, x):
        y = x
        for stage in self.layers:
            y = stage(y)
        skip = x if self.skip is None else self.skipbn(self.skip(x))
        return self.add(y, skip)


def _final_map_size(input_size):
    """Side of the feature map entering the global pooling (10 for SINGA's 299 inputs)."""
    size = (input_size - 3) // 2 + 1           # conv1: 3x3, stride 2, no padding
    for _ in range(4):                          # blocks 1-3 and 12: max pool 3, stride 2, pad 1
        size = (size + 2 - 3) // 2 + 1
    return size


class Xception(Classifier):
    """``input_size`` (not in SINGA) lets quick runs use smaller images; the global max pooling
    covers the final feature map whatever its size."""

    def __init__(self, num_classes=10, num_channels=3, input_size=299):
        if input_size < 35:
            raise ValueError(f"Xception: input_size must be >= 35, got {input_size}")
        super().__init__(num_classes=num_classes, input_size=input_size)
        self.conv1 = layer.Conv2d(num_channels, 32, 3, 2, 0, bias=False)
        self.bn1 = layer.BatchNorm2d(32)
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(32, 64, 3, 1, 1, bias=False)
        self.bn2 = layer.BatchNorm2d(64)
        self.relu2 = layer.ReLU()

        entry = [Block(64, 128, 2, 2, start_with_relu=False),
                 Block(128, 256, 2, 2),
                 Block(256, 728, 2, 2)]
        middle = [Block(728, 728, 3, 1) for _ in range(8)]
        exit_block = [Block(728, 1024, 2, 2, grow_first=False)]
        self.blocks = entry + middle + exit_block
        self.register_layers(*self.blocks)

        self.conv3 = layer.SeparableConv2d(1024, 1536, 3, 1, 1)
        self.bn3 = layer.BatchNorm2d(1536)
        self.relu3 = layer.ReLU()
        self.conv4 = layer.SeparableConv2d(1536, 2048, 3, 1, 1)
        self.bn4 = layer.BatchNorm2d(2048)
        self.relu4 = layer.ReLU()
        self.globalpooling = layer.MaxPool2d(_final_map_size(input_size), 1)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(num_classes)

    def features(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        for block in self.blocks:
            x = block(x)
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.bn4(self.conv4(x))

    def logits(self, features):
        return self.fc(self.flatten(self.globalpooling(self.relu4(features))))

    def forward(self, x):
        return self.logits(self.features(x))


def create_model(pretrained=False, **kwargs):
    """Build an Xception (``pretrained`` is accepted for SINGA compatibility; no weights ship)."""
    return Xception(**kwargs)


__all__ = ['Xception', 'create_model']
