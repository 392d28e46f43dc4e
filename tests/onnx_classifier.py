"""The fine-tuning model the ONNX tests share: an imported graph's first output as logits,
trained with softmax cross-entropy (the pattern of sonnx.SONNXModel's docstring)."""
from singa_jax import autograd, sonnx


class Classifier(sonnx.SONNXModel):
    def forward(self, x):
        return super().forward(x)[0]

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer(loss)
        return loss
