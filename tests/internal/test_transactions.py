"""Transaction internals: the value checks a compiled step runs on its inputs. (This tier imports
singa_jax._src.)"""
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import autograd, device, opt, tensor
from singa_jax._src.base import checks
from test_transactions import (  # noqa: F401 (shared helpers and fixtures)
    Net, assert_same, batch, make, snapshot)


def test_graph_mode_checks_labels_passed_to_the_loss_on_the_host_before_the_step():
    """Labels handed straight to the loss are a compiled step's input: their check is not
    compiled in (no flag, no gating of the new state, no sync after the step); it runs on the
    concrete argument before the program, on the first (tracing) call as on later ones."""
    m = make(True)
    x, y = batch()
    before = snapshot(m)
    bad = tensor.from_numpy(np.array([0, 1, 3, 1], np.int32))
    with pytest.raises(ValueError, match=r"SoftMaxCrossEntropy: class labels t must be integers "
                                         r"in \[0, 3\).*\[0, 3\]"):
        m(x, bad)  # the first call: traced, then checked before it runs
    assert_same(before, snapshot(m))
    m(x, y)
    prog = m._graph_runner._last[1]
    assert [position for position, _ in prog.input_checks] == [1]  # y, the second argument
    assert m(x, y)[1] is not None and m.graph_stats()["compiles"] == 1


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.uint32,
                                   np.float32])
@pytest.mark.parametrize("values", [[0, 1, 2], [2, 2, 0], [0, 3, 1], [-1, 0, 1], [0, 255, 1],
                                    [0, -128, 1], []])
def test_the_host_label_check_of_a_compiled_step_decides_as_the_eager_check(dtype, values):
    """checks._host_index_check (one view and one max per run) passes and fails exactly where
    the eager check does, with its message."""
    size = 3
    labels = np.array(values).astype(dtype)  # the wrapped values of the small integer types
    host = checks._host_index_check("Loss", "class labels t", size, "ctx", True)

    def outcome(run):
        try:
            run(jnp.asarray(labels))
        except ValueError as e:
            return str(e)
        return None

    eager = outcome(lambda a: checks.check_indices("Loss", "class labels t", a, size, "ctx",
                                                   True))
    assert outcome(host) == eager
    expected_ok = labels.size == 0 or (labels.min() >= 0 and labels.max() < size)
    assert (eager is None) == bool(expected_ok)


def test_labels_that_passed_are_not_read_again_and_new_ones_are(monkeypatch):
    """A jax Array never changes: labels that passed for a table size are not read back again
    (a dataset's batches held on the device, fed every epoch), for that size only; an array of
    bad labels is still refused, and NumPy labels (which may change) are always read."""
    import gc
    reads = []
    real = checks._all_in_range
    monkeypatch.setattr(checks, "_all_in_range", lambda host, size: reads.append(size) or
                        real(host, size))
    good = jnp.asarray(np.array([0, 2, 1], np.int32))
    host = checks._host_index_check("Loss", "class labels t", 3, "ctx", True)
    for _ in range(3):
        host(good)
        checks.check_indices("Loss", "class labels t", good, 3, "ctx", True)
    assert reads == [3]
    with pytest.raises(ValueError, match=r"\[0, 2\)"):  # the same array, a smaller table
        checks.check_indices("Loss", "class labels t", good, 2, "ctx", True)
    bad = jnp.asarray(np.array([0, 3, 1], np.int32))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"\[0, 3\)"):
            host(bad)
    on_host = np.array([0, 2, 1], np.int32)
    host(on_host)
    on_host[1] = 7
    with pytest.raises(ValueError, match="7"):
        host(on_host)
    key = id(good)
    del good
    gc.collect()
    assert key not in checks._IN_RANGE  # the entry went with its array


class ComputedLabels(Net):
    """The labels reach the loss through an op of the step: checked inside the program."""

    def train_one_batch(self, x, y):
        out = self.forward(x)
        shifted = autograd.add(y, tensor.from_numpy(np.zeros(y.shape, np.int32)))
        loss = self.loss(out, shifted)
        self.optimizer(loss)
        return out, loss


def test_graph_mode_checks_labels_computed_in_the_step_at_its_end_with_nothing_applied():
    device.get_default_device().SetRandSeed(5)
    m = ComputedLabels()
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    x, y = batch()
    m.compile([x], is_train=True, use_graph=True)
    m(x, y)
    m(x, y)  # run from the cache
    assert m._graph_runner._last[1].input_checks == ()
    before = snapshot(m)
    with pytest.raises(ValueError, match=r"class labels t must be integers in \[0, 3\)"):
        m(x, tensor.from_numpy(np.array([0, -2, 1, 1], np.int32)))
    assert_same(before, snapshot(m))
    m(x, y)
    assert not np.array_equal(before["m/l2.W"], tensor.to_numpy(m.l2.W))
