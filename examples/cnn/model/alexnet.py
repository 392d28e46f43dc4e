"""AlexNet of SINGA's examples/cnn/model/alexnet.py (224x224 inputs by default)."""
from singa_jax import layer

from .classifier import Classifier


class AlexNet(Classifier):
    """``input_size`` (not in SINGA) lets quick runs use smaller images; it must be >= 99 so
    that the final 3x3 average pooling still has a 3x3 map to pool."""

    def __init__(self, num_classes=10, num_channels=1, input_size=224):
        if input_size < 99:
            raise ValueError(f"AlexNet: input_size must be >= 99, got {input_size}")
        super().__init__(num_classes=num_classes, input_size=input_size)
        self.features = [
            layer.Conv2d(num_channels, 64, 11, stride=4, padding=2), layer.ReLU(),
            layer.MaxPool2d(2, 2, padding=0),
            layer.Conv2d(64, 192, 5, padding=2), layer.ReLU(),
            layer.MaxPool2d(2, 2, padding=0),
            layer.Conv2d(192, 384, 3, padding=1), layer.ReLU(),
            layer.Conv2d(384, 256, 3, padding=1), layer.ReLU(),
            layer.Conv2d(256, 256, 3, padding=1), layer.ReLU(),
            layer.MaxPool2d(2, 2, padding=0),
            layer.AvgPool2d(3, 2, padding=0),
            layer.Flatten(),
        ]
        self.classifier = [
            layer.Dropout(), layer.Linear(4096), layer.ReLU(),
            layer.Dropout(), layer.Linear(4096), layer.ReLU(),
            layer.Linear(num_classes),
        ]
        self.register_layers(*self.features, *self.classifier)

    def forward(self, x):
        for stage in self.features + self.classifier:
            x = stage(x)
        return x


def create_model(pretrained=False, **kwargs):
    """Build an AlexNet (``pretrained`` is accepted for SINGA compatibility; no weights ship)."""
    return AlexNet(**kwargs)


__all__ = ['AlexNet', 'create_model']
