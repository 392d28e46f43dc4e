"""Checkpoint internals: the zip format's writer and reader. (This tier imports
singa_jax._src.)"""
import numpy as np
import pytest
from singa_jax._src.model import checkpoint
from test_checkpoint import (  # noqa: F401 (shared helpers and fixtures)
    ConvNet, IN, assert_values, batch, make, trained, values)


def test_mismatching_model_is_rejected_with_nothing_changed(tmp_path, trained):
    path = str(tmp_path / "ckpt")
    trained.save_states(path)
    other_shapes = make(seed=2, channels=4)  # conv has 4 filters: shapes differ
    before = values(other_shapes)
    expected = r"shape mismatches: .*'bn.running_mean': file \(3,\), model \(4,\).*'conv.W'"
    with pytest.raises(ValueError, match=expected):
        other_shapes.load_states(path)
    assert_values(other_shapes, before)

    model_states, aux = checkpoint.read_states(path)
    fewer = str(tmp_path / "fewer")
    checkpoint.save_states(fewer, {k: v for k, v in model_states.items() if k != "fc.b"})
    more = str(tmp_path / "more")
    checkpoint.save_states(more, dict(model_states, extra=np.zeros(3, np.float32)))
    target = make(seed=3)
    before = values(target)
    with pytest.raises(ValueError, match=r"missing from the file: \['fc.b'\]"):
        target.load_states(fewer)
    with pytest.raises(ValueError, match=r"does not have: \['extra'\]"):
        target.load_states(more)
    assert_values(target, before)
