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

from bertjax.config import BertConfig
from bertjax.functional import init
from bertjax.training import checkpoint as ckpt_lib
from bertjax.training import objectives as objectives_lib
from bertjax.training import optim, sharding, stacking
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
      raise ValueError(f"batch_size={self.batch_size} must be a positive multiple of "
                       f"accumulation_steps={self.accumulation_steps}")
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
    raise ValueError(f"stacking schedule {train.stacking!r} ends with {stages[-1].layers} "
                     f"layers but the model config has num_hidden_layers="
                     f"{config.num_hidden_layers}")
  if config.model_type != "bert":
    raise ValueError(f"progressive stacking needs model_type='bert', got "
                     f"{config.model_type!r} (ALBERT shares its layers)")
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


def pretrain(config: BertConfig, data, train: TrainConfig, *, resume: bool = False,
             params: Any = None, objective: Any = None) -> dict[str, Any]:
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
  two_models = any(hasattr(o, "init_model") for o in objective)
  if two_models and train.stacking:
    raise ValueError(f"stacking={train.stacking!r} is not supported with objectives that "
                     f"train their own model pair ({[type(o).__name__ for o in objective]})")
  stages, configs = _stage_configs(config, train)
  boundaries = stacking.stage_boundaries(stages)
  if data.config.max_seq_len > config.max_position_embeddings:
    raise ValueError(f"data max_seq_len={data.config.max_seq_len} exceeds "
                     f"max_position_embeddings={config.max_position_embeddings}")
  if getattr(data, "batch_size", train.batch_size) != train.batch_size:
    raise ValueError(f"data batch_size={data.batch_size} must equal the train batch_size="
                     f"{train.batch_size}")
  tx, schedule = train.make_optimizer()
  heads = objectives_lib.heads_of(objective)
  mesh = None if train.mesh_shape is None else sharding.make_mesh(*train.mesh_shape)

  out_dir = pathlib.Path(train.output_dir) if train.output_dir else None
  ckpt = None
  if out_dir is not None:
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_lib.Checkpointer(out_dir / "checkpoints", max_to_keep=train.keep,
                                 save_every=train.checkpoint_every,
                                 async_save=train.async_checkpoint)
  elif resume:
    raise ValueError("resume=True needs train.output_dir")

  def template(meta):
    cfg = ckpt_lib.config_from_json(meta["config"])
    return jax.eval_shape(lambda: create_train_state(init_for_objectives(cfg, 0, objective),
                                                     tx, train.seed))

  stage, state, restored = 0, None, None
  if resume and ckpt is not None:
    restored = ckpt.restore_latest(template)
  if restored is not None:
    state, meta = restored
    stage = meta["stage"]
    saved = ckpt_lib.config_from_json(meta["config"])
    if saved.num_hidden_layers != configs[stage].num_hidden_layers:
      raise ValueError(f"checkpoint stage {stage} config does not match the stacking schedule "
                       f"{train.stacking!r}")
    data.set_state(meta["data_state"])
    log.info("resumed from step %d (stage %d) in %s", int(state.step), stage, ckpt.directory)
  else:
    if params is None:
      params = init_for_objectives(configs[0], train.seed, objective)
    depth = (jax.tree.leaves(params["encoder"]["layers"])[0].shape[0] if not two_models
             else configs[0].num_param_layers)
    if depth != configs[0].num_param_layers:
      raise ValueError(f"initial params have {depth} stacked layers but the first stage needs "
                       f"{configs[0].num_param_layers} (stacking={train.stacking!r})")
    missing = [h for h in heads if h not in params]
    if missing:
      raise ValueError(f"initial params lack the heads {missing} needed for objectives "
                       f"{[o.name for o in objective]}")
    state = create_train_state(params, tx, train.seed)
  step = int(state.step)
  if data.step != step:
    raise ValueError(f"data iterator is at step {data.step} but training is at step {step}")

  history: list[dict] = []
  jsonl = None
  # With several processes (multi-host) only process 0 writes logs and shows progress.
  primary = jax.process_index() == 0
  if out_dir is not None and primary:
    path = out_dir / "metrics.jsonl"
    history = [r for r in _read_jsonl(path) if r["step"] <= step] if restored else []
    path.write_text("".join(json.dumps(r) + "\n" for r in history))
    jsonl = open(path, "a")  # noqa: SIM115 (closed in the finally below)
  events = EventWriter(out_dir / "tensorboard") if out_dir is not None and primary else None

  # What the checkpoints record beside the run's settings: objectives that train their own
  # models (ELECTRA) add what rebuilding them needs (the generator's config).
  extra = {"train": dataclasses.asdict(train)}
  for o in objective:
    extra.update(o.checkpoint_meta() if hasattr(o, "checkpoint_meta") else {})
  steps_cache: dict[tuple, Any] = {}

  def step_fn(cfg, st):
    key = (cfg, None if mesh is None else id(mesh))
    if key not in steps_cache:
      shard_kw = {}
      if mesh is not None:
        shard_kw = {"state_sharding": sharding.state_shardings(st, mesh),
                    "batch_sharding": sharding.batch_sharding(mesh)}
      steps_cache[key] = make_train_step(
          cfg.replace(dtype=train.dtype), tx, schedule, task="pretrain", objective=objective,
          accumulation_steps=train.accumulation_steps, **shard_kw)
    return steps_cache[key]

  def place(st):
    return st if mesh is None else sharding.shard_state(st, mesh)[0]

  state = place(state)
  bar = None
  if train.progress and primary:
    from tqdm.auto import tqdm
    bar = tqdm(total=train.steps, initial=step, desc="pretrain", dynamic_ncols=True)

  start_step, t_start = step, time.perf_counter()
  tokens_total, last_saved = 0, ckpt.latest_step() if ckpt else None
  try:
    while step < train.steps:
      while stage < len(stages) - 1 and step >= boundaries[stage]:
        new_cfg, p, o = stacking.grow(configs[stage], state.params, state.opt_state,
                                      stages[stage + 1].layers, train.reset_moments)
        stage += 1
        state = place(state.replace(params=p, opt_state=o))
        log.info("step %d: stacked to %d layers", step, new_cfg.num_hidden_layers)
      batch = next(data)  # the global batch (every process iterates the same data)
      tokens = int(np.asarray(batch["attention_mask"]).sum())
      t0 = time.perf_counter()
      if mesh is not None:
        batch = sharding.shard_batch(batch, mesh)
      state, metrics = step_fn(configs[stage], state)(state, batch)
      metrics = jax.device_get(metrics)
      dt = time.perf_counter() - t0
      tokens_total += tokens
      if not metrics["finite"]:
        if ckpt is not None:
          ckpt.wait()
        where = (f"the last good checkpoint is step {ckpt.latest_step()} in {ckpt.directory}"
                 if ckpt is not None and ckpt.latest_step() is not None else
                 "no checkpoint was written")
        raise FloatingPointError(
            f"non-finite loss={float(metrics['loss'])} / grad_norm="
            f"{float(metrics['grad_norm'])} at step {step + 1} (stage {stage}); training "
            f"stopped without applying it; {where}")
      step += 1
      record = {"step": step, "stage": stage, "layers": configs[stage].num_hidden_layers}
      record.update({k: float(v) for k, v in metrics.items() if k != "finite"})
      record["tokens_per_s"] = tokens / max(dt, 1e-9)
      history.append(record)
      if jsonl is not None:
        jsonl.write(json.dumps(record) + "\n")
        jsonl.flush()
      if events is not None:
        events.scalars(step, {k: v for k, v in record.items() if k != "step"})
      if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}",
                        mlm=f"{record.get('mlm_loss', math.nan):.4f}",
                        tok_s=f"{record['tokens_per_s']:.0f}", L=record["layers"])
      due = ckpt is not None and (ckpt.should_save(step) or step == train.steps)
      if due and ckpt.save(step, state, config=configs[stage], data_state=data.state(),
                           stage=stage, extra=extra, force=True):
        last_saved = step
  finally:
    if bar is not None:
      bar.close()
    if jsonl is not None:
      jsonl.close()
    if events is not None:
      events.close()
    if ckpt is not None:
      ckpt.close()

  wall = time.perf_counter() - t_start
  losses = [r["loss"] for r in history]
  summary = {
      "steps": step,
      "steps_this_run": step - start_step,
      "resumed_from": None if restored is None else start_step,
      "first_loss": losses[0] if losses else math.nan,
      "final_loss": losses[-1] if losses else math.nan,
      "first_mlm_loss": history[0].get("mlm_loss", math.nan) if history else math.nan,
      "final_mlm_loss": history[-1].get("mlm_loss", math.nan) if history else math.nan,
      "tokens_this_run": tokens_total,
      "wall_time_s": wall,
      "tokens_per_s": tokens_total / max(wall, 1e-9),
      "num_hidden_layers": configs[stage].num_hidden_layers,
      "stage": stage,
      "output_dir": None if out_dir is None else str(out_dir),
      "checkpoint_dir": None if ckpt is None else str(ckpt.directory),
      "last_checkpoint": last_saved,
      "history": history,
  }
  return summary

