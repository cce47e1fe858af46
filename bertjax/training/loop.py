"""The pretraining loop: data, state, optimizer, stacking stages, logging, checkpoints, resume.

`pretrain` runs one whole training job. Everything it needs to continue is in
its checkpoints (params, optimizer state, step, RNG key, the data iterator's
position, the stacking stage and the config), and every source of randomness is
a pure function of (seed, step): the data iterator's batch k, and the dropout
key `fold_in(rng, k)`. So a run resumed with `resume=True` after being killed
reproduces the per-step losses of an uninterrupted run bitwise on CPU, across
stacking boundaries too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
from typing import Any

import jax
import numpy as np

from bertjax import mesh as mesh_lib
from bertjax.model.config import BertConfig
from bertjax.model.forward import init
from bertjax.training import checkpoint as ckpt_lib
from bertjax.training import objectives as objectives_lib
from bertjax.training import optim, stacking
from bertjax.training.events import EventWriter
from bertjax.training.state import create_train_state
from bertjax.training.step import make_train_step
from bertjax.utils import flat_kwargs

log = logging.getLogger(__name__)


@flat_kwargs("optim")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Hyper-parameters and bookkeeping of a training run.

  Attributes:
    steps: optimizer steps in total (all stacking stages together).
    batch_size: examples per optimizer step (all micro-batches together); the
      data iterator must yield batches of this size.
    accumulation_steps: micro-batches per step (gradient accumulation).
    optim: the optimiser and learning-rate schedule (`optim.OptimConfig`: optimizer,
      learning_rate, warmup_steps, decay, end_lr_ratio, clip_norm, weight_decay, b1, b2,
      eps); its fields may also be given flat: `TrainConfig(steps=100, learning_rate=1e-3)`.
    dtype: compute dtype, "float32" or "bfloat16" (weights stay float32).
    stacking: a progressive-stacking schedule ("3:500,6"), or None.
    reset_moments: zero Adam moments at each growth instead of copying them.
    seed: parameter initialisation and dropout seed.
    output_dir: checkpoints, metrics.jsonl and TensorBoard events; None keeps nothing.
    checkpoint_every: save every N steps (0: only at the end); needs output_dir.
    keep: checkpoints to keep.
    async_checkpoint: save in the background.
    mesh_shape: (data, fsdp) for sharded training, or None for one device.
    progress: show a tqdm progress bar.
  """

  steps: int
  batch_size: int = 32
  accumulation_steps: int = 1
  optim: optim.OptimConfig = optim.OptimConfig()  # noqa: RUF009 (frozen)
  dtype: str = "float32"
  stacking: str | None = None
  reset_moments: bool = False
  seed: int = 0
  output_dir: str | None = None
  checkpoint_every: int = 0
  keep: int = 3
  async_checkpoint: bool = True
  mesh_shape: tuple[int, int] | None = None
  progress: bool = True

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"steps={self.steps} must be >= 1")
    if self.batch_size < 1 or self.batch_size % self.accumulation_steps:
      raise ValueError(
        f"batch_size={self.batch_size} must be a positive multiple of "
        f"accumulation_steps={self.accumulation_steps}"
      )
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype={self.dtype!r} must be 'float32' or 'bfloat16'")
    if self.checkpoint_every < 0:
      raise ValueError(f"checkpoint_every={self.checkpoint_every} must be >= 0")

  def make_optimizer(self):
    """`(tx, schedule)` for this run."""
    return self.optim.make(self.steps)


def init_for_objectives(config: BertConfig, seed: int | jax.Array, objectives) -> Any:
  """Fresh parameters for a run's objectives.

  Args:
    config: the model config.
    seed: a seed or a PRNG key.
    objectives: what `training.objectives.resolve` takes.

  Returns:
    `init(config, seed, heads)` with the heads the objectives need plus the parameters
    they own (e.g. `params["sbo"]`), or an objective's own model tree (ELECTRA's
    `{"generator", "discriminator"}` pair).
  """
  objs = objectives_lib.resolve(objectives)
  for o in objs:
    if hasattr(o, "init_model"):
      return o.init_model(config, seed)
  params = init(config, seed, objectives_lib.heads_of(objs))
  params.update(objectives_lib.init_objective_params(objs, config, seed))
  return params


def _stage_configs(config: BertConfig, train: TrainConfig):
  if not train.stacking:
    return [stacking.Stage(config.num_hidden_layers, None)], [config]
  stages = stacking.parse_schedule(train.stacking)
  if stages[-1].layers != config.num_hidden_layers:
    raise ValueError(
      f"stacking schedule {train.stacking!r} ends with {stages[-1].layers} "
      f"layers but the model config has num_hidden_layers="
      f"{config.num_hidden_layers}"
    )
  if "stacking" not in config.family.training:
    raise ValueError(
      f"progressive stacking is trained for {stacking.stacking_families()}, got model_type="
      f"{config.model_type!r} (ALBERT shares its layers)"
    )
  return stages, [config.replace(num_hidden_layers=s.layers) for s in stages]


