"""Data and fully-sharded data parallelism over a ("data", "fsdp") device mesh.

Parameters and optimizer state are sharded along "fsdp" on their largest axis
that the fsdp size divides (replicated when none does); batches are split on
their leading axis over both "data" and "fsdp". The train step is the same
function either way: `jax.jit` with these input/output shardings lets XLA
insert the all-gathers and reduce-scatters.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp")
_COORDINATOR_VARS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def maybe_initialize_distributed() -> bool:
  """Calls `jax.distributed.initialize()` when multi-host variables are set.

  Looks for a coordinator address (``JAX_COORDINATOR_ADDRESS`` or
  ``COORDINATOR_ADDRESS``) with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``.
  Must run before any other JAX call. Returns whether it initialised.
  """
  address = next((os.environ[v] for v in _COORDINATOR_VARS if os.environ.get(v)), None)
  if address is None:
    return False
  try:
    num = int(os.environ["JAX_NUM_PROCESSES"])
    pid = int(os.environ["JAX_PROCESS_ID"])
  except KeyError as e:
    raise ValueError(f"coordinator address {address!r} is set but {e.args[0]} is not") from None
  jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
  return True


def make_mesh(data: int = -1, fsdp: int = 1, devices=None) -> Mesh:
  """A 2-D mesh with axes ("data", "fsdp").

  Args:
    data: the data-parallel size; -1 means all devices not used by fsdp.
    fsdp: the parameter-sharding size.
    devices: the devices (default: all of `jax.devices()`).
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"{fsdp=} must be a positive divisor of the {n} devices")
  if data == -1:
    data = n // fsdp
  if data < 1 or data * fsdp != n:
    raise ValueError(f"mesh shape ({data=}, {fsdp=}) must multiply to the {n} devices")
  return Mesh(np.asarray(devices).reshape(data, fsdp), AXES)


def parse_mesh_shape(text: str) -> tuple[int, int]:
  """Parses "DATAxFSDP" (e.g. "4x2", "-1x1")."""
  try:
    data, fsdp = (int(v) for v in text.lower().split("x"))
  except ValueError:
    raise ValueError(f"mesh shape {text!r} must be 'DATAxFSDP', e.g. '4x2' or '-1x1'") from None
  return data, fsdp


def _leaf_spec(shape: tuple[int, ...], fsdp: int) -> P:
  if fsdp == 1 or not shape:
    return P()
  # Largest axis divisible by the fsdp size; ties go to the earlier axis.
  candidates = [(d, -i) for i, d in enumerate(shape) if d % fsdp == 0]
  if not candidates:
    return P()
  axis = -max(candidates)[1]
  spec = [None] * len(shape)
  spec[axis] = "fsdp"
  return P(*spec)


def state_shardings(tree: Any, mesh: Mesh) -> Any:
  """A `NamedSharding` per leaf: fsdp-sharded on the largest divisible axis, else replicated.

  Works on arrays, `jax.ShapeDtypeStruct`s and typed PRNG keys (replicated).
  """
  fsdp = mesh.shape["fsdp"]

  def one(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      return NamedSharding(mesh, P())
    return NamedSharding(mesh, _leaf_spec(tuple(np.shape(x)), fsdp))

  return jax.tree.map(one, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Splits the leading (batch) axis over ("data", "fsdp")."""
  return NamedSharding(mesh, P(AXES))


def _put_global(x: Any, sharding: NamedSharding) -> jax.Array:
  """`x` (the same value on every process) as a global array with `sharding`."""
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global: reshard
    return jax.jit(lambda a: a, out_shardings=sharding)(x)
  if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
    data = _put_global(np.asarray(jax.random.key_data(x)), NamedSharding(sharding.mesh, P()))
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  x = np.asarray(x)
  # Each process fills only its addressable shards (device_put cannot reach the others).
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


put_global = _put_global  # public name: bertjax.sharding places analysis inputs with it


def shard_state(state: Any, mesh: Mesh) -> tuple[Any, Any]:
  """Places a train state on the mesh; returns `(state, shardings)`.

  With several processes every process must pass the same state (same seed).
  """
  shardings = state_shardings(state, mesh)
  return jax.tree.map(_put_global, state, shardings), shardings


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh, *,
                per_process: bool = False) -> dict[str, jax.Array]:
  """Places a host batch on the mesh, split on the batch axis.

  Args:
    batch: host arrays with the batch on the leading axis.
    mesh: the mesh (`make_mesh`).
    per_process: with several processes, True means `batch` holds only this
      process's rows (its contiguous share of the global batch, in process order);
      False means every process holds the same global batch and takes its share.
  """
  sharding = batch_sharding(mesh)
  size = mesh.shape["data"] * mesh.shape["fsdp"]
  count, index = jax.process_count(), jax.process_index()

  def put(x):
    x = np.asarray(x)
    if count == 1:
      if x.shape[0] % size:
        raise ValueError(f"batch size {x.shape[0]} must be divisible by the {size} devices "
                         "of the mesh")
      return jax.device_put(x, sharding)
    if not per_process:
      if x.shape[0] % count:
        raise ValueError(f"global batch size {x.shape[0]} must be divisible by the {count} "
                         "processes")
      rows = x.shape[0] // count
      x = x[index * rows:(index + 1) * rows]
    return jax.make_array_from_process_local_data(sharding, x)

  return {k: put(v) for k, v in batch.items()}
