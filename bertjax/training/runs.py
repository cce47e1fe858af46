"""Timed pretraining runs, for the experiments that compare how models train (progressive
stacking, ALBERT's sharing): WikiText-2 with a vocabulary numbered in a fixed order, batches
whose hand-over is timed, per-step costs with compile time apart, the held-out MLM loss,
one `loop.pretrain` run that returns all of it, and the comparison of two runs by the time
one takes to reach the other's final loss (Gong et al. 2019's measure for stacking): run in
ABBA order (`abba_runs`), estimated three ways (`time_ratio_estimates`, whose method
`TIMING_METHOD` states) and, where the stacked run misses, tried once more with another
shallow stage (`stage_variation`). For the intervals of the experiments' claims: each held-out
sequence's loss, paired across runs (`heldout_sequence_items`), and the priced estimates on
bootstrap resamples of their step times (`resampled_estimates`)."""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from bertjax import stats


@dataclasses.dataclass
class PretrainingData:
  """WikiText-2 ready for the loop: training corpus and examples, fixed held-out batches."""

  corpus: Any
  examples: Any
  config: Any
  eval_batches: list[dict[str, np.ndarray]]
  stats: dict[str, Any]

  def iterator(self, batch_size: int, seed: int):
    """A fresh `PretrainingIterator` at step 0 (same order and masks for every call)."""
    from bertjax.data import pretraining as P

    return P.PretrainingIterator(
      self.corpus, self.config, batch_size=batch_size, seed=seed, examples=self.examples
    )


def sorted_vocabulary(tokenizer):
  """The same WordPiece vocabulary with ids in a fixed order: special tokens, then sorted.

  `train_wordpiece` numbers its tokens in an order that changes between processes (and at
  8k tokens even a few tokens at the size cut-off change), so runs would not repeat; this
  fixes the order, the part that matters most (which embedding row each token gets). The
  tokenisation depends only on the token set.
  """
  from bertjax.data import corpus as C

  vocab = tokenizer.get_vocab(with_added_tokens=True)
  special = list(C.SPECIAL_TOKENS)
  tokens = special + sorted(t for t in vocab if t not in special)
  with tempfile.TemporaryDirectory(prefix="bertjax-vocab-") as tmp:
    path = pathlib.Path(tmp) / "vocab.txt"
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return C.load_tokenizer(path)


def load_wikitext(
  data_dir: pathlib.Path,
  *,
  vocab: int,
  seq_len: int,
  eval_batches: int,
  batch: int,
  seed: int,
  max_lines: int | None = None,
) -> PretrainingData:
  """WikiText-2 `valid.txt` for training (vocab trained on it), `test.txt` held out.

  Args:
    data_dir: the shared data directory (holding `wikitext2_tokens/`).
    vocab: WordPiece vocabulary size.
    seq_len: tokens per segment (RoBERTa FULL-SENTENCES packing, MLM only).
    eval_batches: how many held-out batches of `batch` segments.
    batch: segments per batch.
    seed: seeds example building, order and masking.
    max_lines: read only the first lines of each file (for `--smoke`).

  Returns:
    The training corpus and examples and the held-out batches (masks fixed by `seed`); the
    vocabulary's ids are numbered in a fixed order (see `sorted_vocabulary`).
  """
  from bertjax.data import corpus as C
  from bertjax.data import pretraining as P
  from bertjax.data import pretraining_examples as PE

  root = data_dir / "wikitext2_tokens"
  train_path, test_path = root / "valid.txt", root / "test.txt"
  for path in (train_path, test_path):
    if not path.is_file():
      raise FileNotFoundError(f"WikiText-2 file {path} is missing (expected under {data_dir})")
  docs = C.read_documents(train_path, format="wikitext", max_lines=max_lines)
  tokenizer = sorted_vocabulary(C.train_wordpiece((s for d in docs for s in d), vocab))
  corpus = C.tokenize_documents(docs, tokenizer)
  held = C.tokenize_documents(
    C.read_documents(test_path, format="wikitext", max_lines=max_lines), tokenizer
  )
  config = PE.PretrainingConfig(max_seq_len=seq_len, objective="none")
  examples = PE.build_examples(corpus, config, seed)
  held_it = P.PretrainingIterator(held, config, batch_size=batch, seed=seed + 1)
  n_eval = min(eval_batches, held_it.steps_per_epoch)
  if n_eval < 1:
    raise ValueError(f"held-out set has {len(held_it.examples)} segments, fewer than {batch=}")
  evals = [held_it.batch(k) for k in range(n_eval)]
  # What a model that has learned only token frequencies scores: training unigram
  # probabilities (add-one) of the held-out masked tokens.
  counts = np.bincount(corpus.ids, minlength=corpus.vocab_size).astype(np.float64) + 1.0
  masked = np.concatenate([b["mlm_ids"][b["mlm_weights"] > 0] for b in evals])
  surprise = -np.log(counts / counts.sum())
  unigram = float(np.mean(surprise[masked]))
  # Per held-out sequence (as `heldout_sequence_losses`), for intervals over sequences.
  per_sequence = np.concatenate(
    [(surprise[b["mlm_ids"]] * b["mlm_weights"]).sum(-1) for b in evals]
  )
  stats = {
    "train_file": str(train_path),
    "heldout_file": str(test_path),
    "train_tokens": corpus.num_tokens,
    "train_documents": corpus.num_documents,
    "train_segments": len(examples),
    "heldout_tokens": held.num_tokens,
    "heldout_batches": n_eval,
    "heldout_masked_tokens": int(sum(b["mlm_weights"].sum() for b in evals)),
    "vocab_size": corpus.vocab_size,
    "unk_rate": corpus.unk_rate(),
    "unigram_heldout_mlm_loss": unigram,
    "heldout_sequence_unigram_loss_sum": np.round(per_sequence, 4),
  }
  return PretrainingData(corpus, examples, config, evals, stats)


