"""A GPT-2-style decoder written with SINGA's layer and autograd API, for the memory benchmark.

SINGA's own Transformer (``examples/trans/model.py``) computes its layer normalisation and its
masks with NumPy on the host (``tensor.to_numpy`` inside ``forward``), so it cannot be traced
into one graph-mode step; this one computes everything with autograd operators, in the same
shape: token and position embeddings, ``layers`` blocks of [LayerNorm, causal multi-head
self-attention, residual, LayerNorm, ReLU feed-forward network of 4x the width, residual],
a final LayerNorm and a projection to the vocabulary, softmax cross-entropy on the next token.
``size="gpt2-small"`` is GPT-2 small's width, heads and depth (768, 12, 12).
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from singa_jax import autograd, layer, model, tensor

SIZES: Dict[str, Dict[str, int]] = {
    "gpt2-small": dict(d_model=768, heads=12, layers=12),
    "tiny": dict(d_model=32, heads=2, layers=2),
}


class LayerNorm(layer.Layer):
    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def initialize(self, x):
        width = x.shape[-1]
        self.gamma = tensor.Tensor((width,), x.device)
        self.gamma.set_value(1.0)
        self.beta = tensor.Tensor((width,), x.device)
        self.beta.set_value(0.0)

    def forward(self, x):
        mean = autograd.reduce_mean(x, axes=[-1], keepdims=1)
        centred = autograd.sub(x, mean)
        var = autograd.reduce_mean(autograd.mul(centred, centred), axes=[-1], keepdims=1)
        scale = autograd.pow(autograd.add(var, tensor.from_numpy(np.array(self.eps, np.float32))),
                             tensor.from_numpy(np.array(-0.5, np.float32)))
        return autograd.add(autograd.mul(autograd.mul(centred, scale), self.gamma), self.beta)


class Attention(layer.Layer):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads, self.d_k = heads, d_model // heads
        self.qkv = layer.Linear(3 * d_model)
        self.proj = layer.Linear(d_model)

    def forward(self, x, mask):
        b, t, d = x.shape
        qkv = autograd.reshape(self.qkv(autograd.reshape(x, [b * t, d])), [b, t, 3, self.heads,
                                                                         self.d_k])
        qkv = autograd.transpose(qkv, [2, 0, 3, 1, 4])  # (3, b, heads, t, d_k)
        q, k, v = (autograd.squeeze(s, [0]) for s in autograd.split(qkv, 0, [1, 1, 1]))
        scores = autograd.matmul(q, autograd.transpose(k, [0, 1, 3, 2]))
        scores = autograd.add(autograd.mul(scores, tensor.from_numpy(
            np.array(1.0 / np.sqrt(self.d_k), np.float32))), mask)
        context = autograd.matmul(autograd.softmax(scores, axis=-1), v)
        context = autograd.reshape(autograd.transpose(context, [0, 2, 1, 3]), [b * t, d])
        return autograd.reshape(self.proj(context), [b, t, d])


class Block(layer.Layer):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.ln1, self.attn = LayerNorm(), Attention(d_model, heads)
        self.ln2, self.fc1 = LayerNorm(), layer.Linear(4 * d_model)
        self.relu, self.fc2 = layer.ReLU(), layer.Linear(d_model)

    def forward(self, x, mask):
        x = autograd.add(x, self.attn(self.ln1(x), mask))
        b, t, d = x.shape
        h = self.fc2(self.relu(self.fc1(autograd.reshape(self.ln2(x), [b * t, d]))))
        return autograd.add(x, autograd.reshape(h, [b, t, d]))


class GPT(model.Model):
    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int):
        super().__init__()
        self.seq = seq
        self.tok = layer.Embedding(vocab, d_model)
        self.pos = layer.Embedding(seq, d_model)
        self.blocks = [Block(d_model, heads) for _ in range(layers)]
        self.register_layers(*self.blocks)
        self.ln = LayerNorm()
        self.head = layer.Linear(vocab)
        self.loss = layer.SoftMaxCrossEntropy()
        causal = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)
        self.mask = tensor.from_numpy(causal)  # a constant: added to the attention scores
        self.positions = tensor.from_numpy(np.arange(seq, dtype=np.int32))

    def forward(self, ids):
        b, t = ids.shape
        x = autograd.add(self.tok(ids), self.pos(self.positions))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(autograd.reshape(self.ln(x), [b * t, x.shape[-1]]))

    def train_one_batch(self, ids, targets):
        out = self.forward(ids)
        loss = self.loss(out, autograd.reshape(targets, [-1]))
        self.optimizer(loss)
        return out, loss


def gpt(size: str = "gpt2-small", vocab: int = 8192, seq: int = 128) -> GPT:
    return GPT(vocab, seq, **SIZES[size])
