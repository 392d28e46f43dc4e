"""Tests of autograd's losses against NumPy formulas (forward and analytic gradients)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax import autograd
from singa_jax.tensor import Tensor


pytestmark = pytest.mark.usefixtures("training_mode")


def leaf(a, grad=True):
    return Tensor(data=np.asarray(a), stores_grad=grad, requires_grad=grad)


def loss_and_grads(fn, inputs, target=None, dy=None):
    """(loss value, [gradient of each input]) with the target passed as a constant Tensor."""
    ts = [leaf(a) for a in inputs]
    args = ts + ([Tensor(data=np.asarray(target), stores_grad=True)] if target is not None
                 else [])
    loss = fn(*args)
    assert loss.shape == (1,)
    grads = autograd.gradients(loss, dy)
    if target is not None:
        assert id(args[-1]) not in grads  # the target is a constant
    return float(np.asarray(loss.array)[0]), [np.asarray(grads[id(t)].array) for t in ts]


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def logits():
    return np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)


LABELS = np.array([0, 3, 1, 1, 2], np.int32)


@pytest.mark.parametrize("target_kind", ["int", "one_hot", "soft"])
def test_softmax_cross_entropy(logits, target_kind):
    onehot = np.eye(4, dtype=np.float32)[LABELS]
    if target_kind == "int":
        t, dist = LABELS, onehot
    elif target_kind == "one_hot":
        t, dist = onehot, onehot
    else:  # SINGA normalises distribution targets by their row sums
        t = np.random.default_rng(1).uniform(0.1, 2.0, (5, 4)).astype(np.float32)
        dist = t / t.sum(axis=1, keepdims=True)
    value, (dx,) = loss_and_grads(autograd.softmax_cross_entropy, [logits], t, dy=2.0)
    p = softmax(logits.astype(np.float64))
    assert value == pytest.approx(-np.sum(dist * np.log(p)) / 5, rel=1e-5)
    np.testing.assert_allclose(dx, 2.0 * (p - dist) / 5, rtol=1e-4, atol=1e-6)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    x = np.array([[1000.0, 0.0, -1000.0], [0.0, 2000.0, 0.0]], np.float32)
    value, (dx,) = loss_and_grads(autograd.softmax_cross_entropy, [x], np.array([0, 0]))
    assert value == pytest.approx(1000.0, rel=1e-6)
    assert np.all(np.isfinite(dx))


@pytest.mark.parametrize("labels", [True, False])
def test_cross_entropy(labels):
    rng = np.random.default_rng(2)
    p = softmax(rng.standard_normal((5, 4))).astype(np.float32)
    onehot = np.eye(4, dtype=np.float32)[LABELS]
    value, (dx,) = loss_and_grads(autograd.cross_entropy, [p], LABELS if labels else onehot)
    assert value == pytest.approx(-np.sum(onehot * np.log(p)) / 5, rel=1e-5)
    np.testing.assert_allclose(dx, -onehot / p / 5, rtol=1e-5)


def test_binary_cross_entropy():
    rng = np.random.default_rng(3)
    x = rng.uniform(0.05, 0.95, (4, 3)).astype(np.float32)
    t = (rng.uniform(size=(4, 3)) > 0.5).astype(np.float32)
    value, (dx,) = loss_and_grads(autograd.binary_cross_entropy, [x], t, dy=0.5)
    x64 = x.astype(np.float64)
    expected = -(np.sum(t * np.log(x64 + 1e-4)) + np.sum((1 - t) * np.log(1.0001 - x64))) / 4
    assert value == pytest.approx(expected, rel=1e-5)
    grad = -(t / (x64 + 1e-4) - (1 - t) / (1.0001 - x64)) / 4
    np.testing.assert_allclose(dx, 0.5 * grad, rtol=1e-4)


def test_mse_loss_averages_over_all_elements():
    rng = np.random.default_rng(4)
    x, t = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4))
    t = t.astype(np.float32)
    value, (dx,) = loss_and_grads(autograd.mse_loss, [x], t, dy=3.0)
    assert value == pytest.approx(np.mean((x - t) ** 2), rel=1e-5)
    np.testing.assert_allclose(dx, 3.0 * 2 * (x - t) / x.size, rtol=1e-5)


@pytest.mark.parametrize("t_shape", [(2, 1), (4,), (1, 1)])
def test_mean_square_error_broadcasts_its_target(t_shape):
    """SINGA's MeanSquareError subtracts with its broadcasting ``__sub__`` (its fine-tuning
    test feeds a (2, 1) target to a (2, 4) output) and divides by x's element count."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    t = rng.standard_normal(t_shape).astype(np.float32)
    value, (dx,) = loss_and_grads(lambda a, b: autograd.MeanSquareError(b)(a)[0], [x], t,
                                  dy=2.0)
    assert value == pytest.approx(np.sum((x - t) ** 2) / x.size, rel=1e-5)
    want = jax.grad(lambda a: 2.0 * jnp.sum(jnp.square(a - t)) / a.size)(jnp.asarray(x))
    np.testing.assert_allclose(dx, np.asarray(want), rtol=1e-5)
    # mse_loss keeps SINGA's assertion that the shapes are equal
    with pytest.raises(ValueError, match=r"MeanSquareError \(mse_loss\).*\(2, 4\)"):
        autograd.mse_loss(leaf(x), Tensor(data=t))
    with pytest.raises(ValueError, match=r"MeanSquareError.*do not broadcast"):
        autograd.MeanSquareError(Tensor(data=np.zeros((3,), np.float32)))(leaf(x))


