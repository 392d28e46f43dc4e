"""LeNet-style CNN of SINGA's examples/cnn/model/cnn.py (28x28 inputs)."""
from singa_jax import layer

from .classifier import Classifier


class CNN(Classifier):

    def __init__(self, num_classes=10, num_channels=1):
        super().__init__(num_classes=num_classes, input_size=28)
        self.conv1 = layer.Conv2d(num_channels, 20, 5, padding=0, activation="RELU")
        self.conv2 = layer.Conv2d(20, 50, 5, padding=0, activation="RELU")
        self.linear1 = layer.Linear(500)
        self.linear2 = layer.Linear(num_classes)
        self.pooling1 = layer.MaxPool2d(2, 2, padding=0)
        self.pooling2 = layer.MaxPool2d(2, 2, padding=0)
        self.relu = layer.ReLU()
        self.flatten = layer.Flatten()

    def forward(self, x):
        features = self.pooling1(self.conv1(x))
        features = self.pooling2(self.conv2(features))
        hidden = self.relu(self.linear1(self.flatten(features)))
        return self.linear2(hidden)


def create_model(pretrained=False, **kwargs):
    """Build a CNN (``pretrained`` is accepted for SINGA compatibility; no weights ship)."""
    return CNN(**kwargs)


__all__ = ['CNN', 'create_model']
