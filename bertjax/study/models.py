"""The model a study analyses: `--model`, the built-in all-MiniLM-L6-v2, or a tiny random
stand-in for `--smoke` runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from bertjax.study.command import DEFAULT_MODEL, UsageError, log


def special_tokens(tok) -> dict[str, str]:
  """The tokens that play BERT's [CLS], [SEP] and [MASK] in `tok`'s vocabulary (MPNet's
  `<s>`, `</s>`, `<mask>`): the experiments find them by role (`tok.cls_id`, ...), never by
  BERT's strings."""
  inverse = {i: t for t, i in tok.tokenizer.get_vocab().items()}
  roles = {"[CLS]": tok.cls_id, "[SEP]": tok.sep_id, "[MASK]": tok.mask_id}
  return {role: inverse.get(i, "") for role, i in roles.items() if i is not None}


def describe_model(model: str, depth: int) -> str:
  """What the analysed model is, for a row's "differs from the paper" note: how it was
  trained and how it differs from BERT-base (which the papers measured)."""
  low = model.lower()
  if "minilm" in low:
    return (
      f"{model} is a {depth}-layer model distilled from a larger one (MiniLM) and "
      "trained further for sentence embeddings (a contrastive loss on its mean-pooled "
      "last layer), not BERT-base"
    )
  if "mpnet" in low:
    return (
      f"{model} has BERT-base's shape ({depth} layers x 12 heads) but is not BERT: "
      "MPNet, pre-trained by permuted language modelling with a relative-position bias "
      "in every layer's attention, then trained further for sentence embeddings (a "
      "contrastive loss on its mean-pooled last layer)"
    )
  if "bert-base" in low:
    return ""
  return f"{model} is a different model ({depth} layers), not BERT-base"


def minilm():
  """(config, params, tokenizer) of the built-in real checkpoint, all-MiniLM-L6-v2."""
  import bertjax

  path = bertjax.minilm_path()
  config, params = bertjax.from_hf(path)
  return config, params, bertjax.Tokenizer.from_pretrained(path)


def pretrained(model: str | os.PathLike):
  """(config, params, tokenizer, name) of a Hugging Face directory or hub id, any family."""
  import bertjax

  try:
    config, params = bertjax.from_hf(model)
    tok = bertjax.Tokenizer.from_pretrained(model)
  except (OSError, ValueError) as e:  # no such directory, no network, an unknown family, ...
    raise UsageError(f"--model {model}: {e}") from e
  if tok.vocab_size > config.vocab_size:
    raise UsageError(
      f"--model {model}: its tokenizer has {tok.vocab_size} tokens but the "
      f"model's vocab_size={config.vocab_size}"
    )
  log(
    f"model: {model} ({config.model_type}, {config.depth} layers x "
    f"{config.num_attention_heads} heads, hidden {config.hidden_size})"
  )
  return config, params, tok, str(model)


# The tiny random model that stands in for a trained one in `--smoke` runs.
SMOKE_MODEL = {
  "hidden_size": 32,
  "num_hidden_layers": 2,
  "num_attention_heads": 2,
  "intermediate_size": 64,
}


def tiny_model(
  seed: int = 0, name: str = "random 2x32 (smoke)", *, preset: str | None = None, **config: Any
):
  """(config, params, tokenizer, name): a random-weight BERT over all-MiniLM-L6-v2's vocabulary.

  Args:
    seed: the parameters' seed.
    name: what the results call the model.
    preset: a `BertConfig.preset` name to start from; None: `BertConfig`'s defaults.
    **config: `BertConfig` fields (default: `SMOKE_MODEL`, 2 layers of width 32).
  """
  import bertjax

  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  fields = {"vocab_size": tok.vocab_size, **(config or ({} if preset else SMOKE_MODEL))}
  cfg = bertjax.BertConfig.preset(preset, **fields) if preset else bertjax.BertConfig(**fields)
  return cfg, bertjax.init(cfg, seed), tok, name


def tiny_stand_in(name: str) -> Callable[[], tuple]:
  """`load_model`'s `smoke` for analyses that read a grid of heads: `tiny_model` of the "tiny"
  preset (4 heads, 64 wide) at 2 layers and 512 positions, called `name`."""
  return lambda: tiny_model(
    0, name, preset="tiny", num_hidden_layers=2, max_position_embeddings=512
  )


def finetune_model(
  args,
  task: str,
  num_labels: int,
  *,
  smoke: dict[str, Any],
  seed: int,
  label_names=None,
  tok=None,
):
  """(config, params, tokenizer, name): the model a fine-tuning experiment starts from, with a
  fresh `task` head of `num_labels` outputs (`finetune.prepare_model`): `--model` when given,
  else with `--smoke` a random BERT of the `smoke` fields over all-MiniLM-L6-v2's vocabulary,
  else all-MiniLM-L6-v2. `tok`: that model's tokenizer when the caller has already loaded it.

  Raises:
    UsageError: `--model` cannot be loaded.
  """
  import bertjax
  from bertjax.training import finetune as ft

  source = args.model or bertjax.minilm_path()
  kw = {"seed": seed, "label_names": label_names}
  try:
    tok = bertjax.Tokenizer.from_pretrained(source) if tok is None else tok
    if args.smoke and not args.model:
      tiny = bertjax.BertConfig(vocab_size=tok.vocab_size, **smoke)
      config, params = ft.prepare_model(task, num_labels, config=tiny, **kw)
      return config, params, tok, "tiny random BERT (smoke stand-in)"
    config, params = ft.prepare_model(task, num_labels, init_from=source, **kw)
  except (OSError, ValueError) as e:  # no such directory, no network, an unknown family, ...
    raise UsageError(f"--model {args.model}: {e}") from e
  if tok.vocab_size > config.vocab_size:  # as `pretrained` checks
    raise UsageError(
      f"--model {args.model}: its tokenizer has {tok.vocab_size} tokens but the "
      f"model's vocab_size={config.vocab_size}"
    )
  return config, params, tok, str(args.model or DEFAULT_MODEL)


def load_model(args, smoke=None):
  """(config, params, tokenizer, name): the model an experiment analyses.

  `--model DIR_OR_ID` when given (`pretrained`); else, for `--smoke`, `smoke()` (returning
  the same four; default: `tiny_model(args.seed)`); else the built-in all-MiniLM-L6-v2.
  """
  if getattr(args, "model", None):
    return pretrained(args.model)
  if args.smoke:
    return smoke() if smoke is not None else tiny_model(args.seed)
  return (*minilm(), "all-MiniLM-L6-v2")