def _read_jsonl(path: pathlib.Path) -> list[dict]:
  if not path.is_file():
    return []
  out = []
  for line in path.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      break  # a line cut by a kill; everything after it is redone
  return out


def pretrain(
  config: BertConfig,
  data,
  train: TrainConfig,
  *,
  resume: bool = False,
  params: Any = None,
  objective: Any = None,
) -> dict[str, Any]:
  """Pretrains with MLM (+ NSP or SOP, from the data's objective) or any objectives.

  Args:
    config: the final model config (with the last stage's depth when stacking).
    data: a `bertjax.data.pretraining.PretrainingIterator` (anything with
      `config.objective`, `step`, `__next__`, `state()` and `set_state()`),
      global batch size `train.batch_size`, positioned at step 0.
    train: the run's hyper-parameters.
    resume: continue from the newest good checkpoint in `train.output_dir` if any.
    params: initial parameters (e.g. from `from_hf`), else `init_for_objectives`.
    objective: the objectives (what `training.objectives.resolve` takes: "mlm+sbo",
      components such as `training.electra.Electra(generator_config)`); None takes the
      data's objective ("nsp", "sop" or "none").

  Returns:
    A summary dict: steps, first/final losses, tokens, wall time, tokens/s, the
    final config, the checkpoint directory and steps, and the per-step `history`.

  Raises:
    FloatingPointError: on a NaN/inf loss or gradient; the last good checkpoint
      is kept (and the failing update is not applied).
  """
  objective = objectives_lib.resolve(data.config.objective if objective is None else objective)
  stages, configs = _check_run(config, data, train, objective)
  tx, schedule = train.make_optimizer()
  mesh = None
  if train.mesh_shape is not None:
    data_ways, fsdp_ways = train.mesh_shape
    mesh = mesh_lib.make_mesh(data=data_ways, fsdp=fsdp_ways)
  out_dir, ckpt = _open_checkpointer(train, resume)
  restored = (
    _restore(ckpt, configs, data, train, objective, tx) if resume and ckpt is not None else None
  )
  if restored is None:
    stage, state = 0, _fresh_state(configs, train, objective, tx, params)
  else:
    stage, state = restored
  step = int(state.step)
  if data.step != step:
    raise ValueError(f"data iterator is at step {data.step} but training is at step {step}")

  extra = _checkpoint_extra(train, objective)
  step_fn = _step_functions(train, tx, schedule, objective, mesh)
  state = _place(state, mesh)
  logs = _RunLog(out_dir, train, step, resumed=restored is not None)
  start_step, t_start = step, time.perf_counter()
  tokens_total, last_saved = 0, ckpt.latest_step() if ckpt else None
  try:
    while step < train.steps:
      stage, state = _grow_to(step, stage, state, stages, configs, train, mesh)
      state, metrics, tokens, seconds = _train_step(step_fn, configs[stage], state, data, mesh)
      tokens_total += tokens
      if not metrics["finite"]:
        raise _non_finite_error(metrics, step, stage, ckpt)
      step += 1
      logs.add(_step_record(step, stage, configs[stage], metrics, tokens, seconds))
      due = ckpt is not None and (ckpt.should_save(step) or step == train.steps)
      if due and ckpt.save(
        step,
        state,
        config=configs[stage],
        data_state=data.state(),
        stage=stage,
        extra=extra,
        force=True,
      ):
        last_saved = step
  finally:
    logs.close()
    if ckpt is not None:
      ckpt.close()
  return _summary(
    logs.history,
    step=step,
    start_step=start_step,
    resumed=restored is not None,
    tokens=tokens_total,
    wall=time.perf_counter() - t_start,
    config=configs[stage],
    stage=stage,
    out_dir=out_dir,
    ckpt=ckpt,
    last_saved=last_saved,
  )


# The steps of `pretrain` -------------------------------------------------------------------


def _owns_models(objective) -> bool:
  """Whether an objective trains its own model pair (ELECTRA's generator and discriminator)."""
  return any(hasattr(o, "init_model") for o in objective)


