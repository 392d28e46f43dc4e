"""SINGA's ``utils`` module: padding arithmetic for SAME modes, odd-padding helpers, handle
renewal, topological order of an autograd graph, and a console progress bar."""
from singa_jax._src.layers.utils import (
    OrderedDict as OrderedDict, update_progress as update_progress,
    handle_odd_pad_fwd as handle_odd_pad_fwd, handle_odd_pad_bwd as handle_odd_pad_bwd,
    same_pad_shape_check as same_pad_shape_check, re_new_handle as re_new_handle,
    get_padding_shape as get_padding_shape, get_output_shape as get_output_shape,
    force_unicode as force_unicode, post_order_recursive as post_order_recursive)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "OrderedDict", "update_progress", "handle_odd_pad_fwd", "handle_odd_pad_bwd",
    "same_pad_shape_check", "re_new_handle", "get_padding_shape", "get_output_shape",
    "force_unicode", "post_order_recursive"]

_publish(__name__, __all__)
