"""Reliability: bad values, non-finite steps, set_states, dtypes, degenerate sizes,
killed checkpoint saves and a consumed autograd graph: each refused or survived as documented.

The transactional step, graph-mode error flags and thread safety are tested with graph.py /
model.py (the lead's part).
"""
import re
import warnings

import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, layer, model, opt, tensor
from singa_jax.opt import NonFiniteStepWarning
from singa_jax.tensor import Tensor


def arr(t: Tensor) -> np.ndarray:
    return np.asarray(t.array)


def log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


LOGITS = np.array([[1.0, 2.0, 0.5], [0.1, -1.0, 3.0], [2.0, 2.0, 2.0], [0.3, 0.2, 0.1]],
                  np.float32)


# ---------------------------------------------------------------------------------------------
# labels and indices
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("labels,bad", [([0, 1, 2, 3], "[0, 3]"), ([0, -1, 2, 1], "[-1, 2]")])
def test_class_labels_outside_the_classes_are_rejected(labels, bad):
    x = Tensor(data=LOGITS)
    t = Tensor(data=np.array(labels, np.int32))
    for fn, op in ((autograd.softmax_cross_entropy, "SoftMaxCrossEntropy"),
                   (autograd.cross_entropy, "CrossEntropy")):
        with pytest.raises(ValueError, match=rf"{op}: class labels t must be integers in \[0, 3\)"
                                             rf".*\(4, 3\).*shape \(4,\), dtype int32.*"
                                             rf"{re_escape(bad)}"):
            fn(x, t)
    with pytest.raises(ValueError, match="SoftMaxCrossEntropy: class labels"):
        layer.SoftMaxCrossEntropy()(x, t)


def re_escape(s: str) -> str:
    return re.escape(s)


def test_float_labels_must_be_exact_integers_and_one_hot_targets_still_work():
    x = Tensor(data=LOGITS)
    with pytest.raises(ValueError, match=r"all integers: False"):
        autograd.softmax_cross_entropy(x, Tensor(data=np.array([0, 1.5, 2, 1], np.float32)))
    labels = np.array([0, 2, 1, 1])
    want = -log_softmax(LOGITS.astype(np.float64))[np.arange(4), labels].mean()
    got = autograd.softmax_cross_entropy(x, Tensor(data=labels.astype(np.float32)))
    np.testing.assert_allclose(arr(got), [want], rtol=1e-6)
    one_hot = np.eye(3, dtype=np.float32)[labels] * 0.5  # rows normalised by the loss
    got = autograd.softmax_cross_entropy(x, Tensor(data=one_hot))
    np.testing.assert_allclose(arr(got), [want], rtol=1e-6)


@pytest.mark.parametrize("index", [5, -1])
def test_embedding_indices_outside_the_vocabulary_are_rejected(index):
    w = Tensor(data=np.arange(10, dtype=np.float32).reshape(5, 2))
    idx = Tensor(data=np.array([0, index], np.int32))
    with pytest.raises(ValueError, match=r"Embedding: indices x must be in \[0, 5\) \(vocabulary "
                                         r"of w with shape \(5, 2\)\)"):
        autograd.embedding(idx, w)
    emb = layer.Embedding(5, 2)
    with pytest.raises(ValueError, match="Embedding: indices x"):
        emb(idx)
    ok = autograd.embedding(Tensor(data=np.array([4, 0], np.int32)), w)
    np.testing.assert_array_equal(arr(ok), [[8, 9], [0, 1]])


# ---------------------------------------------------------------------------------------------
# optimizer: non-finite steps are skipped inside the kernel
# ---------------------------------------------------------------------------------------------
W_INIT = np.array([[0.5, -0.2], [0.1, 0.3], [-0.4, 0.2]], np.float32)
X_GOOD = np.array([[1.0, 2.0, -1.0], [0.5, -0.5, 1.0]], np.float32)