class TimedIterator:
  """Wraps a pretraining iterator; records when each batch is asked for and handed over."""

  def __init__(self, inner):
    self.inner = inner
    self.enter: list[float] = []
    self.exit: list[float] = []
    self.tokens: list[int] = []

  @property
  def config(self):
    """The wrapped iterator's `config`."""
    return self.inner.config

  @property
  def batch_size(self) -> int:
    """The wrapped iterator's batch size."""
    return self.inner.batch_size

  @property
  def step(self) -> int:
    """The wrapped iterator's step (of the next batch)."""
    return self.inner.step

  def state(self) -> dict:
    """The wrapped iterator's resumable state."""
    return self.inner.state()

  def set_state(self, state: dict) -> None:
    """Restores the wrapped iterator's state."""
    self.inner.set_state(state)

  def __iter__(self) -> Iterator[dict]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    self.enter.append(time.perf_counter())
    batch = next(self.inner)
    self.tokens.append(int(batch["attention_mask"].sum()))
    self.exit.append(time.perf_counter())
    return batch


def step_costs(cost: Sequence[float], layers: Sequence[int]) -> dict[str, Any]:
  """Splits per-step times into compile (first step of each stage, above the stage median).

  Args:
    cost: seconds per step (compile included).
    layers: depth at each step; a change of depth starts a stage.

  Returns:
    `cost_s` (compile removed), `compile_s` per stage and the stages' first steps.
  """
  cost = np.asarray(cost, np.float64).copy()
  layers = np.asarray(layers)
  starts = [0] + [int(i) for i in np.flatnonzero(np.diff(layers)) + 1]
  ends = starts[1:] + [cost.shape[0]]
  compile_s = []
  for a, b in zip(starts, ends):
    typical = float(np.median(cost[a + 1 : b])) if b - a > 1 else float(cost[a])
    compile_s.append(max(float(cost[a]) - typical, 0.0))
    cost[a] = min(cost[a], typical)
  return {
    "cost_s": cost,
    "compile_s": compile_s,
    "stage_starts": starts,
    "stage_layers": [int(layers[a]) for a in starts],
  }


@functools.cache
def _eval_step(config):
  from bertjax.training.step import make_eval_step

  return make_eval_step(config, task="pretrain", objective="none")


