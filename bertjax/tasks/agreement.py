"""Subject-verb agreement as masked prediction, with counterfactual pairs for causal analysis.

The high-level model has one variable, the subject's grammatical number, and one output, the
verb form at the masked position ("is" or "are"; "was" or "were", "has" or "have" by `verb=`). A base
sentence and a source sentence share a template and differ in the subject (and its number);
interchanging the variable from the source makes the counterfactual label the verb form that
agrees with the source's subject. Templates put an attractor of the other number between
subject and verb in half the sentences ("the author near the pilots [MASK] here"), where a
model that tracked the nearest noun would fail.

`agreement_pairs(tok, n, seed)` builds `bertjax.analysis.causal.interchange.CounterfactualPairs`
whose `positions` are the subject's token and `target` the mask's, keeping only nouns whose
singular and plural are one token each in `tok`'s vocabulary (so every sentence of a template
tokenises to the same length and the positions align). `base_label` gives the verb form that
agrees with the base subject (what the model should predict without intervention).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.analysis.causal.interchange import CounterfactualPairs

# Singular and plural of nouns of people (common one-token words in English vocabularies).
NOUNS = (
  ("author", "authors"),
  ("doctor", "doctors"),
  ("teacher", "teachers"),
  ("student", "students"),
  ("farmer", "farmers"),
  ("pilot", "pilots"),
  ("senator", "senators"),
  ("dancer", "dancers"),
  ("guard", "guards"),
  ("officer", "officers"),
  ("manager", "managers"),
  ("customer", "customers"),
  ("lawyer", "lawyers"),
  ("artist", "artists"),
  ("singer", "singers"),
  ("soldier", "soldiers"),
  ("driver", "drivers"),
  ("player", "players"),
  ("writer", "writers"),
  ("nurse", "nurses"),
)
# (singular verb, plural verb) -> the template's tail after the masked verb.
TAILS = {("is", "are"): "here .", ("was", "were"): "tired .", ("has", "have"): "left ."}
TEMPLATES = ("the {subject} {mask} {tail}", "the {subject} near the {attractor} {mask} {tail}")


@dataclasses.dataclass(frozen=True)
class AgreementPairs:
  """Counterfactual pairs and what the task knows about them.

  Attributes:
    pairs: the `CounterfactualPairs` (candidates: the singular then the plural verb form,
      so `label` 1 means plural).
    base_label: int (B,): the form agreeing with the base subject.
    base_text, source_text: the sentences.
    attractor: bool (B,): the template has an attractor of the other number.
  """

  pairs: CounterfactualPairs
  base_label: np.ndarray
  base_text: tuple[str, ...]
  source_text: tuple[str, ...]
  attractor: np.ndarray


def one_token_nouns(tok) -> list[tuple[str, str]]:
  """The `NOUNS` whose singular and plural are one token each (after a space) in `tok`."""
  single = lambda w: (
    len(tok.encode([f"the {w}"]).input_ids[0]) == len(tok.encode(["the"]).input_ids[0]) + 1
  )
  return [(s, p) for s, p in NOUNS if single(s) and single(p)]


def agreement_pairs(tok, n: int, seed: int = 0, verb=("is", "are")) -> AgreementPairs:
  """`n` counterfactual pairs (see the module docstring) with `tok`'s ids; base and source
  subjects of opposite number in every pair, the nouns and templates drawn with `seed`.

  Raises:
    ValueError: the tokenizer has no mask token, fewer than 4 one-token nouns, or a verb form
      that is not one token.
  """
  if tok.mask_id is None:
    raise ValueError("the tokenizer has no mask token: agreement is read at a masked verb")
  nouns = one_token_nouns(tok)
  if len(nouns) < 4:
    raise ValueError(f"only {len(nouns)} of the task's nouns are one token in this vocabulary")
  mask = tok.convert_ids_to_tokens([tok.mask_id])[0]
  if tuple(verb) not in TAILS:
    raise ValueError(f"verb={verb!r} must be one of {tuple(TAILS)}")
  ids = [tok.encode([f"the {v}"]).input_ids[0][1:-1] for v in verb]
  if any(len(i) != 2 for i in ids):
    raise ValueError(f"verb forms {verb} must be one token each")
  candidates = np.asarray([int(i[1]) for i in ids])
  rng = np.random.default_rng(seed)
  base, source, label, base_label, attractor = [], [], [], [], []
  for i in range(n):
    template = TEMPLATES[i % len(TEMPLATES)]
    a, b = rng.choice(len(nouns), 2, replace=False)
    base_plural = bool(rng.integers(2))
    subj_b = nouns[a][int(base_plural)]
    subj_s = nouns[b][int(not base_plural)]
    attr = nouns[int(rng.integers(len(nouns)))][int(not base_plural)]  # the other number
    fill = dict(mask=mask, tail=TAILS[tuple(verb)], attractor=attr)
    base.append(template.format(subject=subj_b, **fill))
    source.append(template.format(subject=subj_s, **fill))
    base_label.append(int(base_plural))
    label.append(int(not base_plural))
    attractor.append("{attractor}" in template)
  b_enc, s_enc = tok.encode(base), tok.encode(source)
  if b_enc.input_ids.shape != s_enc.input_ids.shape:
    raise ValueError("base and source sentences tokenise to different lengths")
  ids = b_enc.input_ids
  target = np.argmax(ids == tok.mask_id, axis=1)
  subject = np.full((n, 1), 2)  # [CLS] the SUBJECT ...
  pairs = CounterfactualPairs(
    base_ids=ids,
    source_ids=s_enc.input_ids,
    attention_mask=b_enc.attention_mask,
    positions=subject,
    target=target,
    candidates=candidates,
    label=np.asarray(label),
  )
  return AgreementPairs(
    pairs, np.asarray(base_label), tuple(base), tuple(source), np.asarray(attractor)
  )
