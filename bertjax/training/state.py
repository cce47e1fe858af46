"""The train state: float32 master weights, optimizer state, step and a base RNG key."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """Everything a training run updates.

  Attributes:
    step: int32 scalar, the number of optimizer updates applied so far.
    params: the parameter pytree, float32 whatever the compute dtype.
    opt_state: the optax state.
    rng: a typed PRNG key; step k's dropout key is `fold_in(rng, k)`, so a
      resumed run draws the same dropout masks as an uninterrupted one.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def create_train_state(
  params: Any, tx: optax.GradientTransformation, rng: int | jax.Array = 0
) -> TrainState:
  """A fresh train state at step 0.

  Args:
    params: initial parameters (cast to float32 master weights).
    tx: the optimizer.
    rng: a seed or a typed PRNG key for dropout.
  """
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  key = jax.random.key(rng) if isinstance(rng, int) else rng
  return TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=key
  )


def state_to_tree(state: TrainState) -> dict[str, Any]:
  """A plain pytree for checkpointing (the key as `jax.random.key_data`).

  Works on abstract states (`jax.eval_shape` outputs) too.
  """
  if isinstance(state.rng, jax.ShapeDtypeStruct):
    rng = jax.eval_shape(jax.random.key_data, state.rng)
  else:
    rng = jax.random.key_data(state.rng)
  return {"step": state.step, "params": state.params, "opt_state": state.opt_state, "rng": rng}


def state_from_tree(tree: dict[str, Any]) -> TrainState:
  """Inverse of `state_to_tree`."""
  return TrainState(
    step=jnp.asarray(tree["step"], jnp.int32),
    params=tree["params"],
    opt_state=tree["opt_state"],
    rng=jax.random.wrap_key_data(tree["rng"]),
  )
