"""Vanilla GAN of SINGA's examples/gan/model/gan_mlp.py: MLP generator and discriminator."""
from singa_jax import autograd, layer, model


class GAN_MLP(model.Model):
    """Generator: noise -> hidden (ReLU) -> image (sigmoid). Discriminator: image -> hidden
    (ReLU) -> one score; here a probability (sigmoid) trained with binary cross-entropy.

    Layers are named ``gen_net_*`` / ``dis_net_*`` so each half updates only its own parameters.
    """

    def __init__(self, noise_size=100, feature_size=784, hidden_size=128):
        super().__init__()
        self.noise_size = noise_size
        self.feature_size = feature_size
        self.hidden_size = hidden_size

        self.gen_net_fc_0 = layer.Linear(self.hidden_size)
        self.gen_net_relu_0 = layer.ReLU()
        self.gen_net_fc_1 = layer.Linear(self.feature_size)
        self.gen_net_sigmoid_1 = layer.Sigmoid()

        self.dis_net_fc_0 = layer.Linear(self.hidden_size)
        self.dis_net_relu_0 = layer.ReLU()
        self.dis_net_fc_1 = layer.Linear(1)
        self.build_head()

    def build_head(self):
        """The discriminator's output activation and the loss."""
        self.dis_net_sigmoid_1 = layer.Sigmoid()
        self.binary_cross_entropy = layer.BinaryCrossEntropy()

    def head(self, score):
        return self.dis_net_sigmoid_1(score)

    def loss(self, out, y):
        return self.binary_cross_entropy(out, y)

    def forward(self, x):
        """Generator and discriminator in cascade: noise -> score of the generated image."""
        return self.forward_dis(self.forward_gen(x))

    def forward_dis(self, x):
        y = self.dis_net_relu_0(self.dis_net_fc_0(x))
        return self.head(self.dis_net_fc_1(y))

    def forward_gen(self, x):
        y = self.gen_net_relu_0(self.gen_net_fc_0(x))
        return self.gen_net_sigmoid_1(self.gen_net_fc_1(y))

    def _update(self, loss, prefix):
        """Back-propagate ``loss`` and update only the parameters whose name has ``prefix``."""
        for p, g in autograd.backward(loss):
            if prefix in p.name:
                self.optimizer.apply(p.name, p, g)
        self.optimizer.step()

    def train_one_batch(self, x, y):
        """One generator step: make the discriminator score generated images as ``y``."""
        out = self.forward(x)
        loss = self.loss(out, y)
        self._update(loss, 'gen_net')
        return out, loss

    def train_one_batch_dis(self, x, y):
        """One discriminator step on images ``x`` with target scores ``y``."""
        out = self.forward_dis(x)
        loss = self.loss(out, y)
        self._update(loss, 'dis_net')
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer


def create_model(pretrained=False, **kwargs):
    """Build a GAN_MLP (``pretrained`` is accepted for SINGA compatibility; no weights ship)."""
    return GAN_MLP(**kwargs)


__all__ = ['GAN_MLP', 'create_model']
