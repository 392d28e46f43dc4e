"""SONNXModel: an imported ONNX graph as a singa_jax Model (trainable, eager or graph mode)."""
from __future__ import annotations

from typing import Any, List, Sequence

import onnx

from singa_jax._src.model import model
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.onnx.backend import SingaBackend

__all__ = ["SONNXModel"]


class SONNXModel(model.Model):
    """A :class:`~singa_jax.model.Model` running an ONNX graph (SINGA's class).

    ``forward(*x, aux_output=(), last_layers=None)`` returns the list of output Tensors. The
    graph's parameters and batch-norm statistics (of ``sg_ir``, a
    :class:`~singa_jax.sonnx.SingaRep`) are held by the sublayer ``weights`` under their
    ONNX names, so ``get_params``, ``save_states``/``load_states``, optimizers and graph mode
    (``compile(..., use_graph=True)``) work as for any Model. Subclass it and add layers and a
    ``train_one_batch`` to fine-tune::

        class Net(sonnx.SONNXModel):
            def forward(self, x):
                return super().forward(x)[0]
            def train_one_batch(self, x, y):
                loss = autograd.softmax_cross_entropy(self.forward(x), y)
                self.optimizer(loss)
                return loss
    """

    def __init__(self, onnx_model: onnx.ModelProto):
        super().__init__()
        self.sg_ir = SingaBackend.prepare(onnx_model)
        self.sg_ir.is_graph = True
        self.weights = self.sg_ir.weights

    def forward(self, *input: Tensor, aux_output: Sequence[str] = (), **kwargs: Any
                ) -> List[Tensor]:
        return self.sg_ir.run(list(input), aux_output=aux_output, **kwargs)