def _check_run(config: BertConfig, data, train: TrainConfig, objective):
  """The stacking stages and their configs, once data, config and objectives are checked."""
  if _owns_models(objective) and train.stacking:
    raise ValueError(
      f"stacking={train.stacking!r} is not supported with objectives that "
      f"train their own model pair ({[type(o).__name__ for o in objective]})"
    )
  stages, configs = _stage_configs(config, train)
  if data.config.max_seq_len > config.max_position_embeddings:
    raise ValueError(
      f"data max_seq_len={data.config.max_seq_len} exceeds "
      f"max_position_embeddings={config.max_position_embeddings}"
    )
  if getattr(data, "batch_size", train.batch_size) != train.batch_size:
    raise ValueError(
      f"data batch_size={data.batch_size} must equal the train batch_size={train.batch_size}"
    )
  return stages, configs


def _open_checkpointer(train: TrainConfig, resume: bool):
  """`(output directory, checkpointer)`, both None when the run keeps nothing."""
  if not train.output_dir:
    if resume:
      raise ValueError("resume=True needs train.output_dir")
    return None, None
  out_dir = pathlib.Path(train.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  return out_dir, ckpt_lib.Checkpointer(
    out_dir / "checkpoints",
    max_to_keep=train.keep,
    save_every=train.checkpoint_every,
    async_save=train.async_checkpoint,
  )


def _restore(ckpt, configs, data, train: TrainConfig, objective, tx):
  """`(stage, state)` of the newest good checkpoint, `data` moved to its position; or None."""

  def template(meta):
    cfg = ckpt_lib.config_from_json(meta["config"])
    return jax.eval_shape(
      lambda: create_train_state(init_for_objectives(cfg, 0, objective), tx, train.seed)
    )

  restored = ckpt.restore_latest(template)
  if restored is None:
    return None
  state, meta = restored
  stage = meta["stage"]
  saved = ckpt_lib.config_from_json(meta["config"])
  if saved.num_hidden_layers != configs[stage].num_hidden_layers:
    raise ValueError(
      f"checkpoint stage {stage} config does not match the stacking schedule {train.stacking!r}"
    )
  data.set_state(meta["data_state"])
  log.info("resumed from step %d (stage %d) in %s", int(state.step), stage, ckpt.directory)
  return stage, state


def _fresh_state(configs, train: TrainConfig, objective, tx, params):
  """The state at step 0, from `params` (checked against the first stage) or fresh ones."""
  if params is None:
    params = init_for_objectives(configs[0], train.seed, objective)
  depth = (
    jax.tree.leaves(params["encoder"]["layers"])[0].shape[0]
    if not _owns_models(objective)
    else configs[0].num_param_layers
  )
  if depth != configs[0].num_param_layers:
    raise ValueError(
      f"initial params have {depth} stacked layers but the first stage needs "
      f"{configs[0].num_param_layers} (stacking={train.stacking!r})"
    )
  missing = [h for h in objectives_lib.heads_of(objective) if h not in params]
  if missing:
    raise ValueError(
      f"initial params lack the heads {missing} needed for objectives {[o.name for o in objective]}"
    )
  return create_train_state(params, tx, train.seed)


def _checkpoint_extra(train: TrainConfig, objective) -> dict[str, Any]:
  """What the checkpoints record beside the run's settings: objectives that train their own
  models (ELECTRA) add what rebuilding them needs (the generator's config)."""
  extra = {"train": dataclasses.asdict(train)}
  for o in objective:
    extra.update(o.checkpoint_meta() if hasattr(o, "checkpoint_meta") else {})
  return extra


def _step_functions(train: TrainConfig, tx, schedule, objective, mesh):
  """`step_fn(config, state)`: a stage's train step, built once per config."""
  cache: dict[tuple, Any] = {}

  def step_fn(cfg, st):
    key = (cfg, None if mesh is None else id(mesh))
    if key not in cache:
      shard_kw = {}
      if mesh is not None:
        shard_kw = {
          "state_sharding": mesh_lib.state_shardings(st, mesh),
          "batch_sharding": mesh_lib.batch_sharding(mesh),
        }
      cache[key] = make_train_step(
        cfg.replace(dtype=train.dtype),
        tx,
        schedule,
        task="pretrain",
        objective=objective,
        accumulation_steps=train.accumulation_steps,
        **shard_kw,
      )
    return cache[key]

  return step_fn


def _place(state, mesh):
  return state if mesh is None else mesh_lib.shard_state(state, mesh)[0]


def _grow_to(step: int, stage: int, state, stages, configs, train: TrainConfig, mesh):
  """`(stage, state)` after growing through every stacking boundary at or before `step`."""
  boundaries = stacking.stage_boundaries(stages)
  while stage < len(stages) - 1 and step >= boundaries[stage]:
    new_cfg, p, o = stacking.grow(
      configs[stage], state.params, state.opt_state, stages[stage + 1].layers, train.reset_moments
    )
    stage += 1
    state = _place(state.replace(params=p, opt_state=o), mesh)
    log.info("step %d: stacked to %d layers", step, new_cfg.num_hidden_layers)
  return stage, state


def _train_step(step_fn, config: BertConfig, state, data, mesh):
  """One optimizer step on the next global batch: `(state, metrics, real tokens, seconds)`."""
  batch = next(data)  # the global batch (every process iterates the same data)
  tokens = int(np.asarray(batch["attention_mask"]).sum())
  t0 = time.perf_counter()
  if mesh is not None:
    batch = mesh_lib.shard_batch(batch, mesh)
  state, metrics = step_fn(config, state)(state, batch)
  metrics = jax.device_get(metrics)
  return state, metrics, tokens, time.perf_counter() - t0


def _non_finite_error(metrics, step: int, stage: int, ckpt) -> FloatingPointError:
  """The error for a non-finite step, naming the last good checkpoint once saves are done."""
  if ckpt is not None:
    ckpt.wait()
  where = (
    f"the last good checkpoint is step {ckpt.latest_step()} in {ckpt.directory}"
    if ckpt is not None and ckpt.latest_step() is not None
    else "no checkpoint was written"
  )
  return FloatingPointError(
    f"non-finite loss={float(metrics['loss'])} / grad_norm="
    f"{float(metrics['grad_norm'])} at step {step + 1} (stage {stage}); training "
    f"stopped without applying it; {where}"
  )


def _step_record(
  step: int, stage: int, config: BertConfig, metrics, tokens: int, seconds: float
) -> dict[str, Any]:
  """The log record of a finished step."""
  record = {"step": step, "stage": stage, "layers": config.num_hidden_layers}
  record.update({k: float(v) for k, v in metrics.items() if k != "finite"})
  record["tokens_per_s"] = tokens / max(seconds, 1e-9)
  return record


class _RunLog:
  """Where step records go: the history, metrics.jsonl, TensorBoard and a progress bar.

  With several processes (multi-host) only process 0 writes logs and shows progress.
  A resumed run keeps the records of metrics.jsonl up to its step; a new one starts it anew.
  """

  def __init__(self, out_dir: pathlib.Path | None, train: TrainConfig, step: int, *, resumed: bool):
    primary = jax.process_index() == 0
    self.history: list[dict] = []
    self._jsonl = self._events = self._bar = None
    if out_dir is not None and primary:
      path = out_dir / "metrics.jsonl"
      self.history = [r for r in _read_jsonl(path) if r["step"] <= step] if resumed else []
      path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
      self._jsonl = open(path, "a")  # noqa: SIM115 (closed in close())
      self._events = EventWriter(out_dir / "tensorboard")
    if train.progress and primary:
      from tqdm.auto import tqdm

      self._bar = tqdm(total=train.steps, initial=step, desc="pretrain", dynamic_ncols=True)

  def add(self, record: dict[str, Any]) -> None:
    self.history.append(record)
    if self._jsonl is not None:
      self._jsonl.write(json.dumps(record) + "\n")
      self._jsonl.flush()
    if self._events is not None:
      self._events.scalars(record["step"], {k: v for k, v in record.items() if k != "step"})
    if self._bar is not None:
      self._bar.update(1)
      self._bar.set_postfix(
        loss=f"{record['loss']:.4f}",
        mlm=f"{record.get('mlm_loss', math.nan):.4f}",
        tok_s=f"{record['tokens_per_s']:.0f}",
        L=record["layers"],
      )

  def close(self) -> None:
    for f in (self._bar, self._jsonl, self._events):
      if f is not None:
        f.close()


def _summary(
  history: list[dict],
  *,
  step: int,
  start_step: int,
  resumed: bool,
  tokens: int,
  wall: float,
  config: BertConfig,
  stage: int,
  out_dir,
  ckpt,
  last_saved,
) -> dict[str, Any]:
  """What `pretrain` returns."""
  losses = [r["loss"] for r in history]
  return {
    "steps": step,
    "steps_this_run": step - start_step,
    "resumed_from": start_step if resumed else None,
    "first_loss": losses[0] if losses else math.nan,
    "final_loss": losses[-1] if losses else math.nan,
    "first_mlm_loss": history[0].get("mlm_loss", math.nan) if history else math.nan,
    "final_mlm_loss": history[-1].get("mlm_loss", math.nan) if history else math.nan,
    "tokens_this_run": tokens,
    "wall_time_s": wall,
    "tokens_per_s": tokens / max(wall, 1e-9),
    "num_hidden_layers": config.num_hidden_layers,
    "stage": stage,
    "output_dir": None if out_dir is None else str(out_dir),
    "checkpoint_dir": None if ckpt is None else str(ckpt.directory),
    "last_checkpoint": last_saved,
    "history": history,
  }
