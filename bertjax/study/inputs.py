"""A study's data: the real data sets' folders, WikiText-2 windows, and the MLM head a
checkpoint without one is given."""

from __future__ import annotations

import os
import pathlib
import sys

from bertjax.study.command import UsageError, log, timed
from bertjax.study.results import model_tag
from bertjax.study.sizes import PretrainScale


def smoke_data_dir() -> pathlib.Path:
  """The small samples shipped in the package for `--smoke` runs, laid out as a data directory."""
  from bertjax.data.fetch import smoke_dir

  return smoke_dir()


def data_dir(arg: str | None, *need: str) -> pathlib.Path:
  """The data directory holding the sets in `need` (folder names such as "blimp").

  Looks in `arg` (`--data-dir`) alone when given, else in `$BERTJAX_DATA_DIR` (or the user
  cache), then `../shared/data` (`bertjax.data.fetch.find_root`).

  Raises:
    bertjax.data.fetch.DataNotFoundError: no directory holds them (a FileNotFoundError whose
      message names where it looked and the `bertjax data fetch NAME` command).
  """
  from bertjax.data.fetch import find_root

  return find_root(arg, need)


def ud_file(data: pathlib.Path, split: str = "dev") -> pathlib.Path:
  """UD English EWT's `.conllu` file for `split` ("train", "dev" or "test")."""
  from bertjax.data.fetch import DataNotFoundError

  hits = sorted((data / "ud_english_ewt").rglob(f"*-ud-{split}.conllu"))
  if not hits:
    raise DataNotFoundError(
      f"no *-ud-{split}.conllu under {data / 'ud_english_ewt'}; run `bertjax data fetch "
      f"ud_english_ewt` (the dev split) or pass --data-dir DIR"
    )
  return hits[0]


def load_wikitext(args, sc: PretrainScale, timings: dict[str, float]):
  """WikiText-2 for a pretraining experiment at the sizes of `sc`, from `--data-dir` (timed
  as "data"): `bertjax.training.runs.load_wikitext`'s `PretrainingData`."""
  from bertjax.training import runs

  with timed(timings, "data"):
    root = data_dir(args.data_dir, "wikitext2_tokens")
    return runs.load_wikitext(
      root,
      vocab=sc.vocab,
      seq_len=sc.seq_len,
      eval_batches=sc.eval_batches,
      batch=sc.batch,
      seed=args.seed,
      max_lines=sc.max_lines,
    )


def wikitext_windows(
  tok, config, data: pathlib.Path, split: str, limit: int, batch_size: int, length: int = 128
):
  """The first `limit` windows of up to `length` tokens (at most the model's) of WikiText-2's
  `split` ("valid" or "test") paragraphs, in batches (`text_batches.window_batches`)."""
  from bertjax.tasks import passages, text_batches

  texts = passages.wikitext_paragraphs(data / "wikitext2_tokens" / f"{split}.txt")
  return text_batches.window_batches(
    tok, texts, max_length=min(length, config.max_length), batch_size=batch_size, limit=limit
  )


def masked_windows(tok, config, batches, seed: int):
  """BERT's masking of `batches` with the tokenizer's ids (`mlm_head.mask_batches`)."""
  from bertjax.training import mlm_head

  if tok.mask_id is None:
    raise UsageError("the tokenizer has no mask token, so nothing can be masked")
  return mlm_head.mask_batches(
    batches,
    mask_id=tok.mask_id,
    special_ids=tok.special_ids,
    vocab_size=config.vocab_size,
    seed=seed,
  )


def head_source(head: dict) -> str:
  """Which MLM head a result read, in words (`with_mlm_head`'s `head`)."""
  if head["source"] == "the checkpoint's":
    return "the checkpoint's own MLM head"
  stopped = (
    f" and {head['stop_loss']:.2f} on {head['stop_predictions']:,} held out to stop on, step "
    f"{head['best_step']} of {head['steps']} kept"
    if "best_step" in head
    else ""
  )
  return (
    "an MLM head fitted to the frozen body, as the checkpoint ships none: "
    f"{head['fit_predictions']:,} WikiText-2 validation predictions, loss "
    f"{head['fit_loss']:.2f} nats on them{stopped}"
  )


