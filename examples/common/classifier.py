"""A Model base for the classifiers of the examples: softmax cross-entropy, SINGA's update."""
from singa_jax import layer, model

from .training import update


class Classifier(model.Model):
    """Subclasses define ``forward``; training minimises softmax cross-entropy.

    Attributes SINGA's train_cnn.py reads: ``num_classes``, ``input_size`` (the image side the
    model expects; the loader resizes to it) and ``dimension`` (4: NCHW images, 2: flat rows).
    """

    def __init__(self, num_classes: int = 10, input_size: int = 28, dimension: int = 4):
        super().__init__()
        self.num_classes = num_classes
        self.input_size = input_size
        self.dimension = dimension
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def train_one_batch(self, x, y, dist_option='plain', spars=None):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        update(self.optimizer, loss, dist_option, spars)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer
