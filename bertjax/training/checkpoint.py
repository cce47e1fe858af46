"""Training checkpoints with Orbax: async saves, retention, integrity checks, HF export.

A checkpoint at step s is a directory ``<dir>/<s>/`` with two Orbax items:
``state`` (params, optimizer state, step, the RNG key as `jax.random.key_data`)
and ``meta`` (JSON: the model config as `BertConfig` fields, the data-iterator
state, the progressive-stacking stage and anything the caller adds).

Orbax writes a step into a temporary directory and renames it when complete, so
a killed process leaves no half-visible step. Files can still be lost or
truncated afterwards (a full disk, a bad copy); so once a save has finished, a
manifest of every file's size and CRC-32 is written to
``<dir>/manifests/<s>.json``, and `restore_latest` verifies it (and catches any
Orbax error), falling back to the previous good step with a warning that names
the bad one.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.model.config import BertConfig, config_from_json, config_to_json
from bertjax.training.state import TrainState, state_from_tree, state_to_tree

log = logging.getLogger(__name__)


class CorruptCheckpointError(RuntimeError):
  """A checkpoint step whose files are missing, truncated or unreadable."""


def _crc(path: pathlib.Path) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
      crc = zlib.crc32(chunk, crc)
  return crc


def _file_table(step_dir: pathlib.Path) -> dict[str, list[int]]:
  return {
    str(p.relative_to(step_dir)): [p.stat().st_size, _crc(p)]
    for p in sorted(step_dir.rglob("*"))
    if p.is_file()
  }


class Checkpointer:
  """Saves and restores `TrainState`s with their metadata.

  Args:
    directory: where step directories go (created if missing).
    max_to_keep: how many recent checkpoints to keep (None keeps all).
    save_every: `save(..., force=False)` saves only at multiples of this (0: never).
    async_save: write in a background thread while training continues.
  """

  def __init__(
    self,
    directory: str | pathlib.Path,
    *,
    max_to_keep: int | None = 3,
    save_every: int = 0,
    async_save: bool = True,
  ):
    if max_to_keep is not None and max_to_keep < 1:
      raise ValueError(f"{max_to_keep=} must be >= 1 or None")
    if save_every < 0:
      raise ValueError(f"{save_every=} must be >= 0")
    self.directory = pathlib.Path(directory).absolute()
    self.save_every = save_every
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=("state", "meta")
    )
    self._manifest_dir = self.directory / "manifests"
    self._pending: list[int] = []

  # Saving --------------------------------------------------------------------

  def should_save(self, step: int) -> bool:
    """Whether `step` is a multiple of `save_every`."""
    return bool(self.save_every) and step > 0 and step % self.save_every == 0

  def save(
    self,
    step: int,
    state: TrainState,
    *,
    config: BertConfig,
    data_state: dict | None = None,
    stage: int = 0,
    extra: dict | None = None,
    force: bool = False,
  ) -> bool:
    """Starts saving `state` as step `step` (async); returns whether it saves.

    Args:
      step: the step number (normally `int(state.step)`).
      state: the train state.
      config: the model config of `state.params` (for this stacking stage).
      data_state: the data iterator's `state()` (JSON-serialisable).
      stage: the progressive-stacking stage index.
      extra: more JSON-serialisable metadata.
      force: save even if `step` is not a multiple of `save_every`.
    """
    if not (force or self.should_save(step)):
      return False
    if step in self.all_steps():
      return False
    meta = {
      "step": int(step),
      "config": config_to_json(config),
      "data_state": data_state,
      "stage": int(stage),
      "extra": extra or {},
    }
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state_to_tree(state)), meta=ocp.args.JsonSave(meta)
      ),
      force=True,
    )
    self._pending.append(step)
    self._write_manifests(wait=False)
    return True

  def _write_manifests(self, wait: bool) -> None:
    # Orbax runs one save at a time, so all but the newest pending save are done.
    if wait:
      self._manager.wait_until_finished()
      done, self._pending = self._pending, []
    else:
      done, self._pending = self._pending[:-1], self._pending[-1:]
    self._write(done)

  def _write(self, steps: list[int]) -> None:
    self._manifest_dir.mkdir(parents=True, exist_ok=True)
    kept = set(self.all_steps())
    for old in self._manifest_dir.glob("*.json"):  # drop manifests of deleted steps
      if old.stem.isdigit() and int(old.stem) not in kept:
        old.unlink(missing_ok=True)
    for s in steps:
      step_dir = self.directory / str(s)
      if step_dir.is_dir():
        # Every process of a multi-host run writes the same table: a temporary name of its
        # own, so two processes never rename one file (the rename itself is atomic).
        tmp = self._manifest_dir / f"{s}.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(_file_table(step_dir)))
        tmp.replace(self._manifest_dir / f"{s}.json")

  def wait(self) -> None:
    """Blocks until pending saves are written (and their manifests)."""
    self._write_manifests(wait=True)

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self.wait()
    self._manager.close()

  # Restoring -----------------------------------------------------------------

  def all_steps(self) -> list[int]:
    """Steps with a finalised checkpoint, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The last finalised step, None before the first save."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def verify(self, step: int) -> None:
    """Raises `CorruptCheckpointError` if `step`'s files differ from its manifest."""
    step_dir = self.directory / str(step)
    if not step_dir.is_dir():
      raise CorruptCheckpointError(f"checkpoint step {step}: directory {step_dir} is missing")
    manifest = self._manifest_dir / f"{step}.json"
    if not manifest.is_file():
      return  # Saved by a process killed before the manifest; Orbax's own checks remain.
    expected = json.loads(manifest.read_text())
    actual = _file_table(step_dir)
    missing = sorted(set(expected) - set(actual))
    changed = sorted(f for f in expected if f in actual and actual[f] != expected[f])
    if missing or changed:
      raise CorruptCheckpointError(
        f"checkpoint step {step} in {self.directory} is corrupt: missing files {missing}, "
        f"changed or truncated files {changed}"
      )

  def restore_meta(self, step: int) -> dict[str, Any]:
    """The JSON metadata of a step."""
    meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(meta["meta"])

  def restore(
    self, step: int, template: Callable[[dict], TrainState] | TrainState
  ) -> tuple[TrainState, dict[str, Any]]:
    """Restores one step.

    Args:
      step: the step to restore.
      template: a `TrainState` with the right structure (arrays or
        `jax.ShapeDtypeStruct`s, whose shardings are used), or a function from
        the step's metadata to one (for stacking stages of different depths).

    Returns:
      `(state, meta)`.

    Raises:
      CorruptCheckpointError: when the files are missing, truncated or unreadable.
    """
    self.verify(step)
    try:
      meta = self.restore_meta(step)
      tmpl = template(meta) if callable(template) else template
      target = jax.tree.map(_abstract, state_to_tree(tmpl))
      out = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
      )
      state = state_from_tree(out["state"])
    except CorruptCheckpointError:
      raise
    except Exception as e:  # Orbax raises many types for damaged files.
      raise CorruptCheckpointError(
        f"checkpoint step {step} in {self.directory} could not be read: {type(e).__name__}: {e}"
      ) from e
    return state, meta

  def restore_latest(
    self, template: Callable[[dict], TrainState] | TrainState
  ) -> tuple[TrainState, dict[str, Any]] | None:
    """Restores the newest good step, skipping corrupt ones with a warning.

    Returns:
      `(state, meta)`, or None when there is no checkpoint at all.

    Raises:
      CorruptCheckpointError: when checkpoints exist but none is readable.
    """
    steps = self.all_steps()
    errors = []
    for step in reversed(steps):
      try:
        return self.restore(step, template)
      except CorruptCheckpointError as e:
        msg = f"{e}; falling back to the previous checkpoint"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.warning(msg)
        errors.append(str(e))
    if steps:
      raise CorruptCheckpointError(f"no readable checkpoint in {self.directory}: {errors}")
    return None


