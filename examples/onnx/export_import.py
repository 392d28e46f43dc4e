"""Export a singa_jax model to ONNX, check it with onnxruntime, import it back and fine-tune it.

    python examples/onnx/export_import.py [--steps N] [--out model.onnx] [--quick]

1. trains a small CNN (conv + batch-norm + pooling + linear) on scikit-learn's 8x8 digits;
2. exports it with ``sonnx.to_onnx`` (dynamic batch) and compares onnxruntime's output with
   singa_jax's;
3. loads the file into a ``sonnx.SONNXModel`` with a new 10-way head and fine-tunes it in graph
   mode on the digits' last 5 classes only (a stand-in for a new task). Needs the ``onnx``
   extra: ``pip install -e '.[onnx,examples]'``.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.digits import load_digits_images  # noqa: E402
from singa_jax import autograd, layer, model, opt, sonnx, tensor  # noqa: E402


class SmallCNN(model.Model):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = layer.Conv2d(8, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.pool = layer.MaxPool2d(2, 2)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(num_classes)

    def forward(self, x):
        return self.fc(self.flat(self.pool(autograd.relu(self.bn(self.conv(x))))))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer(loss)
        return loss


class FineTuned(sonnx.SONNXModel):
    """The imported network's logits feed a new linear head."""

    def __init__(self, onnx_model, num_classes=10):
        super().__init__(onnx_model)
        self.head = layer.Linear(num_classes)

    def forward(self, x):
        return self.head(autograd.relu(super().forward(x)[0]))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer(loss)
        return loss


def batches(x, y, batch, steps, seed):
    rng = np.random.RandomState(seed)
    for _ in range(steps):
        idx = rng.choice(len(x), batch, replace=False)
        yield (tensor.Tensor(data=x[idx]),
               tensor.Tensor(data=np.eye(10, dtype=np.float32)[y[idx]]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default=None, help="where to write the ONNX file")
    ap.add_argument("--quick", action="store_true", help="a few steps (for the test suite)")
    args = ap.parse_args(argv)
    steps = 30 if args.quick else args.steps
    train_x, train_y, test_x, test_y = load_digits_images(size=8)

    # 1. train in singa_jax
    net = SmallCNN()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    sample = tensor.Tensor(data=train_x[:args.batch])
    net.compile([sample], is_train=True, use_graph=True)
    for x, y in batches(train_x, train_y, args.batch, steps, 0):
        loss = net(x, y)
    print(f"trained {steps} steps, last loss {tensor.to_numpy(loss).item():.4f}")

    # 2. export (a forward in evaluation mode) and check with onnxruntime
    net.eval()
    x = tensor.Tensor(data=test_x[:16])
    onnx_model = sonnx.to_onnx([x], [net.forward(x)])
    out = args.out or os.path.join(tempfile.mkdtemp(), "small_cnn.onnx")
    sonnx.save(onnx_model, out)
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        ref = sess.run(None, {sess.get_inputs()[0].name: test_x[:40]})[0]  # another batch size
        net.graph(False)
        mine = tensor.to_numpy(net.forward(tensor.Tensor(data=test_x[:40])))
        print(f"exported to {out}; onnxruntime vs singa_jax max |diff| = "
              f"{np.abs(ref - mine).max():.2e}")
    except ImportError:
        print(f"exported to {out} (onnxruntime not installed: no check)")

    # 3. import and fine-tune on the digits 5..9
    keep = train_y >= 5
    tuned = FineTuned(sonnx.load(out))
    tuned.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    tuned.compile([tensor.Tensor(data=train_x[:args.batch])], is_train=True, use_graph=True)
    losses = []
    for x, y in batches(train_x[keep], train_y[keep], args.batch, steps, 1):
        losses.append(tensor.to_numpy(tuned(x, y)).item())
    print("fine-tuning losses:", " ".join(f"{v:.3f}" for v in losses))
    tuned.eval()
    pred = np.argmax(tensor.to_numpy(tuned(tensor.Tensor(data=test_x[test_y >= 5]))), axis=1)
    print(f"fine-tuned accuracy on digits 5..9: {np.mean(pred == test_y[test_y >= 5]):.3f}")
    return losses


if __name__ == "__main__":
    main()
