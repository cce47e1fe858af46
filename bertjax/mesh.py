"""Device meshes, and moving data on and off them, on one host or many: the one sharding
module, under both training and analysis.

A mesh has three axes:

* ``"data"``: batch rows are split over it (with ``"fsdp"``);
* ``"interventions"``: intervention sets (head masks of an ablation sweep) are split over it;
  analyses with no intervention set (extraction, scoring, statistics, head importance)
  split their rows over it too, so no device idles; training leaves it at 1;
* ``"fsdp"``: parameters (and in training the optimizer state) are sharded over it on their
  largest divisible axis (`state_shardings`), for models that do not fit one device; rows
  are split over it as well. 1 (replicated parameters) unless asked.

Training jits its step with these shardings (`state_shardings`, `batch_sharding`), and every
analysis with a ``mesh`` argument jits the single-device program with its inputs placed by
these helpers, so XLA partitions it: each device runs its rows and masks, and the only
communication is the reduction of per-row sums over the row axes, the gathering of the
(small) results, and, with ``fsdp > 1``, the parameter all-gathers (and in training the
gradient reduce-scatters). With several processes (`jax.distributed`, started by
`initialize_distributed`) every process iterates the same batches and places only its own
devices' rows; results come back to every process (`to_host`) and process 0 (`is_primary`)
alone writes files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA, INTERVENTIONS, FSDP = "data", "interventions", "fsdp"
AXES = (DATA, INTERVENTIONS, FSDP)
_COORDINATOR_VARS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def initialize_distributed() -> bool:
  """Starts `jax.distributed` from the environment (`bertjax pretrain` and `analyze` do).

  With ``JAX_COORDINATOR_ADDRESS`` (or ``COORDINATOR_ADDRESS``), ``JAX_NUM_PROCESSES``
  and ``JAX_PROCESS_ID`` set, calls `jax.distributed.initialize`; must run before any
  other JAX call. Returns whether it initialised (False without a coordinator address).
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