def heldout_mlm_loss(params: Any, config, batches: Sequence[dict]) -> dict[str, float]:
  """MLM loss and accuracy over fixed held-out batches, weighted by masked tokens."""
  fn = _eval_step(config.replace(dtype="float32"))
  loss = acc = count = 0.0
  for b in batches:
    m = jax.device_get(fn(params, b))
    n = float(b["mlm_weights"].sum())
    loss += float(m["mlm_loss"]) * n
    acc += float(m["mlm_accuracy"]) * n
    count += n
  return {"mlm_loss": loss / count, "mlm_accuracy": acc / count, "masked_tokens": count}


@functools.cache
def _sequence_terms(config):
  from bertjax.model.forward import forward
  from bertjax.training.losses import mlm_sequence_terms

  def terms(params, b):
    out = forward(params, config, b["input_ids"], b["attention_mask"], b["token_type_ids"])
    h = out.last_hidden_state
    return mlm_sequence_terms(params, config, h, b["mlm_positions"], b["mlm_ids"], b["mlm_weights"])

  return jax.jit(terms)


def heldout_sequence_losses(params: Any, config, batches: Sequence[dict]) -> dict[str, Any]:
  """Each held-out sequence's summed MLM loss and masked-token count, in batch order.

  The items a bootstrap over held-out sequences resamples: a model's loss on a resample is
  its `loss_sum` over the resampled sequences divided by their `masked` tokens (on all of
  them, `heldout_mlm_loss`'s value up to float rounding); runs scored on the same batches are
  paired sequence by sequence.

  Returns:
    `loss_sum` (nats, rounded to 4 decimals, which keeps the result files small) and
    `masked` (ints), one per sequence.
  """
  fn = _sequence_terms(config.replace(dtype="float32"))
  got = [jax.device_get(fn(params, b)) for b in batches]
  loss = np.concatenate([np.asarray(g["loss_sum"], np.float64) for g in got])
  masked = np.concatenate([np.asarray(b["mlm_weights"]).sum(-1) for b in batches])
  return {"loss_sum": np.round(loss, 4), "masked": np.rint(masked).astype(np.int64)}


def heldout_sequence_items(runs: Sequence[dict], data_stats: dict) -> np.ndarray | None:
  """Per held-out sequence, each run's summed MLM loss, the unigram loss's and the masked
  tokens, (sequences, len(runs) + 2): the items a bootstrap over held-out sequences resamples
  (`heldout_losses` makes the losses of a resample); None where the runs or `data_stats`
  (`load_wikitext`'s `stats`) predate keeping them.

  Raises:
    ValueError: the runs were scored on different held-out sequences.
  """
  unigram = data_stats.get("heldout_sequence_unigram_loss_sum")
  if unigram is None or any("heldout_sequences" not in r for r in runs):
    return None
  masked = [np.asarray(r["heldout_sequences"]["masked"]) for r in runs]
  if any(m.shape != masked[0].shape or np.any(m != masked[0]) for m in masked):
    raise ValueError("the runs were scored on different held-out sequences")
  sums = [r["heldout_sequences"]["loss_sum"] for r in runs]
  return np.asarray([*sums, unigram, masked[0]], np.float64).T


def heldout_losses(items: np.ndarray) -> np.ndarray:
  """The held-out losses of `heldout_sequence_items`' runs, then the unigram loss, on
  resampled items `(..., sequences, k + 2)`: `(k + 1, ...)`, each a sum over the sequences
  divided by their masked tokens."""
  total = np.asarray(items, np.float64).sum(-2)
  return np.moveaxis(total[..., :-1] / total[..., -1:], -1, 0)


def final_params(out_dir: pathlib.Path, train, heads: tuple[str, ...]) -> Any:
  """The parameters of the newest checkpoint the loop wrote in `out_dir`."""
  from bertjax.model.forward import init
  from bertjax.training import checkpoint as ckpt_lib
  from bertjax.training.state import create_train_state

  tx, _ = train.make_optimizer()

  def template(meta):
    cfg = ckpt_lib.config_from_json(meta["config"])
    return jax.eval_shape(lambda: create_train_state(init(cfg, 0, heads), tx, train.seed))

  ckpt = ckpt_lib.Checkpointer(out_dir / "checkpoints", max_to_keep=None, async_save=False)
  try:
    restored = ckpt.restore_latest(template)
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"the loop wrote no checkpoint in {out_dir}")
  return restored[0].params