def _abstract(x):
  sharding = getattr(x, "sharding", None)
  if sharding is None:  # an abstract leaf: restore onto the default device
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def restore_params(directory: str | pathlib.Path, step: int) -> tuple[BertConfig, Any, dict]:
  """The model of one checkpoint step, without its optimizer state.

  Args:
    directory: the checkpoint directory (the one holding ``<step>/`` folders).
    step: a saved step.

  Returns:
    `(config, params, meta)`: the step's model config (float32), its parameters as host
    NumPy arrays, and its metadata (``meta["extra"]["train"]`` holds the run's settings,
    its seed among them).

  Raises:
    ValueError: `step` is not a saved step (the message lists those that are).
    CorruptCheckpointError: the step's files are missing, truncated or unreadable.
  """
  ckpt = Checkpointer(directory, max_to_keep=None, async_save=False)
  try:
    steps = ckpt.all_steps()
    if step not in steps:
      raise ValueError(f"{step=} is not among the checkpoints {steps} in {directory}")
    ckpt.verify(step)
    try:
      meta = ckpt.restore_meta(step)
      # Onto this process's first device: the saved shardings name the training devices,
      # which another process (or machine) may not have.
      local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      absl = logging.getLogger("absl")
      level = absl.level
      absl.setLevel(logging.ERROR)  # not a problem: the step's metadata file sits one level up
      try:
        tree = ocp.StandardCheckpointer().metadata(ckpt.directory / str(step) / "state")
      finally:
        absl.setLevel(level)
      target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=local),
        getattr(tree, "item_metadata", tree),
        is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"),
      )
      out = ckpt._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
      )
    except Exception as e:  # Orbax raises many types for damaged files.
      raise CorruptCheckpointError(
        f"checkpoint step {step} in {ckpt.directory} could not be read: {type(e).__name__}: {e}"
      ) from e
  finally:
    ckpt._manager.close()
  config = config_from_json(meta["config"]).replace(dtype="float32")
  params = jax.tree.map(lambda a: np.asarray(a), out["state"]["params"])
  return config, params, meta


