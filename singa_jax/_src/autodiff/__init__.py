"""The autograd engine, which knows no op: the ``Operator`` door, the backward walk and its fused
form, the operator kit (``Function``) with its cached kernels and lean residuals, the per-kind
recording path (recipes) and autocast's cast kernels."""