def make_mesh(
  data: int = -1, interventions: int = 1, fsdp: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
  """A mesh with axes ("data", "interventions", "fsdp") over every device (of every process).

  Args:
    data: rows of each batch are split this many ways; -1 means the devices left over
      by the other two axes.
    interventions: intervention sets (ablation masks) are split this many ways (training
      leaves it at 1).
    fsdp: parameters are sharded this many ways (1: replicated).
    devices: the devices (default: `jax.devices()`, all processes').

  Returns:
    The `jax.sharding.Mesh`, devices laid out data-major, so "fsdp" (the axis with the
    most traffic, parameter all-gathers) joins neighbouring devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  for name, size in (("interventions", interventions), ("fsdp", fsdp)):
    if not isinstance(size, int) or size < 1:
      raise ValueError(f"{name}={size!r} must be a positive int")
  if n % (interventions * fsdp):
    raise ValueError(f"interventions={interventions} x fsdp={fsdp} must divide the {n} devices")
  if data == -1:
    data = n // (interventions * fsdp)
  if not isinstance(data, int) or data < 1 or data * interventions * fsdp != n:
    raise ValueError(
      f"mesh shape (data={data}, interventions={interventions}, fsdp={fsdp}) "
      f"must multiply to the {n} devices"
    )
  return Mesh(np.asarray(devices, dtype=object).reshape(data, interventions, fsdp), AXES)


def parse_mesh(text: str, axes: Sequence[str] = AXES) -> tuple[int, ...]:
  """Parses a mesh shape "AxB[xC]" into one size per name of `axes`, the missing last ones 1.

  `bertjax analyze --mesh` reads "DATAxINTERVENTIONS[xFSDP]" (e.g. "4x2", "-1x1x2": the
  default `axes`); `bertjax pretrain --mesh-shape` reads "DATAxFSDP"
  (``axes=("data", "fsdp")``). -1 means "the devices left over" (see `make_mesh`).
  """
  axes = tuple(axes)
  try:
    sizes = [int(v) for v in text.lower().split("x")]
  except ValueError:
    sizes = []
  if not 2 <= len(sizes) <= len(axes):
    shapes = " or ".join(
      "'" + "x".join(a.upper() for a in axes[:k]) + "'" for k in range(2, len(axes) + 1)
    )
    raise ValueError(f"mesh {text!r} must be {shapes}, e.g. '4x2' or '-1x2'")
  return tuple(sizes) + (1,) * (len(axes) - len(sizes))


def axis_size(mesh: Mesh, name: str) -> int:
  """The size of axis `name` of `mesh`; 1 when the mesh has no such axis."""
  return int(dict(mesh.shape).get(name, 1))


def row_axes(mesh: Mesh, *, interventions: bool = False) -> tuple[str, ...]:
  """The mesh axes batch rows are split over: ("data", "fsdp"), plus "interventions" when
  the analysis has no intervention set to put there (``interventions=True``)."""
  names = (DATA, INTERVENTIONS, FSDP) if interventions else (DATA, FSDP)
  return tuple(a for a in names if a in mesh.axis_names)


def size_of(mesh: Mesh, axes: Sequence[str]) -> int:
  """How many ways `axes` of `mesh` split an array axis."""
  return int(np.prod([axis_size(mesh, a) for a in axes], dtype=np.int64))


def round_up(n: int, multiple: int) -> int:
  """`n` rounded up to a multiple of `multiple` (at least `multiple`)."""
  return max(multiple, -(-int(n) // multiple) * multiple)


def pad_rows(tree: Any, rows: int) -> Any:
  """Every array of `tree` (same leading size) extended to `rows` rows by repeating its last
  row: padding rows are real-looking inputs whose results the caller drops (or weighs 0),
  so they can never bring a NaN in."""

  def pad(x):
    x = np.asarray(x)
    if x.shape[0] > rows:
      raise ValueError(f"{x.shape[0]} rows do not fit in {rows}")
    if x.shape[0] == rows:
      return x
    return np.concatenate([x, np.repeat(x[-1:], rows - x.shape[0], axis=0)])

  return jax.tree.map(pad, tree)


def shard_params(params: Any, mesh: Mesh) -> Any:
  """Parameters on the mesh: replicated, or fsdp-sharded where the mesh has ``fsdp > 1``
  (each leaf on its largest axis the fsdp size divides, as in training). With several
  processes every process must pass the same parameters."""
  if axis_size(mesh, FSDP) > 1:
    shardings = state_shardings(params, mesh)
  else:
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  return jax.tree.map(put_global, params, shardings)


def shard_rows(tree: Any, mesh: Mesh, axes: Sequence[str] | None = None, *, axis: int = 0) -> Any:
  """Host arrays (the same global value on every process) split over `axes` on `axis`.

  Args:
    tree: arrays whose `axis` is divisible by the size of `axes` (see `round_up`).
    mesh: the mesh.
    axes: mesh axes to split over (default: every axis, for analyses without interventions).
    axis: the array axis to split.

  Returns:
    The same tree of global `jax.Array`s; each process transfers only its devices' rows.
  """
  axes = tuple(mesh.axis_names if axes is None else axes)
  size = size_of(mesh, axes)

  def put(x):
    x = np.asarray(x)
    if x.shape[axis] % size:
      raise ValueError(
        f"axis {axis} of shape {x.shape} must be divisible by the {size} "
        f"devices of mesh axes {axes} (pad it first)"
      )
    spec = [None] * x.ndim
    spec[axis] = axes
    return put_global(x, NamedSharding(mesh, P(*spec)))

  return jax.tree.map(put, tree)


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of a value every device holds whole."""
  return NamedSharding(mesh, P())


def to_host(tree: Any) -> Any:
  """Device arrays as NumPy on this process, gathered from every process where needed."""

  def get(x):
    if not isinstance(x, jax.Array):
      return np.asarray(x)
    if x.is_fully_addressable:
      return np.asarray(x)
    if x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(get, tree)


def is_primary() -> bool:
  """Whether this is process 0, the one that writes results."""
  return jax.process_index() == 0


def broadcast_from_primary(value: Any) -> Any:
  """`value` as process 0 has it, on every process (unchanged with one process): for the
  decisions that must agree everywhere, such as which results already exist."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils

  return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(value))


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
  fsdp = axis_size(mesh, FSDP)

  def one(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      return NamedSharding(mesh, P())
    return NamedSharding(mesh, _leaf_spec(tuple(np.shape(x)), fsdp))

  return jax.tree.map(one, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Splits the leading (batch) axis of a training batch over ("data", "fsdp")."""
  return NamedSharding(mesh, P(row_axes(mesh)))


def put_global(x: Any, sharding: NamedSharding) -> jax.Array:
  """`x` (the same value on every process) as a global array with `sharding`: each process
  fills only its addressable shards; a global array already is one and is resharded."""
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global: reshard
    return jax.jit(lambda a: a, out_shardings=sharding)(x)
  if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
    data = put_global(np.asarray(jax.random.key_data(x)), NamedSharding(sharding.mesh, P()))
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  x = np.asarray(x)
  # Each process fills only its addressable shards (device_put cannot reach the others).
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def shard_state(state: Any, mesh: Mesh) -> tuple[Any, Any]:
  """Places a train state on the mesh (`state_shardings`); returns `(state, shardings)`.

  With several processes every process must pass the same state (same seed).
  """
  shardings = state_shardings(state, mesh)
  return jax.tree.map(put_global, state, shardings), shardings


def shard_batch(
  batch: dict[str, np.ndarray], mesh: Mesh, *, per_process: bool = False
) -> dict[str, jax.Array]:
  """Places a host batch on the mesh, split on the batch axis.

  Args:
    batch: host arrays with the batch on the leading axis.
    mesh: the mesh (`make_mesh`).
    per_process: with several processes, True means `batch` holds only this
      process's rows (its contiguous share of the global batch, in process order);
      False means every process holds the same global batch and takes its share.
  """
  sharding = batch_sharding(mesh)
  size = size_of(mesh, row_axes(mesh))
  count, index = jax.process_count(), jax.process_index()

  def put(x):
    x = np.asarray(x)
    if count == 1:
      if x.shape[0] % size:
        raise ValueError(
          f"batch size {x.shape[0]} must be divisible by the {size} devices of the mesh"
        )
      return jax.device_put(x, sharding)
    if not per_process:
      if x.shape[0] % count:
        raise ValueError(
          f"global batch size {x.shape[0]} must be divisible by the {count} processes"
        )
      rows = x.shape[0] // count
      x = x[index * rows : (index + 1) * rows]
    return jax.make_array_from_process_local_data(sharding, x)

  return {k: put(v) for k, v in batch.items()}