def mse_step(o, w, x):
    pred = autograd.matmul(Tensor(data=x, requires_grad=False), w)
    o(autograd.mse_loss(pred, Tensor(data=np.zeros((2, 2), np.float32))))


def make_weight():
    return Tensor(data=W_INIT.copy(), stores_grad=True, name="W")


@pytest.mark.parametrize("make", [lambda: opt.SGD(lr=0.1, momentum=0.9),
                                  lambda: opt.Adam(lr=0.05)], ids=["SGD", "Adam"])
def test_nonfinite_step_changes_nothing_and_is_counted_and_reported(make, training_mode):
    w, o = make_weight(), make()
    ref_w, ref = make_weight(), make()
    bad = X_GOOD.copy()
    bad[0, 0] = np.nan
    mse_step(o, w, X_GOOD)
    mse_step(ref, ref_w, X_GOOD)
    before = {k: arr(v).copy() for k, v in o.get_states().items()}
    w_before = arr(w).copy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mse_step(o, w, bad)
        np.testing.assert_array_equal(arr(w), w_before)
        for k, v in o.get_states().items():  # slots and step_counter
            np.testing.assert_array_equal(arr(v), before[k], err_msg=k)
        assert arr(o.skipped_steps).tolist() == [1]
        for _ in range(2):  # the skipped step never happened: bit-equal to the reference
            mse_step(o, w, X_GOOD)
            mse_step(ref, ref_w, X_GOOD)
    np.testing.assert_array_equal(arr(w), arr(ref_w))
    assert float(arr(o.step_counter)[0]) == 3.0
    messages = [str(c.message) for c in caught if issubclass(c.category, NonFiniteStepWarning)]
    assert len(messages) == 1 and "skipped the update at step 1 " in messages[0]


def test_a_large_weight_with_a_nan_gradient_is_not_updated(training_mode):
    """End to end with a weight large enough for the matrix-vector sum, eager and compiled."""
    x = np.random.default_rng(1).standard_normal((8, 300)).astype(np.float32)
    y = tensor.from_numpy(np.arange(8, dtype=np.int32))
    for graph in (False, True):
        net = TinyNet(width=256)  # a 300x256 weight
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        net.compile([tensor.from_numpy(x)], is_train=True, use_graph=graph)
        for _ in range(2):
            net(tensor.from_numpy(x), y)
        before = {k: arr(v).copy() for k, v in net.get_states().items()}
        bad = x.copy()
        bad[5, 123] = np.inf
        net(tensor.from_numpy(bad), y)
        for k, v in net.get_states().items():
            np.testing.assert_array_equal(arr(v), before[k], err_msg=(graph, k))
        assert arr(net.optimizer.skipped_steps).tolist() == [1], graph


class TinyNet(model.Model):
    def __init__(self, width: int = 3):
        super().__init__()
        self.fc = layer.Linear(width)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_graph_mode_skips_a_nonfinite_step_inside_the_program():
    net = TinyNet()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    y = tensor.from_numpy(np.array([0, 1, 2, 1], np.int32))
    net.compile([tensor.from_numpy(x)], is_train=True, use_graph=True)
    for _ in range(3):  # past the traces of the first calls
        net(tensor.from_numpy(x), y)
    params = {k: arr(v).copy() for k, v in net.get_states().items()}
    slots = {k: arr(v).copy() for k, v in net.optimizer.get_states().items()}
    bad = x.copy()
    bad[2, 3] = np.nan
    net(tensor.from_numpy(bad), y)
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(arr(v), params[k], err_msg=k)
    for k, v in net.optimizer.get_states().items():
        np.testing.assert_array_equal(arr(v), slots[k], err_msg=k)
    assert arr(net.optimizer.skipped_steps).tolist() == [1]  # (the bad step has finished)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net(tensor.from_numpy(x), y)  # the next call reports it, having read nothing blocking
        first = [c for c in caught if issubclass(c.category, NonFiniteStepWarning)]
        for _ in range(5):
            arr(net(tensor.from_numpy(x), y)[1])
    assert float(arr(net.optimizer.step_counter)[0]) == 9.0
    assert not np.array_equal(arr(net.fc.W), params["fc.W"])
    messages = [str(c.message) for c in caught if issubclass(c.category, NonFiniteStepWarning)]
    assert len(first) == 1 and first[0].filename == __file__, first  # the user's call line
    assert len(messages) == 1 and "skipped the update at step 3 " in messages[0], messages