MLM_HEAD_CACHE = 2  # the fitted heads' cache version: raise it when the fit changes


def _mlm_head_cache(args, params, windows: int, steps: int) -> pathlib.Path | None:
  """Where a fitted head of a full run is kept (the user cache), named by the model, a hash
  of its weights and the fit's settings, so the experiments that read the same model's head
  fit it once; None for a smoke run."""
  if args.smoke:
    return None
  import hashlib

  import jax
  import numpy as np

  from bertjax.data.fetch import user_cache_dir

  digest = hashlib.blake2b(digest_size=8)
  for leaf in jax.tree.leaves(params):
    digest.update(np.ascontiguousarray(leaf).tobytes())
  tag = model_tag(args.model) or "all-MiniLM-L6-v2"
  name = f"{tag}-{digest.hexdigest()}-w{windows}-s{steps}-seed{args.seed}-v{MLM_HEAD_CACHE}.npz"
  return user_cache_dir().parent / "mlm_heads" / name


def with_mlm_head(args, params, config, tok, data: pathlib.Path, timings, *, windows, steps):
  """`(params, head)`: the model with the checkpoint's MLM head, or, for a checkpoint that
  ships none, with one fitted to its frozen body (`bertjax.training.mlm_head.fit_mlm_head`,
  timed as "MLM head fit"; a full run's fitted head is kept in the user cache and read back by
  the next run). Of `windows` WikiText-2 validation windows, the last eighth is held out for
  early stopping (the loss checked every 50 of the `steps` steps, the best head kept) and the
  rest is fitted. `head` says which ("source") and, for a fitted one, on how many predictions,
  its loss there and on the held-out ones, and the step kept."""
  import json

  import numpy as np
  from flax import traverse_util

  from bertjax.training import mlm_head

  if "mlm" in params:
    return params, {"source": "the checkpoint's"}
  if "mlm" not in config.family.heads:
    raise UsageError(f"a {config.model_type} model has no masked-LM head")
  cache = _mlm_head_cache(args, params, windows, steps)
  if cache is not None and cache.exists():
    with np.load(cache) as f:
      head = traverse_util.unflatten_dict({tuple(k.split("/")): f[k] for k in f.files if k != "_"})
      info = json.loads(str(f["_"]))
    log(f"MLM head read from {cache}")
    return {**params, "mlm": head}, info
  with timed(timings, "MLM head fit"):
    size = min(32, max(1, windows // 8))  # at least 8 batches, one of them held out
    batches = wikitext_windows(tok, config, data, "valid", windows, size)
    masked = masked_windows(tok, config, batches, args.seed)
    if len(masked) < 2:
      raise UsageError(f"--mlm-windows={windows} leaves no held-out windows to stop on")
    stop = max(1, len(masked) // 8)
    params, fitted = mlm_head.fit_mlm_head(
      params,
      config,
      masked[:-stop],
      held_out=masked[-stop:],
      steps=steps,
      eval_every=min(50, steps),
      seed=args.seed,
      progress=sys.stderr.isatty(),
    )
  info = {
    "source": "fitted to the frozen body",
    "fit_predictions": fitted["fit"]["predictions"],
    "fit_loss": fitted["fit"]["loss"],
    "stop_predictions": fitted["held_out"]["predictions"],
    "stop_loss": fitted["held_out"]["loss"],
    "best_step": fitted["best_step"],
    "steps": steps,
  }
  log(
    f"MLM head fitted: loss {info['fit_loss']:.3f} on {info['fit_predictions']:,} predictions, "
    f"{info['stop_loss']:.3f} on {info['stop_predictions']:,} held out (step "
    f"{info['best_step']} of {steps} kept)"
  )
  if cache is not None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    flat = traverse_util.flatten_dict(params["mlm"], sep="/")
    part = cache.with_suffix(".part.npz")
    np.savez(part, _=json.dumps(info), **{k: np.asarray(v) for k, v in flat.items()})
    os.replace(part, cache)
  return params, info