def train_run(
  label: str,
  config,
  data: PretrainingData,
  train,
  eval_batches: Sequence[dict],
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """One `loop.pretrain` run with per-step timing and the final model's held-out loss.

  Args:
    label: the run's name (for logs).
    config: the final model config.
    data: the data (a fresh iterator at step 0 is made from it).
    train: the `TrainConfig` (its `output_dir` is replaced by a temporary directory).
    eval_batches: fixed held-out batches.
    log: called with a one-line summary of the run (None: nothing is said).

  Returns:
    Per-step `mlm_loss`, `layers`, `cost_s` (compile excluded), `raw_cost_s`,
    `loop_step_s` (the loop's own step time), `compile_s` per stage, totals, load averages,
    `heldout` and `heldout_sequences` (`heldout_sequence_losses`, paired across runs on
    the same `eval_batches`).
  """
  from bertjax.training import loop

  it = TimedIterator(data.iterator(train.batch_size, train.seed))
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory(prefix="bertjax-run-") as tmp:
    run = dataclasses.replace(
      train, output_dir=tmp, checkpoint_every=0, keep=1, async_checkpoint=False, progress=False
    )
    t0 = time.perf_counter()
    summary = loop.pretrain(config, it, run)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    params = final_params(pathlib.Path(tmp), run, ("mlm",))
  hist = summary["history"]
  loop_dt = np.asarray(it.tokens, np.float64) / np.asarray([r["tokens_per_s"] for r in hist])
  # Step k's cost: from handing over batch k to asking for batch k+1 (the step, the loop's
  # logging and any growth before the next step); the last step has only its own time.
  gaps = np.asarray(it.enter[1:]) - np.asarray(it.exit[:-1])
  raw = np.append(gaps, loop_dt[-1])
  layers = [r["layers"] for r in hist]
  split = step_costs(raw, layers)
  heldout = heldout_mlm_loss(params, config, eval_batches)
  sequences = heldout_sequence_losses(params, config, eval_batches)
  data_s = float(np.sum(np.asarray(it.exit) - np.asarray(it.enter)))
  res = {
    "label": label,
    "stacking": train.stacking,
    "mlm_loss": [r["mlm_loss"] for r in hist],
    "layers": layers,
    "learning_rate": [r["learning_rate"] for r in hist],
    "cost_s": split["cost_s"],
    "raw_cost_s": raw,
    "loop_step_s": loop_dt,
    "compile_s": split["compile_s"],
    "stage_starts": split["stage_starts"],
    "stage_layers": split["stage_layers"],
    "total_s": float(split["cost_s"].sum()),
    "total_with_compile_s": float(raw.sum()),
    "data_loading_s": data_s,
    "pretrain_wall_s": wall,
    "loadavg_before": load_before,
    "loadavg_after": load_after,
    "heldout": heldout,
    "heldout_sequences": sequences,
    "final_train_mlm_loss": hist[-1]["mlm_loss"],
  }
  if log is not None:
    log(
      f"{label}: {len(hist)} steps, {res['total_s']:.1f}s compute + "
      f"{sum(res['compile_s']):.1f}s compile, held-out MLM {heldout['mlm_loss']:.4f}, "
      f"load {load_before[0]:.1f}->{load_after[0]:.1f}"
    )
  return res


# Comparing runs: time to a target loss ------------------------------------------------


def time_to_reach(times: Sequence[float], values: Sequence[float], target: float) -> float | None:
  """The first time at which `values <= target`, or None if never.

  Args:
    times: cumulative time at the end of each step.
    values: the (smoothed) loss after each step.
    target: the loss to reach.
  """
  times, values = np.asarray(times, np.float64), np.asarray(values, np.float64)
  if times.shape != values.shape:
    raise ValueError(f"times {times.shape} and values {values.shape} must have the same shape")
  hit = np.flatnonzero(values <= target)
  return float(times[hit[0]]) if hit.size else None


def interleaved_step_times(
  config, data: PretrainingData, train, depths: Sequence[int], rounds: int
) -> dict[int, list[float]]:
  """Seconds per train step at each depth, timed in turns (A, B, A, B, ...).

  The library's train step (the one `loop.pretrain` runs) is compiled once per depth, then
  the depths take turns on the same batches, so a change in machine load hits them alike
  and the ratio of their medians is robust to it.

  Args:
    config: the model config (its depth is replaced by each of `depths`).
    data: the data (the first `rounds` batches are used).
    train: the `TrainConfig` (optimizer and schedule).
    depths: the layer counts to time.
    rounds: steps per depth.

  Returns:
    `{depth: [seconds of each step]}` (compile excluded).
  """
  from bertjax.model.forward import init
  from bertjax.training.state import create_train_state
  from bertjax.training.step import make_train_step

  tx, schedule = train.make_optimizer()
  it = data.iterator(train.batch_size, train.seed)
  batches = [next(it) for _ in range(rounds)]
  steps, states = {}, {}
  for n in depths:
    cfg = config.replace(num_hidden_layers=n, dtype=train.dtype)
    steps[n] = make_train_step(cfg, tx, schedule, task="pretrain", objective="none")
    states[n] = create_train_state(init(cfg, train.seed, ("mlm",)), tx, train.seed)
    states[n], m = steps[n](states[n], batches[0])  # compiles
    jax.device_get(m)
  times: dict[int, list[float]] = {n: [] for n in depths}
  for batch in batches:
    for n in depths:
      t0 = time.perf_counter()
      states[n], m = steps[n](states[n], batch)
      jax.device_get(m)
      times[n].append(time.perf_counter() - t0)
  return times


def compare_runs(
  baseline: dict, stacked: dict, window: int, step_price: dict[int, float] | None = None
) -> dict[str, Any]:
  """Time for `stacked` to reach `baseline`'s final smoothed loss, over baseline's time.

  Args:
    baseline, stacked: `train_run` results.
    window: trailing-mean window of the training MLM loss.
    step_price: if given, seconds per step by depth (replaces measured step times).

  Returns:
    `target`, `t_reach_s` (None if never), `baseline_s`, `ratio` (None if never), the same
    with compile time included (`ratio_with_compile`), `reach_step`, and
    `baseline_reach_step`: when the baseline itself first got there (a plateau shows as a
    step well before its last).
  """

  def times(run, with_compile=False):
    if step_price is not None:
      c = np.asarray([step_price[n] for n in run["layers"]])
      if with_compile:
        c = c.copy()
        for s, x in zip(run["stage_starts"], run["compile_s"]):
          c[s] += x
      return np.cumsum(c)
    return np.cumsum(run["raw_cost_s"] if with_compile else run["cost_s"])

  base_s = stats.trailing_mean(baseline["mlm_loss"], window)
  stack_s = stats.trailing_mean(stacked["mlm_loss"], window)
  target = float(base_s[-1])
  out = {"target_smoothed_mlm_loss": target, "stacked_final_smoothed_mlm_loss": float(stack_s[-1])}
  for suffix, wc in (("", False), ("_with_compile", True)):
    tb, ts = times(baseline, wc), times(stacked, wc)
    reach = time_to_reach(ts, stack_s, target)
    out[f"baseline_s{suffix}"] = float(tb[-1])
    out[f"stacked_total_s{suffix}"] = float(ts[-1])
    out[f"t_reach_s{suffix}"] = reach
    out[f"ratio{suffix}"] = None if reach is None else reach / float(tb[-1])
  hit = np.flatnonzero(stack_s <= target)
  out["reach_step"] = int(hit[0]) + 1 if hit.size else None
  out["baseline_reach_step"] = int(np.flatnonzero(base_s <= target)[0]) + 1
  return out


def step_times_by_depth(runs: Sequence[dict]) -> dict[int, list[float]]:
  """The compile-free step times of `runs`, grouped by the depth each step ran at."""
  by_depth: dict[int, list[float]] = {}
  for r in runs:
    for n, c in zip(r["layers"], r["cost_s"]):
      by_depth.setdefault(int(n), []).append(float(c))
  return by_depth


def median_step_prices(runs: Sequence[dict]) -> dict[int, float]:
  """Load-robust pricing: the median compile-free step time of each depth over `runs`."""
  return {n: float(np.median(v)) for n, v in step_times_by_depth(runs).items()}


def priced_ratio(baseline: dict, stacked: dict, window: int, prices: dict[int, Any]):
  """`compare_runs`' ratio with `step_price` (compile excluded), vectorized over prices.

  Args:
    baseline, stacked: `train_run` results (their losses and depth per step).
    window: trailing-mean window of the training MLM loss.
    prices: seconds per step by depth, each a number or an array (one per resample).

  Returns:
    The time the stacked run takes to reach the baseline's final smoothed loss over the
    baseline's, each step at its depth's price (a float or an array shaped as the prices),
    or None where it never reaches it (which step it reaches it at does not depend on the
    prices).
  """
  target = stats.trailing_mean(baseline["mlm_loss"], window)[-1]
  hit = np.flatnonzero(stats.trailing_mean(stacked["mlm_loss"], window) <= target)
  if not hit.size:
    return None

  def spent(layers):
    depths, steps = np.unique(np.asarray(layers, int), return_counts=True)
    return sum(np.asarray(prices[int(n)], np.float64) * k for n, k in zip(depths, steps))

  return spent(stacked["layers"][: hit[0] + 1]) / spent(baseline["layers"])


def priced_resamples(
  baseline: dict,
  stacked: dict,
  window: int,
  samples: dict[int, Sequence[float]],
  *,
  paired: bool = False,
  resamples: int = 2000,
  seed: int = 0,
):
  """`priced_ratio` on bootstrap resamples of the step times that price it: each depth's
  median of `samples` on each resample (`resampled_medians`, which says what `paired` does).

  Returns:
    (resamples,) ratios, or None where the stacked run never reaches the baseline's loss.
  """
  prices = resampled_medians(samples, paired=paired, resamples=resamples, seed=seed)
  return priced_ratio(baseline, stacked, window, prices)


def resampled_estimates(record: dict, window: int, *, resamples: int = 2000) -> list[dict]:
  """The stacking comparison's time ratios as `record` holds them (`estimates_record`'s fields,
  `runs` and `variation`), the priced ones also on bootstrap resamples of their step times.

  Returns:
    One dict per stacked run compared (the first stacked run; the variation's, where one ran)
    with `measured`, its ratios as measured (one run each: nothing to resample), `priced`,
    `{name: the ratio as recorded}`, and `resampled`, `{name: (resamples,) ratios}` (None
    where never reached): "priced" over each depth's steps of the runs it was priced at,
    resampled on their own (`median_step_prices`), "interleaved" over the interleaved
    rounds, resampled together.
  """
  runs, v = record["runs"], record.get("variation")
  abba = runs[:-1] if v is not None else runs
  turns = {int(k): x for k, x in record["interleaved_step_s"].items()}
  boot = functools.partial(priced_resamples, runs[0], window=window, resamples=resamples)
  out = [
    {
      "measured": [c["ratio"] for c in record["ratio_per_repeat"]],
      "priced": {k: record[f"ratio_{k}"]["ratio"] for k in ("priced", "interleaved")},
      "resampled": {
        "priced": boot(runs[1], samples=step_times_by_depth(abba), seed=1),
        "interleaved": boot(runs[1], samples=turns, paired=True),
      },
    }
  ]
  if v is not None:
    out.append(
      {
        "measured": [c["ratio"] for c in v["vs_each_baseline"]],
        "priced": {"priced": v["priced"]["ratio"]},
        "resampled": {"priced": boot(runs[-1], samples=step_times_by_depth(runs), seed=1)},
      }
    )
  return out


def resampled_medians(
  samples: dict[int, Sequence[float]], *, paired: bool, resamples: int = 2000, seed: int = 0
) -> dict[int, np.ndarray]:
  """Each depth's median step time on bootstrap resamples of its timed steps.

  Args:
    samples: `{depth: seconds of each timed step}`.
    paired: resample the steps of every depth together (step i of each depth timed in one
      round, as `interleaved_step_times` times them; `stats.bootstrap_ci`'s resamples);
      else each depth's steps on their own (independent samples, in the order given).
    resamples, seed: how many resamples, and their seed.

  Returns:
    `{depth: (resamples,) medians}`.
  """
  rng = np.random.default_rng(seed)
  x = {n: np.asarray(v, np.float64) for n, v in samples.items()}
  if paired:
    sizes = {len(v) for v in x.values()}
    if len(sizes) != 1:
      raise ValueError(f"paired samples need one size per depth, got {sizes}")
    n = sizes.pop()
    idx = rng.integers(0, n, (resamples, n))
    return {n: np.median(v[idx], 1) for n, v in x.items()}
  return {n: np.median(v[rng.integers(0, len(v), (resamples, len(v)))], 1) for n, v in x.items()}


def abba_runs(
  config, data: PretrainingData, train, schedule: str, *, repeats: int = 2, log=None
) -> list[dict]:
  """The full-depth baseline (`train`) and the stacked run (`train` with `stacking=schedule`)
  as `train_run`s, labelled "baseline#1", "stacked#1", ...: for `repeats=2` in the order
  baseline, stacked, stacked, baseline (ABBA, so that a linear drift in the machine's load
  cancels), for 1 baseline, stacked."""
  if repeats not in (1, 2):
    raise ValueError(f"repeats={repeats} must be 1 (baseline, stacked) or 2 (ABBA)")
  order = ["baseline", "stacked"] + (["stacked", "baseline"] if repeats > 1 else [])
  runs, counts = [], {"baseline": 0, "stacked": 0}
  for kind in order:
    counts[kind] += 1
    tc = train if kind == "baseline" else dataclasses.replace(train, stacking=schedule)
    runs.append(train_run(f"{kind}#{counts[kind]}", config, data, tc, data.eval_batches, log=log))
  return runs


def time_ratio_estimates(
  runs: Sequence[dict],
  config,
  data: PretrainingData,
  train,
  *,
  window: int,
  depths: tuple[int, int],
  rounds: int,
  log=None,
) -> dict[str, Any]:
  """Every estimate of the stacked run's time to the baseline's final loss over the
  baseline's (`compare_runs`, loss smoothed over `window` steps), from `abba_runs`' runs: per
  repeat as measured; every step priced at the median step time of its depth over all runs
  (`median_step_prices`); and priced at step times of the `depths` (shallow, full) measured in
  turns after the runs (`interleaved_step_times`, `rounds` each), which a change in load hits
  alike.

  Returns:
    `per_repeat`, `priced`, `turns`, `turn_price`, `interleaved`, `ratios` (every estimate's
    ratio, None where the target was never reached) and `determinism`: the largest loss
    difference between repeats, which draw the same batches, masks and dropout (None for one
    repeat).
  """
  base = [r for r in runs if r["label"].startswith("baseline")]
  stack = [r for r in runs if r["label"].startswith("stacked")]
  per_repeat = [compare_runs(b, s, window) for b, s in zip(base, stack, strict=True)]
  priced = compare_runs(base[0], stack[0], window, step_price=median_step_prices(runs))
  turns = interleaved_step_times(config, data, train, depths, rounds)
  turn_price = {n: float(np.median(v)) for n, v in turns.items()}
  interleaved = compare_runs(base[0], stack[0], window, step_price=turn_price)
  if log:
    log(f"interleaved step times {turn_price}: ratio {interleaved['ratio']}")
  determinism = None
  if len(base) > 1:
    determinism = max(
      float(np.max(np.abs(np.subtract(a["mlm_loss"], b["mlm_loss"])))) for a, b in (base, stack)
    )
  return {
    "per_repeat": per_repeat,
    "priced": priced,
    "turns": turns,
    "turn_price": turn_price,
    "interleaved": interleaved,
    "ratios": [c["ratio"] for c in per_repeat] + [priced["ratio"], interleaved["ratio"]],
    "determinism": determinism,
  }


TIMING_METHOD = (
  "per-step time = from handing over batch k to asking for batch k+1 "
  "(step, logging, growth), data loading excluded; compile = first step of each "
  "stage minus the stage's median step, removed from the curves and reported; "
  "smoothed loss = trailing {window}-step mean of the training MLM loss "
  "(same batches and masks in every run); target = baseline's final smoothed "
  "loss; ratio = first time the stacked smoothed loss <= target / baseline "
  "total time; 'priced' prices each step at the median step time of its depth "
  "over all runs (robust to load spikes); 'interleaved' at the median of steps "
  "of each depth timed in turns after the runs (robust to load drift)"
)


def estimates_record(runs: Sequence[dict], est: dict[str, Any], window: int) -> dict[str, Any]:
  """`abba_runs`' runs and their `time_ratio_estimates` `est` as the stacking experiment's
  result file records them: how they were timed ("approach": the run order and
  `TIMING_METHOD`), each estimate ("ratio_per_repeat", "ratio_priced", "ratio_interleaved"),
  the step times behind them, the repeats' largest loss difference, and each run's held-out
  loss and compile time."""
  order = ", ".join(r["label"] for r in runs)
  return {
    "approach": f"one process; runs in the order {order}; " + TIMING_METHOD.format(window=window),
    "ratio_per_repeat": est["per_repeat"],
    "ratio_priced": est["priced"],
    "ratio_interleaved": est["interleaved"],
    "interleaved_step_s": est["turns"],
    "interleaved_median_step_s": est["turn_price"],
    "median_step_s_by_depth": median_step_prices(runs),
    "repeat_max_abs_loss_diff": est["determinism"],
    "heldout_mlm_loss": {r["label"]: r["heldout"] for r in runs},
    "compile_s": {r["label"]: r["compile_s"] for r in runs},
  }


def stage_variation(
  runs: list[dict],
  per_repeat: Sequence[dict],
  config,
  data: PretrainingData,
  train,
  *,
  shallow: int,
  window: int,
  log=None,
) -> dict[str, Any]:
  """One more stacked run with another shallow-stage length, for when the stacked run of
  `abba_runs` missed: a run that never reached the baseline's loss (a `per_repeat` ratio of
  None) gets a shorter shallow stage (30% of the steps), one that reached it too late a
  longer one (70%). `shallow` is the first stage's depth; the run grows to `config`'s.

  Appends the run, labelled "variation#1", to `runs`.

  Returns:
    `schedule`, `why`, `shallow_fraction`, `vs_each_baseline` (`compare_runs` against each
    baseline repeat, as measured) and `priced` (against the first baseline, every step
    priced at `median_step_prices` of all runs).
  """
  base = [r for r in runs if r["label"].startswith("baseline")]
  never = any(c["ratio"] is None for c in per_repeat)
  fraction = 0.3 if never else 0.7
  schedule = f"{shallow}:{round(train.steps * fraction)},{config.num_hidden_layers}"
  tc = dataclasses.replace(train, stacking=schedule)
  run = train_run("variation#1", config, data, tc, data.eval_batches, log=log)
  runs.append(run)
  return {
    "schedule": schedule,
    "why": "never reached the target: shorter shallow stage"
    if never
    else "reached it too late: longer shallow stage",
    "shallow_fraction": fraction,
    "vs_each_baseline": [compare_runs(b, run, window) for b in base],
    "priced": compare_runs(base[0], run, window, step_price=median_step_prices(runs)),
  }


def stacking_comparison(
  config,
  data: PretrainingData,
  train,
  *,
  shallow: int,
  shallow_steps: int,
  repeats: int,
  window: int,
  rounds: int,
  judge: Callable[[Sequence[float | None]], str],
  log=None,
) -> dict[str, Any]:
  """The whole stacking comparison: `abba_runs` of a baseline at `config`'s depth and a run
  stacked from `shallow` layers after `shallow_steps` steps, `time_ratio_estimates` of its time
  ratio, and, unless `judge` (the estimates' ratios -> "yes", "partly", ...) says "yes", one
  `stage_variation` judged the same way.

  Returns:
    `runs` (every run, the variation's last), `schedule`, `estimates`, `verdict` and
    `variation` (None, or `stage_variation`'s result with its own `verdict`).
  """
  schedule = f"{shallow}:{shallow_steps},{config.num_hidden_layers}"
  runs = abba_runs(config, data, train, schedule, repeats=repeats, log=log)
  depths = (shallow, config.num_hidden_layers)
  kw = {"window": window, "depths": depths, "rounds": rounds, "log": log}
  est = time_ratio_estimates(runs, config, data, train, **kw)
  verdict, variation = judge(est["ratios"]), None
  if verdict != "yes":
    variation = stage_variation(
      runs, est["per_repeat"], config, data, train, shallow=shallow, window=window, log=log
    )
    measured = [c["ratio"] for c in variation["vs_each_baseline"]]
    variation["verdict"] = judge([*measured, variation["priced"]["ratio"]])
  return {
    "runs": runs,
    "schedule": schedule,
    "estimates": est,
    "verdict": verdict,
    "variation": variation,
  }