# ---------------------------------------------------------------------------------------------
# optimizer: set_states validates everything first, a partial dict keeps the other slots
# ---------------------------------------------------------------------------------------------
def trained_adam():
    """An Adam with slots m/W, m/b, v/W, v/b after two steps (needs training mode)."""
    w, o = make_weight(), opt.Adam(lr=0.05)
    b = Tensor(data=np.zeros(2, np.float32), stores_grad=True, name="b")
    for _ in range(2):
        x = Tensor(data=X_GOOD, requires_grad=False)
        pred = autograd.add_bias(autograd.matmul(x, w), b, axis=0)
        o(autograd.mse_loss(pred, Tensor(data=np.zeros((2, 2), np.float32))))
    return o


def test_set_states_rejects_bad_shapes_and_dtypes_without_changing_anything(training_mode):
    o = trained_adam()
    before = {k: arr(v).copy() for k, v in o.get_states().items()}
    with pytest.raises(ValueError, match=r"Adam.set_states: m/W has shape \(2, 3\) but the slot "
                                         r"it replaces has shape \(3, 2\)"):
        o.set_states({"step_counter": 9.0, "m/b": np.ones(2), "m/W": np.ones((2, 3))})
    with pytest.raises(TypeError, match=r"v/b must be a floating-point array.*int32"):
        o.set_states({"m/b": np.ones(2, np.float32), "v/b": np.ones(2, np.int32)})
    with pytest.raises(ValueError, match="step_counter must be a finite count"):
        o.set_states({"m/b": np.ones(2, np.float32), "step_counter": np.nan})
    for k, v in o.get_states().items():
        np.testing.assert_array_equal(arr(v), before[k], err_msg=k)


def test_set_states_with_a_partial_dict_keeps_the_other_slots(training_mode):
    o = trained_adam()
    before = {k: arr(v).copy() for k, v in o.get_states().items()}
    o.set_states({"step_counter": 7.0})
    o.set_states({"m/W": np.full((3, 2), 0.25)})  # float64 in: cast to the slot's float32
    states = o.get_states()
    assert sorted(states) == sorted(before)
    assert arr(states["step_counter"]).tolist() == [7.0]
    np.testing.assert_array_equal(arr(states["m/W"]), np.full((3, 2), 0.25, np.float32))
    assert states["m/W"].dtype == np.float32
    for k in ("m/b", "v/W", "v/b"):
        np.testing.assert_array_equal(arr(states[k]), before[k], err_msg=k)


# ---------------------------------------------------------------------------------------------
# the optimizer called twice on one graph
# ---------------------------------------------------------------------------------------------
def test_second_optimizer_call_on_one_loss_reuses_the_graph_as_singa_does(training_mode):
    """SINGA's opt(loss) leaves the graph intact (its GAN example back-propagates one loss
    twice), so a second call applies the same gradient again; before, it failed deep inside
    the loss op's backward."""
    w, o = make_weight(), opt.SGD(lr=0.1)
    pred = autograd.matmul(Tensor(data=X_GOOD, requires_grad=False), w)
    loss = autograd.mse_loss(pred, Tensor(data=np.zeros((2, 2), np.float32)))
    o(loss)
    o(loss)
    x = X_GOOD.astype(np.float64)
    grad = x.T @ (2 * x @ W_INIT) / 4  # d/dW of sum((xW)^2) / 4, at the forward's W
    # products (TF32 on a GPU by default) against float64 ones; one step (0.1 * grad) is larger
    np.testing.assert_allclose(arr(w), W_INIT - 2 * 0.1 * grad, **matmul_tolerance(1e-6, 1e-6))
    assert float(arr(o.step_counter)[0]) == 2.0


