"""SINGA's ResNet (``examples/cnn/model/resnet.py``: torchvision's layers, the stride on the 3x3
convolution, no convolution bias) in PyTorch: the eager reference the benchmarks compare with.
Imported only by the benchmarks' PyTorch child processes (PyTorch never shares a process with
JAX there: in one process JAX's CPU threads starve torch's)."""
from __future__ import annotations

from typing import Any

# depth -> (block kind, blocks per stage)
CONFIGS = {18: ("basic", (2, 2, 2, 2)), 50: ("bottleneck", (3, 4, 6, 3)),
           101: ("bottleneck", (3, 4, 23, 3))}


def build(depth: int, num_classes: int = 10) -> Any:
    """ResNet-``depth`` as a ``torch.nn.Sequential`` (inputs N x 3 x H x W)."""
    import torch
    nn = torch.nn
    kind, counts = CONFIGS[depth]
    expansion = 4 if kind == "bottleneck" else 1

    class Block(nn.Module):
        def __init__(self, cin: int, planes: int, stride: int):
            super().__init__()
            cout = planes * expansion
            if kind == "bottleneck":
                shapes = [(cin, planes, 1, 1, 0), (planes, planes, 3, stride, 1),
                          (planes, cout, 1, 1, 0)]
            else:
                shapes = [(cin, planes, 3, stride, 1), (planes, cout, 3, 1, 1)]
            self.convs = nn.ModuleList([nn.Conv2d(i, o, k, s, p, bias=False)
                                        for i, o, k, s, p in shapes])
            self.bns = nn.ModuleList([nn.BatchNorm2d(o) for _, o, _, _, _ in shapes])
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            out, last = x, len(self.convs) - 1
            for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
                out = bn(conv(out))
                out = torch.relu(out) if i < last else out
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), counts)):
        for j in range(count):
            layers.append(Block(cin, planes, 2 if stage and not j else 1))
            cin = planes * expansion
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(cin, num_classes))