def test_ranking_loss():
    pos = np.array([0.9, 0.1, 0.5, 0.3], np.float32)
    neg = np.array([0.2, 0.4, 0.45, 0.9], np.float32)
    M = 0.2
    value, (dpos, dneg) = loss_and_grads(lambda p, n: autograd.ranking_loss(p, n, M),
                                         [pos, neg], dy=2.0)
    margin = M - pos + neg
    assert value == pytest.approx(np.sum(np.maximum(margin, 0)) / 4, rel=1e-5)
    active = (margin > 0).astype(np.float32)
    np.testing.assert_allclose(dpos, -2.0 * active / 4)
    np.testing.assert_allclose(dneg, 2.0 * active / 4)


@pytest.mark.parametrize("fn,x_shape,t,name", [
    (autograd.softmax_cross_entropy, (4, 3), np.zeros(5, np.int32), "SoftMaxCrossEntropy"),
    (autograd.cross_entropy, (4, 3), np.zeros((5, 3), np.float32), "CrossEntropy"),
    (autograd.binary_cross_entropy, (4, 3), np.zeros((5, 3), np.float32), "BinaryCrossEntropy"),
    (autograd.mse_loss, (4, 3), np.zeros((4, 2), np.float32), "MeanSquareError"),
])
def test_batch_mismatch_raises(fn, x_shape, t, name):
    x = leaf(np.full(x_shape, 0.5, np.float32))
    with pytest.raises(ValueError, match=rf"{name}.*{t.shape[0]}"):
        fn(x, Tensor(data=t))
    with pytest.raises(ValueError, match=r"RankingLoss.*\(4,\).*\(3,\)"):
        autograd.ranking_loss(leaf(np.zeros(4, np.float32)), leaf(np.zeros(3, np.float32)))


def test_gradient_descent_on_logits_lowers_the_loss(logits):
    x = leaf(logits)
    t = Tensor(data=LABELS)
    losses = []
    for _ in range(5):
        loss = autograd.softmax_cross_entropy(x, t)
        losses.append(float(np.asarray(loss.array)[0]))
        for param, grad in autograd.backward(loss):
            param.array = param.array - 2.0 * grad.array
    assert losses[-1] < 0.5 * losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:]))
