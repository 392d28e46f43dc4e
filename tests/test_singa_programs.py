"""SINGA-style programs, written here, run unmodified under ``python -m singa_jax.run``.

Each script uses a SINGA API pattern that one of SINGA 5.1's own examples relies on and that
a reimplementation easily gets wrong (SINGA's examples: docs/compatibility.md):

* a ``Model`` whose ``get_states`` override reads states its ``initialize`` creates, trained in
  graph mode (``examples/rnn/char_rnn.py``: the states exist only once the first call has
  initialised the model);
* an LSTM whose states were sized by a training batch, fed a batch of one to sample from
  (char_rnn's ``sample``: SINGA's step ops broadcast the input against the state);
* ``python -m singa_jax.run`` itself without runpy's "found in sys.modules" warning.
"""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHAR_MODEL_SCRIPT = '''
import json
import sys

import numpy as np

from singa import device, layer, model, opt, tensor

VOCAB, HIDDEN, SEQ, BATCH = 5, 16, 6, 8


class NextChar(model.Model):
    """Predicts the next symbol of the cycle 0, 1, 2, 3, 4, 0, ... with an LSTM."""

    def __init__(self):
        super().__init__()
        self.lstm = layer.LSTM(VOCAB, HIDDEN)
        self.cat = layer.Cat()
        self.flat = layer.Reshape()
        self.fc = layer.Linear(VOCAB)
        self.loss_fn = layer.SoftMaxCrossEntropy()
        self.optimizer = opt.SGD(0.5, momentum=0.9)

    def initialize(self, xs):  # the recurrent states are sized by the first batch
        self.h = tensor.Tensor((xs[0].shape[0], HIDDEN), xs[0].device)
        self.c = tensor.Tensor((xs[0].shape[0], HIDDEN), xs[0].device)
        self.reset_states()

    def reset_states(self):
        self.h.set_value(0.0)
        self.c.set_value(0.0)

    def forward(self, xs):
        ys, h, c = self.lstm(xs, (self.h, self.c))
        self.h.copy_data(h)
        self.c.copy_data(c)
        return self.fc(self.flat(self.cat(ys), (-1, HIDDEN)))

    def train_one_batch(self, xs, y):
        out = self.forward(xs)
        loss = self.loss_fn(out, y)
        self.optimizer(loss)
        return out, loss

    def get_states(self):  # reads what initialize() creates, as char_rnn's does
        states = super().get_states()
        states["h"] = self.h
        states["c"] = self.c
        return states


def one_hot(symbols):
    x = np.zeros((len(symbols), VOCAB), np.float32)
    x[np.arange(len(symbols)), symbols] = 1
    return x


dev = device.create_cuda_gpu()  # the runner falls back to the default device
dev.SetRandSeed(0)
np.random.seed(0)
m = NextChar()
m.graph(True, False)
m.train()
losses = []
for step in range(40):
    starts = np.random.randint(0, VOCAB, BATCH)
    seqs = (starts[:, None] + np.arange(SEQ + 1)[None, :]) % VOCAB  # (batch, seq + 1)
    xs = [tensor.from_numpy(one_hot(seqs[:, t])) for t in range(SEQ)]
    y = tensor.from_numpy(seqs[:, 1:].T.reshape(-1, 1).astype(np.int32))
    out, loss = m(xs, y)
    m.reset_states()
    losses.append(float(tensor.to_numpy(loss)[0]))

m.eval()
predicted, rows_equal = [], []
for c in range(VOCAB):  # sample as char_rnn does: one symbol, states of the training batch
    m.reset_states()
    prob = tensor.to_numpy(tensor.softmax(m([tensor.from_numpy(one_hot([c]))])))
    rows_equal.append(bool(np.allclose(prob, prob[:1])))
    predicted.append(int(np.argmax(prob[0])))
m.reset_states()
batch_prob = tensor.to_numpy(tensor.softmax(m([tensor.from_numpy(one_hot([2] * BATCH))])))
m.reset_states()
single_prob = tensor.to_numpy(tensor.softmax(m([tensor.from_numpy(one_hot([2]))])))
print(json.dumps({"losses": losses, "predicted": predicted, "rows_equal": rows_equal,
                  "sample_shape": list(single_prob.shape),
                  "max_diff": float(np.abs(batch_prob - single_prob).max())}))
'''


def _run_script(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "program.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "singa_jax.run", str(script), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_char_model_with_state_override_trains_in_graph_mode_and_samples_at_batch_one(
        tmp_path):
    done = _run_script(tmp_path, CHAR_MODEL_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    losses = np.array(result["losses"])
    assert np.all(np.isfinite(losses))
    assert abs(losses[0] - np.log(5)) < 0.1  # untrained: uniform over the 5 symbols
    assert losses[-5:].mean() < 0.3 * losses[0]
    # the trained model continues the cycle from a zero state
    assert result["predicted"] == [1, 2, 3, 4, 0]
    # a batch-1 input against batch-8 states gives the batch-8 result, row for row
    assert result["sample_shape"] == [8, 5]
    assert all(result["rows_equal"])
    assert result["max_diff"] < 1e-6
    # the runner is not imported by ``import singa_jax`` (runpy would warn about it)
    assert "found in sys.modules" not in done.stderr
    assert "create_cuda_gpu" in done.stderr  # the one fallback warning
