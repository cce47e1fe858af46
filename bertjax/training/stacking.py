"""Progressive stacking (Gong et al. 2019, "Efficient Training of BERT by Progressively Stacking").

Train a shallow model, then double it by copying its layers on top of
themselves (layer i + L := layer i), and go on training. With parameters stacked
on a leading layer axis, growth is a concatenation of that axis with itself,
truncated to the new depth. The optimizer's per-parameter state (Adam moments)
is grown the same way, or reset to zeros; the step count and with it the
learning-rate schedule continue.

A schedule string lists the stages as ``layers:steps`` separated by commas, the
last stage without steps (it runs to the end): ``"3:50000,6:70000,12"`` trains 3
layers for 50k steps, 6 layers for 70k more, then 12 layers.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import jax.numpy as jnp

from bertjax.model.config import BertConfig
from bertjax.model.families import FAMILIES


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stacking stage: `layers` encoder layers for `steps` steps (None: to the end)."""

  layers: int
  steps: int | None


def parse_schedule(schedule: str) -> list[Stage]:
  """Parses ``"3:50000,6:70000,12"`` into stages.

  Raises:
    ValueError: naming the bad part, for empty parts, non-integers, non-positive
      values, a last stage with steps or an earlier one without, or layer counts
      that do not increase.
  """
  if not isinstance(schedule, str) or not schedule.strip():
    raise ValueError(f"stacking schedule {schedule!r} is empty; expected e.g. '3:50000,6:70000,12'")
  parts = [p.strip() for p in schedule.split(",")]
  stages = []
  for i, part in enumerate(parts):
    last = i == len(parts) - 1
    fields = part.split(":")
    if len(fields) > 2 or not part:
      raise ValueError(
        f"stacking schedule {schedule!r}: stage {i} {part!r} must be "
        "'layers:steps' (or 'layers' for the last stage)"
      )
    try:
      layers = int(fields[0])
      steps = int(fields[1]) if len(fields) == 2 else None
    except ValueError:
      raise ValueError(
        f"stacking schedule {schedule!r}: stage {i} {part!r} must hold integers, 'layers:steps'"
      ) from None
    if layers < 1:
      raise ValueError(f"stacking schedule {schedule!r}: stage {i} has {layers=}; must be >= 1")
    if steps is None and not last:
      raise ValueError(
        f"stacking schedule {schedule!r}: stage {i} {part!r} needs a step count "
        "('layers:steps'); only the last stage runs to the end"
      )
    if steps is not None and last:
      raise ValueError(
        f"stacking schedule {schedule!r}: the last stage {part!r} runs to the end "
        f"and takes no step count; write '{layers}'"
      )
    if steps is not None and steps < 1:
      raise ValueError(f"stacking schedule {schedule!r}: stage {i} has {steps=}; must be >= 1")
    if stages and layers <= stages[-1].layers:
      raise ValueError(
        f"stacking schedule {schedule!r}: layers must increase, but stage {i} has "
        f"{layers} after {stages[-1].layers}"
      )
    stages.append(Stage(layers, steps))
  return stages


def stage_boundaries(stages: list[Stage]) -> list[int]:
  """The global steps at which each stage after the first starts."""
  out, total = [], 0
  for s in stages[:-1]:
    total += s.steps
    out.append(total)
  return out


def stage_at(stages: list[Stage], step: int) -> int:
  """The index of the stage that trains global step `step` (0-based)."""
  return sum(step >= b for b in stage_boundaries(stages))


def stacking_families() -> list[str]:
  """The families progressive stacking trains (`Family.training["stacking"]` in their rows)."""
  return sorted(name for name, row in FAMILIES.items() if "stacking" in row.training)


def _grow_layers(a: jax.Array, new_layers: int) -> jax.Array:
  """Concatenates the stacked axis with itself until it holds `new_layers`."""
  reps = -(-new_layers // a.shape[0])
  return jnp.concatenate([a] * reps, axis=0)[:new_layers]


def _under_layers(path) -> bool:
  names = [getattr(k, "key", None) for k in path]
  return any(a == "encoder" and b == "layers" for a, b in itertools.pairwise(names))


def grow(
  config: BertConfig, params: Any, opt_state: Any, new_layers: int, reset_moments: bool = False
) -> tuple[BertConfig, Any, Any]:
  """Deepens a BERT model by stacking its layers on themselves.

  It returns a whole model, so it takes the `(config, params)` pair first, as
  `prune_heads` does (README, "One argument order").

  Args:
    config: the current config (model_type "bert").
    params: parameters with `encoder/layers` stacked on a leading axis of
      `config.num_hidden_layers`.
    opt_state: the optax state for `params` (may be None).
    new_layers: the new depth, > `config.num_hidden_layers`.
    reset_moments: zero every floating-point leaf of the optimizer state
      (Adam's first and second moments) instead of copying it; integer leaves
      (step counts) are kept either way.

  Returns:
    `(new_config, new_params, new_opt_state)`.
  """
  if not isinstance(config, BertConfig):
    raise TypeError(
      f"grow takes (config, params, opt_state, new_layers); its first argument "
      f"is a {type(config).__name__}, not a BertConfig"
    )
  stacks = "stacking" in config.family.training
  if not stacks or config.num_param_layers != config.num_hidden_layers:
    raise ValueError(
      f"progressive stacking needs one parameter set per layer ({stacking_families()}); "
      f"got model_type="
      f"{config.model_type!r} with {config.num_param_layers} parameter layers for "
      f"{config.depth} blocks: ALBERT shares its layers, so copying them changes nothing"
    )
  old = config.num_hidden_layers
  if not isinstance(new_layers, int) or new_layers <= old:
    raise ValueError(f"{new_layers=} must be an int > the current num_hidden_layers={old}")
  if getattr(config, "pruned_heads", ()):
    raise ValueError("progressive stacking of a model with pruned_heads is not supported")

  def grow_leaf(path, a):
    if _under_layers(path) and hasattr(a, "shape") and a.ndim >= 1 and a.shape[0] == old:
      return _grow_layers(a, new_layers)
    return a

  new_params = jax.tree_util.tree_map_with_path(grow_leaf, params)
  new_opt = None
  if opt_state is not None:
    new_opt = jax.tree_util.tree_map_with_path(grow_leaf, opt_state)
    if reset_moments:
      new_opt = jax.tree.map(
        lambda a: jnp.zeros_like(a) if jnp.issubdtype(a.dtype, jnp.floating) else a, new_opt
      )
  return config.replace(num_hidden_layers=new_layers), new_params, new_opt