# ---------------------------------------------------------------------------------------------
# parameters keep their dtype
# ---------------------------------------------------------------------------------------------
def test_integer_batch_is_rejected_and_leaves_float_weights_intact():
    lin = layer.Linear(3)
    lin(Tensor(data=np.ones((2, 4), np.float32)))
    w = arr(lin.W).copy()
    with pytest.raises(TypeError, match=r"Linear: input of dtype int32 does not match its "
                                        r"parameters \(float32\)"):
        lin(Tensor(data=np.ones((2, 4), np.int32)))
    assert lin.W.dtype == np.float32
    np.testing.assert_array_equal(arr(lin.W), w)
    fresh = layer.Linear(3)  # first call with an int batch: float32 weights, then the error
    with pytest.raises(TypeError, match="Linear: input of dtype int32"):
        fresh(Tensor(data=np.ones((2, 4), np.int32)))
    assert fresh.W.dtype == np.float32 and np.abs(arr(fresh.W)).sum() > 0
    conv = layer.Conv2d(2, 3, padding=1)
    with pytest.raises(TypeError, match="Conv2d: input of dtype int32"):
        conv(Tensor(data=np.ones((1, 1, 4, 4), np.int32)))


def test_half_precision_input_follows_singa_mixed_precision_rule():
    lin = layer.Linear(3)
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    lin(Tensor(data=x))  # built in float32
    w, b = arr(lin.W).copy(), arr(lin.b).copy()
    y = lin(Tensor(data=x.astype(np.float16)))
    assert lin.W.dtype == np.float16 and y.dtype == np.float16  # SINGA casts params to x's
    np.testing.assert_allclose(arr(y).astype(np.float32), x @ w + b, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------
# degenerate sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build,message", [
    (lambda: Tensor((-1, 3)), r"Tensor: shape must have sizes >= 0, got \(-1, 3\)"),
    (lambda: layer.Linear(0), "Linear: out_features must be a positive int, got 0"),
    (lambda: layer.Linear(4, -2), "Linear: out_features must be a positive int, got -2"),
    (lambda: layer.Conv2d(4, 0), "Conv2d: kernel_size must be >= 1, got 0"),
    (lambda: layer.Conv2d(4, 3, stride=0), "Conv2d: stride must be >= 1, got 0"),
    (lambda: layer.Conv2d(4, 3, padding=-1), "Conv2d: padding must be >= 0"),
    (lambda: layer.Conv2d(0, 3), "Conv2d: nb_kernels must be a positive int, got 0"),
    (lambda: layer.MaxPool2d((2, 0)), r"MaxPool2d: kernel_size must be >= 1, got \(2, 0\)"),
    (lambda: layer.Embedding(0, 3), "Embedding: input_dim must be a positive int"),
    (lambda: layer.BatchNorm2d(0), "BatchNorm2d: channels must be a positive int"),
])
def test_degenerate_sizes_are_rejected_at_construction(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_kernel_larger_than_the_padded_input_is_rejected_at_first_call():
    x = Tensor(data=np.ones((1, 1, 3, 3), np.float32))
    with pytest.raises(ValueError, match=r"Conv2d: kernel_size \(5, 5\) \(dilation \(1, 1\)\) spans 5 "
                                         r"along axis 2, "
                                         r"more than the padded input's 3 \(input shape "
                                         r"\(1, 1, 3, 3\)"):
        layer.Conv2d(2, 5)(x)
    with pytest.raises(ValueError, match=r"AvgPool2d: kernel_size \(4, 4\) spans 4 .* padded "
                                         r"input's 3"):
        layer.AvgPool2d(4)(x)
    y = layer.Conv2d(2, 5, padding=1)(x)  # 3 + 2 = 5: fits, one output pixel
    assert y.shape == (1, 2, 1, 1)