def export_hf(
  directory: str | pathlib.Path, path: str | pathlib.Path, *, step: int | None = None
) -> BertConfig:
  """Writes a training checkpoint as a Hugging Face model directory (`bertjax.to_hf`).

  Only the parameters are read (the optimizer state is skipped). An ELECTRA run's pair
  becomes two directories, ``path/generator`` (`ElectraForMaskedLM`) and
  ``path/discriminator`` (`ElectraForPreTraining`), the generator's config read from the
  checkpoint's metadata (`training.electra.save_electra`).

  Args:
    directory: the checkpoint directory.
    path: the output Hugging Face directory.
    step: the step to export; None means the latest good one (corrupt ones are skipped).

  Returns:
    The model config written (an ELECTRA run's: the discriminator's).
  """
  from bertjax.model.hf import to_hf
  from bertjax.training import electra

  ckpt = Checkpointer(directory, max_to_keep=None, async_save=False)
  steps = ckpt.all_steps()
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  if step is not None and step not in steps:
    raise ValueError(f"{step=} is not among the checkpoints {steps} in {directory}")
  last_error = None
  for s in [step] if step is not None else list(reversed(steps)):
    try:
      ckpt.verify(s)
      meta = ckpt.restore_meta(s)
      out = ckpt._manager.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
      params = out["state"]["params"]
      break
    except Exception as e:  # noqa: BLE001 - reported below
      warnings.warn(
        f"checkpoint step {s} could not be exported ({e}); trying an earlier one",
        RuntimeWarning,
        stacklevel=2,
      )
      last_error = e
  else:
    raise CorruptCheckpointError(f"no exportable checkpoint in {directory}: {last_error}")
  config = config_from_json(meta["config"]).replace(dtype="float32")
  params = jax.tree.map(lambda a: jax.numpy.asarray(a), params)
  if electra.is_pair(params):
    generator = electra.generator_from_meta(meta).replace(dtype="float32")
    electra.save_electra(params, generator, config, path)
  else:
    to_hf(config, params, path)
  ckpt.close()
  return config
