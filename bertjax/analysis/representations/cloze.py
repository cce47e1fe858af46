"""Cloze probes for masked language models.

* LAMA (Petroni et al. 2019): fill in ``[MASK]`` with the object; P@1 and P@10
  over queries whose object is a single token of the vocabulary.
* Ettinger (2020), "What BERT is not": NEG-136 (SIMP and NAT), ROLE-88 and
  CPRAG-102. Accuracy is top-k accuracy of the expected completion at the
  ``[MASK]`` after the context; sensitivity compares the probabilities of good
  and bad completions (details at each function).
* BLiMP (Warstadt et al. 2020) minimal pairs scored by pseudo-log-likelihood
  (Salazar et al. 2020): ``PLL(s) = sum_t log P(w_t | s with w_t masked)``; a
  sentence's masked copies all run in one batched, jitted call.

Everything is written against a ``MaskedLM``: a pure, jittable function
``fn(params, input_ids, attention_mask, token_type_ids, positions) -> log-probs
(B, V)`` at one position per row, plus its params (passed as data, not baked
into the compiled program). ``masked_lm(params, config)`` builds one from a
model with an MLM head, and every probe also takes the ``(config, params)`` pair that
``from_hf`` returns; tests can wrap any function of that shape.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax.analysis.representations.features import bucket_width

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------
# The model side


@dataclasses.dataclass(frozen=True, eq=False)
class MaskedLM:
  """A masked LM as a static function and its parameters.

  Attributes:
    fn: ``fn(params, input_ids, attention_mask, token_type_ids, positions)`` ->
      ``(B, V)`` log-probabilities at ``positions[b]``; hashable (a static jit argument).
    params: its parameter pytree (may be None).
  """

  fn: Callable[..., jax.Array]
  params: Any = None


@dataclasses.dataclass(frozen=True)
class _BertMLM:
  """``MaskedLM.fn`` of a bertjax model (hashable by its config, so compiles are shared)."""

  config: Any

  def __call__(self, params, ids, mask, types, positions):
    hidden = bertjax.forward(params, self.config, ids, mask, types).last_hidden_state  # (B, T, H)
    picked = jnp.take_along_axis(hidden, positions[:, None, None], axis=1)  # (B, 1, H)
    logits = bertjax.mlm_logits(params, self.config, picked)[:, 0]  # (B, V)
    return jax.nn.log_softmax(logits.astype(jnp.float32), -1)


def masked_lm(params: Any, config: Any) -> MaskedLM:
  """A ``MaskedLM`` from model parameters with an MLM head.

  Args:
    params: parameters with an ``"mlm"`` entry (``from_hf`` of a ``BertForMaskedLM``
      or ``BertForPreTraining`` checkpoint, or ``bertjax.init(config, seed, heads=("mlm",))``).
    config: the model's ``BertConfig``.

  Returns:
    A ``MaskedLM`` giving ``(B, V)`` vocabulary log-probs at ``positions[b]`` of each row.

  Raises:
    ValueError: the parameters have no MLM head (e.g. all-MiniLM-L6-v2, a
      sentence-embedding ``BertModel``).
  """
  if "mlm" not in params:
    present = sorted(k for k in params if k not in ("embeddings", "encoder", "pooler"))
    raise ValueError(
      f"cloze probes need a masked-LM head, but these parameters have no 'mlm' head "
      f"(task heads present: {present}); load a checkpoint with one (BertForMaskedLM, "
      "BertForPreTraining, AlbertForMaskedLM, RobertaForMaskedLM, ElectraForMaskedLM (the "
      "generator), DistilBertForMaskedLM) or init with heads=('mlm',)"
    )
  return MaskedLM(_BertMLM(config), params)


@functools.partial(jax.jit, static_argnames=("fn", "k"))
def _query(fn, params, ids, mask, positions, targets, k):
  logp = fn(params, ids, mask, jnp.zeros_like(ids), positions)  # (B, V)
  top = jax.lax.top_k(logp, k)[1]  # (B, k)
  tgt = jnp.take_along_axis(logp, jnp.maximum(targets, 0), axis=1)  # (B, K)
  return top, jnp.where(targets >= 0, tgt, jnp.nan)


def _pad_batch(rows: list[np.ndarray], pad_id: int, n_rows: int, width: int):
  ids = np.full((n_rows, width), pad_id, np.int32)
  mask = np.zeros((n_rows, width), np.int32)
  for r, x in enumerate(rows):
    ids[r, : len(x)], mask[r, : len(x)] = x, 1
  return ids, mask


class _Rows:
  """Runs a row-parallel jitted ``f(fn, params, *rows, **static)`` of a ``MaskedLM``, on one
  device or with its rows split over every device of a mesh; results as NumPy."""

  def __init__(self, lm: MaskedLM, mesh: Any = None):
    self.lm, self.mesh, self.params = lm, mesh, lm.params
    if mesh is not None:
      from bertjax import mesh as mesh_lib

      self.params = mesh_lib.shard_params(lm.params, mesh)

  def rows(self, n: int) -> int:
    """A row count the mesh divides (``n`` itself on one device)."""
    if self.mesh is None:
      return n
    from bertjax import mesh as mesh_lib

    return mesh_lib.round_up(n, mesh_lib.size_of(self.mesh, self.mesh.axis_names))

  def __call__(self, f, *rows, **static):
    if self.mesh is None:
      return jax.tree.map(np.asarray, f(self.lm.fn, self.params, *rows, **static))
    from bertjax import mesh as mesh_lib

    rows = mesh_lib.shard_rows(rows, self.mesh)
    return mesh_lib.to_host(f(self.lm.fn, self.params, *rows, **static))


def _lm(model: Any) -> MaskedLM:
  """Accepts a ``MaskedLM`` or a whole model as ``from_hf`` returns it, ``(config, params)``."""
  if isinstance(model, tuple) and len(model) == 2:
    config, params = model
    if isinstance(params, bertjax.BertConfig) and not isinstance(config, bertjax.BertConfig):
      raise TypeError(
        "model=(params, config): a whole model is (config, params), the pair "
        "from_hf returns; swap them"
      )
    return masked_lm(params, config)
  if not isinstance(model, MaskedLM):
    raise TypeError(f"model must be a MaskedLM or (config, params), got {type(model).__name__}")
  return model


def single_token_id(tokenizer: Any, word: str) -> int | None:
  """The vocabulary id of ``word`` if it is exactly one token, else None.

  For a byte-level BPE tokenizer (RoBERTa) the word is looked up as it appears after a
  space ("Ġfrance"), which is where every blank of these probes sits (``mask_text``).
  """
  if getattr(tokenizer, "byte_level", False) and not word.startswith(" "):
    word = " " + word
  ids = tokenizer.tokenizer.encode(word, add_special_tokens=False).ids
  return int(ids[0]) if len(ids) == 1 else None


def mask_text(tokenizer: Any, text: str) -> str:
  """``text`` with its blank (``[MASK]`` in the probes' data) as the tokenizer's mask token.

  RoBERTa's mask token is ``<mask>``; for byte-level BPE the blank also takes the
  whitespace before it, as transformers' ``<mask>`` does (``lstrip``), so the model
  predicts the word with its leading space ("Ġfrance", as ``single_token_id`` looks it
  up) and no stray "Ġ" token precedes the blank.

  Raises:
    ValueError: the tokenizer has no mask token.
  """
  mask = tokenizer.mask_token
  if mask is None:
    raise ValueError(f"the tokenizer has no mask token (roles: {tokenizer.roles})")
  if mask != "[MASK]":
    text = text.replace("[MASK]", mask)
  if getattr(tokenizer, "byte_level", False):
    text = re.sub(r"\s+" + re.escape(mask), mask, text)
  return text


@dataclasses.dataclass
class ClozeScores:
  """Predictions at the ``[MASK]`` of each query.

  Attributes:
    topk: the ``k`` most probable token ids ``(n, k)``, best first.
    target_logprob: log-probability of each candidate ``(n, K)``; nan where the
      candidate is not a single vocabulary token.
    target_ids: the candidates' ids ``(n, K)``, -1 where not a single token.
  """

  topk: np.ndarray
  target_logprob: np.ndarray
  target_ids: np.ndarray


def score_queries(
  model: MaskedLM | tuple[Any, Any],
  tokenizer: Any,
  texts: Sequence[str],
  candidates: Sequence[Sequence[str]] | None = None,
  *,
  k: int = 10,
  batch_size: int = 32,
  mesh: Any = None,
) -> ClozeScores:
  """Top-k predictions and candidate log-probabilities at the single ``[MASK]`` of each text.

  Args:
    model: a ``MaskedLM`` or ``(config, params)`` (as ``from_hf`` returns them).
    tokenizer: a ``bertjax.Tokenizer`` (its mask token marks the blank).
    texts: sentences with exactly one ``[MASK]`` (written as the tokenizer's own mask
      token by ``mask_text``: ``<mask>`` for RoBERTa), or with its own mask token.
    candidates: per text, words whose log-probability to report (the same count
      for every text); None for none.
    k: predictions to keep.
    batch_size: rows per call (a last partial batch is padded to it).
    mesh: a ``jax.sharding.Mesh`` (``bertjax.mesh.make_mesh``): rows split over all
      its devices (``batch_size`` rounded up to a multiple of their count), parameters
      replicated (fsdp-sharded with an "fsdp" axis > 1); every process gets the scores.
      None: one device.

  Returns:
    ``ClozeScores``.
  """
  lm = _lm(model)
  run = _Rows(lm, mesh)
  batch_size = run.rows(batch_size)
  if tokenizer.mask_id is None:
    raise ValueError("the tokenizer has no [MASK] token")
  texts = list(texts)
  n_cand = len(candidates[0]) if candidates else 0
  if candidates is not None and (
    len(candidates) != len(texts) or any(len(c) != n_cand for c in candidates)
  ):
    raise ValueError(f"candidates must give {n_cand} words for each of the {len(texts)} texts")
  enc, positions = [], []
  for i, text in enumerate(texts):
    ids = tokenizer.encode([mask_text(tokenizer, text)]).input_ids[0]
    where = np.flatnonzero(ids == tokenizer.mask_id)
    if len(where) != 1:
      raise ValueError(
        f"texts[{i}]={text!r} must contain exactly one [MASK] (or "
        f"{tokenizer.mask_token}); found {len(where)}"
      )
    enc.append(ids)
    positions.append(int(where[0]))
  targets = np.full((len(texts), max(n_cand, 1)), -1, np.int32)
  for i in range(len(texts) if candidates else 0):
    for j, word in enumerate(candidates[i]):
      tid = single_token_id(tokenizer, word)
      targets[i, j] = -1 if tid is None else tid
  topk = np.zeros((len(texts), k), np.int32)
  logp = np.full(targets.shape, np.nan, np.float32)
  order = np.argsort([len(e) for e in enc], kind="stable")
  for start in range(0, len(order), batch_size):
    idx = order[start : start + batch_size]
    width = bucket_width(max(len(enc[i]) for i in idx))
    ids, mask = _pad_batch([enc[i] for i in idx], tokenizer.pad_id, batch_size, width)
    pos = np.zeros(batch_size, np.int32)
    pos[: len(idx)] = [positions[i] for i in idx]
    tgt = np.full((batch_size, targets.shape[1]), -1, np.int32)
    tgt[: len(idx)] = targets[idx]
    top, lp = run(_query, ids, mask, pos, tgt, k=k)
    topk[idx], logp[idx] = top[: len(idx)], lp[: len(idx)]
  return ClozeScores(topk, logp[:, :n_cand], targets[:, :n_cand])


def topk_accuracy(topk: np.ndarray, gold: Sequence[Sequence[int]], k: int) -> float:
  """Share of rows where any of the gold ids is among the first ``k`` of ``topk (n, >=k)``."""
  topk = np.asarray(topk)
  if topk.ndim != 2 or topk.shape[1] < k or len(gold) != len(topk):
    raise ValueError(f"topk shape {topk.shape} must be ({len(gold)}, >= {k=})")
  if not len(gold):
    return float("nan")
  return float(
    np.mean([bool(set(map(int, g)) & set(topk[i, :k].tolist())) for i, g in enumerate(gold)])
  )


# ----------------------------------------------------------------------------
# LAMA


def load_jsonl(path: PathLike) -> list[dict[str, Any]]:
  """Reads a JSON-lines file; a bad line raises naming the file and line number."""
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{n} is not valid JSON: {e}") from e
  return out


def fill_template(template: str, subject: str, mask: str = "[MASK]") -> str:
  """A LAMA relation template (``"[X] was born in [Y] ."``) with the subject and the blank."""
  if "[X]" not in template or "[Y]" not in template:
    raise ValueError(f"{template=} must contain [X] and [Y]")
  return template.replace("[X]", subject).replace("[Y]", mask)


def lama_queries(
  records: Sequence[Mapping[str, Any]], templates: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
  """``(text, object)`` pairs from LAMA records.

  A record with ``masked_sentences`` (SQuAD, Google-RE, ConceptNet) uses them,
  joined by spaces; one with ``sub_label`` and a ``predicate_id``/``relation``
  found in ``templates`` fills that template. ``obj_label`` is the answer.
  """
  out = []
  for i, r in enumerate(records):
    if "obj_label" not in r:
      raise ValueError(f"records[{i}] has no 'obj_label' (keys {sorted(r)})")
    if r.get("masked_sentences"):
      text = " ".join(r["masked_sentences"])
    else:
      rel = r.get("predicate_id", r.get("relation"))
      if templates is None or rel not in templates or "sub_label" not in r:
        raise ValueError(f"records[{i}] has no masked_sentences and no template for {rel=}")
      text = fill_template(templates[rel], r["sub_label"])
    out.append((text, str(r["obj_label"])))
  return out


def lama_scores(
  topk: np.ndarray, object_ids: Sequence[int | None], ks: Sequence[int] = (1, 10)
) -> dict[str, float]:
  """P@k over queries whose object is a single token (``object_ids`` None elsewhere).

  Returns:
    ``{"P@1": ..., "P@10": ..., "n": kept queries, "skipped": multi-token objects}``.
  """
  keep = [i for i, o in enumerate(object_ids) if o is not None]
  gold = [[object_ids[i]] for i in keep]
  topk = np.asarray(topk)
  out: dict[str, float] = {f"P@{k}": topk_accuracy(topk[keep], gold, k) for k in ks}
  out["n"], out["skipped"] = len(keep), len(object_ids) - len(keep)
  return out


def lama_probe(
  model: MaskedLM | tuple[Any, Any],
  tokenizer: Any,
  records,
  *,
  templates: Mapping[str, str] | None = None,
  ks: Sequence[int] = (1, 10),
  batch_size: int = 32,
  mesh: Any = None,
) -> dict[str, float]:
  """LAMA P@k (mean over single-token-object queries).

  Args:
    model: a ``MaskedLM`` or ``(config, params)`` (as ``from_hf`` returns them).
    tokenizer: the model's tokenizer.
    records: LAMA JSONL records, or a path to a ``.jsonl`` file.
    templates: relation id -> template, for records without ``masked_sentences``.
    ks: the k of P@k.
    batch_size: rows per call.
    mesh: a device mesh (see ``score_queries``), or None for one device.

  Returns:
    ``lama_scores`` of the queries.
  """
  lm = _lm(model)
  if isinstance(records, (str, os.PathLike)):
    records = load_jsonl(records)
  queries = lama_queries(records, templates)
  object_ids = [single_token_id(tokenizer, obj) for _, obj in queries]
  keep = [i for i, o in enumerate(object_ids) if o is not None]
  scores = score_queries(
    lm, tokenizer, [queries[i][0] for i in keep], k=max(ks), batch_size=batch_size, mesh=mesh
  )
  topk = np.zeros((len(queries), max(ks)), np.int32)
  topk[keep] = scores.topk
  return lama_scores(topk, object_ids, ks)


# ----------------------------------------------------------------------------
# Ettinger (2020)


def read_tsv(path: PathLike) -> list[dict[str, str]]:
  """A tab-separated file with a header row as a list of dicts."""
  with open(path, encoding="utf-8", newline="") as f:
    return [dict(r) for r in csv.DictReader(f, delimiter="\t")]


def _article(context: str, word: str) -> str:
  """NEG-136-SIMP leaves ``(a|an)`` open; it is chosen by the completion's first letter."""
  return context.replace("(a|an)", "an" if word[:1].lower() in "aeiou" else "a")


def cloze_text(context: str, suffix: str = " .") -> str:
  """A context with the blank appended: ``context + " [MASK]" + suffix``."""
  return f"{context.strip()} [MASK]{suffix}"


def _logprob_table(
  lm,
  tokenizer,
  pairs: Sequence[tuple[str, str]],
  k: int,
  batch_size: int,
  suffix: str,
  mesh: Any = None,
):
  """Scores distinct (context, word) pairs: {pair: (logprob, topk)}."""
  uniq = list(dict.fromkeys(pairs))
  s = score_queries(
    lm,
    tokenizer,
    [cloze_text(c, suffix) for c, _ in uniq],
    [[w] for _, w in uniq],
    k=k,
    batch_size=batch_size,
    mesh=mesh,
  )
  return {p: (float(s.target_logprob[i, 0]), s.topk[i]) for i, p in enumerate(uniq)}


def _mean(flags: Sequence[bool]) -> float:
  return float(np.mean(flags)) if len(flags) else float("nan")


def neg136_scores(
  items: Sequence[Mapping[str, str]],
  lookup: Callable[[str, str], tuple],
  ks: Sequence[int] = (1, 5),
  simp: bool = True,
) -> dict[str, float]:
  """NEG-136 scores from a ``lookup(context, word) -> (logprob, topk ids, word id)``.

  Accuracy: the true completion (``target_aff`` after the affirmative context,
  ``target_neg`` after the negated one) is in the top k. Sensitivity, as in the
  paper: the true completion is more probable than the false one in the same
  context, for affirmative and for negated contexts separately. Also
  ``negation_shift``: share of items whose affirmative-true completion loses
  probability when the context is negated.
  For NAT, ``*_licensed`` repeats the measures on items marked ``licensing == "Y"``.
  """

  def measures(rows):
    out = {}
    for side, true_key, false_key in (
      ("aff", "target_aff", "target_neg"),
      ("neg", "target_neg", "target_aff"),
    ):
      ctx = f"context_{side}"
      acc = {k: [] for k in ks}
      sens = []
      for r in rows:
        t_ctx = _article(r[ctx], r[true_key]) if simp else r[ctx]
        f_ctx = _article(r[ctx], r[false_key]) if simp else r[ctx]
        lp_t, top, tid = lookup(t_ctx, r[true_key])
        lp_f, _, fid = lookup(f_ctx, r[false_key])
        if tid is None or fid is None:
          continue
        for k in ks:
          acc[k].append(tid in top[:k])
        sens.append(lp_t > lp_f)
      for k in ks:
        out[f"{side}_top{k}"] = _mean(acc[k])
      out[f"{side}_sensitivity"] = _mean(sens)
      out[f"{side}_n"] = len(sens)
    shift = []
    for r in rows:
      a_ctx = _article(r["context_aff"], r["target_aff"]) if simp else r["context_aff"]
      n_ctx = _article(r["context_neg"], r["target_aff"]) if simp else r["context_neg"]
      lp_a, _, tid = lookup(a_ctx, r["target_aff"])
      lp_n, _, _ = lookup(n_ctx, r["target_aff"])
      if tid is not None:
        shift.append(lp_a > lp_n)
    out["negation_shift"] = _mean(shift)
    return out

  out = measures(items)
  if not simp:
    out.update(
      {
        f"{k}_licensed": v
        for k, v in measures([r for r in items if r.get("licensing") == "Y"]).items()
      }
    )
  return out


def role88_scores(
  items: Sequence[Mapping[str, str]],
  lookup: Callable[[str, str], tuple],
  ks: Sequence[int] = (1, 5),
) -> dict[str, float]:
  """ROLE-88: top-k accuracy of any ``expected`` word (``|``-separated) for every context;
  sensitivity: share of item pairs (``N-a`` / ``N-b``) where ``target`` is more
  probable after the appropriate ``-a`` context than after the role-reversed ``-b``."""
  acc = {k: [] for k in ks}
  for r in items:
    tops, gold = None, []
    for w in r["expected"].split("|"):
      _, top, wid = lookup(r["context"], w.strip())
      tops = top
      if wid is not None:
        gold.append(wid)
    if gold:
      for k in ks:
        acc[k].append(bool(set(gold) & set(np.asarray(tops[:k]).tolist())))
  by_item = {r["item"]: r for r in items}
  sens = []
  for name, good in by_item.items():
    if not name.endswith("-a"):
      continue
    bad = by_item.get(name[:-2] + "-b")
    if bad is None:
      continue
    lp_good, _, tid = lookup(good["context"], good["target"])
    lp_bad, _, _ = lookup(bad["context"], good["target"])
    if tid is not None:
      sens.append(lp_good > lp_bad)
  out = {f"top{k}": _mean(acc[k]) for k in ks}
  out.update(sensitivity=_mean(sens), n=len(acc[ks[0]]), pairs=len(sens))
  return out


def cprag102_scores(
  items: Sequence[Mapping[str, str]],
  lookup: Callable[[str, str], tuple],
  ks: Sequence[int] = (1, 5),
) -> dict[str, float]:
  """CPRAG-102: top-k accuracy of ``expected``, overall and by ``constraint`` (H/L);
  sensitivity: share of items where ``expected`` is more probable than the
  ``within_category`` completion; also within-category over between-category."""
  acc = {k: [] for k in ks}
  by_constraint: dict[str, list[bool]] = {}
  sens, within_between = [], []
  for r in items:
    ctx = f"{r['context_s1'].strip()} {r['context_s2'].strip()}"
    lp_e, top, eid = lookup(ctx, r["expected"])
    lp_w, _, wid = lookup(ctx, r["within_category"])
    lp_b, _, bid = lookup(ctx, r["between_category"])
    if eid is not None:
      for k in ks:
        acc[k].append(eid in top[:k])
      by_constraint.setdefault(r.get("constraint", "?"), []).append(eid in top[: ks[0]])
      if wid is not None:
        sens.append(lp_e > lp_w)
    if wid is not None and bid is not None:
      within_between.append(lp_w > lp_b)
  out = {f"top{k}": _mean(acc[k]) for k in ks}
  out.update({f"top{ks[0]}_{c}": _mean(v) for c, v in sorted(by_constraint.items())})
  out.update(sensitivity=_mean(sens), within_over_between=_mean(within_between), n=len(acc[ks[0]]))
  return out


def ettinger_probe(
  model: MaskedLM | tuple[Any, Any],
  tokenizer: Any,
  datasets_dir: PathLike,
  *,
  ks: Sequence[int] = (1, 5),
  suffix: str = " .",
  batch_size: int = 32,
  mesh: Any = None,
) -> dict[str, dict[str, float]]:
  """All four Ettinger diagnostics from ``lm_diagnostics/datasets``.

  Completions that are not a single vocabulary token are skipped (counted in
  each ``n``). The blank is appended to each context as ``" [MASK]" + suffix``. ``mesh``:
  a device mesh (see ``score_queries``), or None for one device.

  Returns:
    ``{"NEG-136-SIMP": ..., "NEG-136-NAT": ..., "ROLE-88": ..., "CPRAG-102": ...}``.
  """
  lm = _lm(model)
  root = pathlib.Path(datasets_dir)
  data = {
    "NEG-136-SIMP": read_tsv(root / "NEG-136" / "NEG-136-SIMP.tsv"),
    "NEG-136-NAT": read_tsv(root / "NEG-136" / "NEG-136-NAT.tsv"),
    "ROLE-88": read_tsv(root / "ROLE-88" / "ROLE-88.tsv"),
    "CPRAG-102": read_tsv(root / "CPRAG-102" / "CPRAG-102.tsv"),
  }
  k = max(ks)
  out = {}
  for name, items in data.items():
    pairs = _ettinger_pairs(name, items)
    table = _logprob_table(lm, tokenizer, pairs, k, batch_size, suffix, mesh)
    ids = {w: single_token_id(tokenizer, w) for _, w in pairs}
    lookup = lambda c, w, t=table, i=ids: (*t[(c, w)], i[w])
    if name.startswith("NEG"):
      out[name] = neg136_scores(items, lookup, ks, simp=name.endswith("SIMP"))
    elif name == "ROLE-88":
      out[name] = role88_scores(items, lookup, ks)
    else:
      out[name] = cprag102_scores(items, lookup, ks)
  return out


def _ettinger_pairs(name: str, items) -> list[tuple[str, str]]:
  """Every (context, word) pair a scorer will look up."""
  pairs = []
  for r in items:
    if name.startswith("NEG"):
      for ctx in (r["context_aff"], r["context_neg"]):
        for w in (r["target_aff"], r["target_neg"]):
          pairs.append((_article(ctx, w) if name.endswith("SIMP") else ctx, w))
    elif name == "ROLE-88":
      pairs += [(r["context"], w.strip()) for w in r["expected"].split("|")]
      pairs.append((r["context"], r["target"]))
    else:
      ctx = f"{r['context_s1'].strip()} {r['context_s2'].strip()}"
      pairs += [(ctx, r[key]) for key in ("expected", "within_category", "between_category")]
  # ROLE sensitivity scores each -a item's target after its -b context too.
  if name == "ROLE-88":
    by_item = {r["item"]: r for r in items}
    for n, r in by_item.items():
      if n.endswith("-a") and n[:-2] + "-b" in by_item:
        pairs.append((by_item[n[:-2] + "-b"]["context"], r["target"]))
  return pairs


# ----------------------------------------------------------------------------
# Pseudo-log-likelihood and BLiMP


@functools.partial(jax.jit, static_argnames=("fn",))
def _pll_rows(fn, params, ids, mask, positions, mask_id):
  """Log-probability of the original token at ``positions[r]`` with it masked: ``(rows,)``."""
  rows = jnp.arange(ids.shape[0])
  original = ids[rows, positions]
  masked = ids.at[rows, positions].set(mask_id)  # (rows, T): one masked copy per row
  logp = fn(params, masked, mask, jnp.zeros_like(ids), positions)  # (rows, V)
  return logp[rows, original]


def pseudo_log_likelihood(
  model: MaskedLM | tuple[Any, Any],
  tokenizer: Any,
  sentences: Sequence[str],
  *,
  max_rows: int = 128,
  return_tokens: bool = False,
  mesh: Any = None,
):
  """PLL of each sentence (Salazar et al. 2020), special tokens excluded.

  A sentence of T word pieces becomes T copies, copy t with piece t masked; the
  copies of several sentences are packed into one batch (never splitting a
  sentence), padded to ``bucket_width`` and ``max_rows`` rows, and run in one
  jitted call.

  Args:
    model: a ``MaskedLM`` or ``(config, params)`` (as ``from_hf`` returns them).
    tokenizer: the model's tokenizer.
    sentences: plain text.
    max_rows: masked copies per call (a longer sentence gets a call of its own).
    return_tokens: also return each sentence's per-piece log-probabilities.
    mesh: a device mesh: rows (masked copies) split over all its devices (the row count
      rounded up to a multiple of their count); see ``score_queries``. None: one device.

  Returns:
    ``(n,)`` float64 PLLs, and with ``return_tokens`` a list of ``(T_i,)`` arrays.
  """
  lm = _lm(model)
  run = _Rows(lm, mesh)
  if tokenizer.mask_id is None:
    raise ValueError("the tokenizer has no [MASK] token; PLL needs one")
  sentences = list(sentences)
  enc = []
  for i, s in enumerate(sentences):
    ids = tokenizer.encode([s]).input_ids[0]
    real = np.flatnonzero(~np.isin(ids, list(tokenizer.special_ids)))
    if real.size == 0:
      raise ValueError(f"sentences[{i}]={s!r} has no tokens to score")
    enc.append((ids, real))
  per_token = [np.zeros(len(r)) for _, r in enc]
  order = np.argsort([len(ids) for ids, _ in enc], kind="stable")
  batches, cur, rows = [], [], 0
  for i in order:
    n = len(enc[i][1])
    if cur and rows + n > max_rows:
      batches.append(cur)
      cur, rows = [], 0
    cur.append(i)
    rows += n
  if cur:
    batches.append(cur)
  for batch in batches:
    width = bucket_width(max(len(enc[i][0]) for i in batch))
    copies = [(i, t) for i in batch for t in enc[i][1]]
    n_rows = run.rows(max(max_rows, 8 * math.ceil(len(copies) / 8)))  # one count: few compiles
    ids, mask = _pad_batch([enc[i][0] for i, _ in copies], tokenizer.pad_id, n_rows, width)
    pos = np.zeros(n_rows, np.int32)
    pos[: len(copies)] = [t for _, t in copies]
    lp = run(_pll_rows, ids, mask, pos, mask_id=int(tokenizer.mask_id))
    r = 0
    for i in batch:
      n = len(enc[i][1])
      per_token[i] = lp[r : r + n].astype(np.float64)
      r += n
  pll = np.asarray([t.sum() for t in per_token])
  return (pll, per_token) if return_tokens else pll


def minimal_pair_accuracy(score_good, score_bad) -> float:
  """Share of pairs where the acceptable sentence scores strictly higher."""
  good, bad = np.asarray(score_good, float), np.asarray(score_bad, float)
  if good.shape != bad.shape or good.ndim != 1:
    raise ValueError(
      f"score_good shape {good.shape} and score_bad shape {bad.shape} must be equal 1-d shapes"
    )
  return float(np.mean(good > bad)) if good.size else float("nan")


def blimp_probe(
  model: MaskedLM | tuple[Any, Any],
  tokenizer: Any,
  records,
  *,
  max_pairs: int | None = None,
  max_rows: int = 128,
  mesh: Any = None,
) -> dict[str, Any]:
  """BLiMP accuracy by PLL: share of pairs with ``PLL(sentence_good) > PLL(sentence_bad)``.

  Args:
    model: a ``MaskedLM`` or ``(config, params)`` (as ``from_hf`` returns them).
    tokenizer: the model's tokenizer.
    records: BLiMP JSONL records (``sentence_good``, ``sentence_bad``) or a path.
    max_pairs: only the first pairs.
    max_rows: masked copies per call.
    mesh: a device mesh (see ``pseudo_log_likelihood``), or None for one device.

  Returns:
    ``{"accuracy", "n", "pll_good", "pll_bad"}`` (the PLLs as lists).
  """
  lm = _lm(model)
  if isinstance(records, (str, os.PathLike)):
    records = load_jsonl(records)
  records = list(records)[:max_pairs]
  for i, r in enumerate(records):
    if "sentence_good" not in r or "sentence_bad" not in r:
      raise ValueError(f"records[{i}] lacks sentence_good/sentence_bad (keys {sorted(r)})")
  pll = pseudo_log_likelihood(
    lm,
    tokenizer,
    [r["sentence_good"] for r in records] + [r["sentence_bad"] for r in records],
    max_rows=max_rows,
    mesh=mesh,
  )
  good, bad = pll[: len(records)], pll[len(records) :]
  return {
    "accuracy": minimal_pair_accuracy(good, bad),
    "n": len(records),
    "pll_good": good.tolist(),
    "pll_bad": bad.tolist(),
  }
