"""Negation and an indirect-object task as masked prediction, with counterfactual pairs.

Each task has a high-level model with one causal variable, and builds base and source
sentences that differ in one token, the variable's value, so that interchanging the variable
from the source flips the answer at the masked position:

* `negation_pairs` (variable: the polarity). "the door is not open , it is [MASK] ." against
  "the door is still open , it is [MASK] .": the answer is the stated adjective when the
  sentence is affirmative and its antonym when it is negated. The stated adjective is either
  member of an antonym pair, so a word alone never gives the answer; a pair's candidates are
  (stated, antonym) and its label is 1 where the source is negated.
* `ioi_pairs` (variable: which of the two names is repeated, the first or the second; the
  indirect-object identification task of Wang et al. 2023 with the answer masked). "when mary
  and john went to the store , john gave a drink to [MASK] ." against the same sentence with
  "mary" as the second subject: the answer is the name not repeated. A pair's candidates are
  its two names in order and its label the index of the source's answer.

`task(name, tok, n, seed)` builds any of `TASKS` by name (agreement's pairs from
`bertjax.tasks.agreement`); `solved(params, config, task)` gives the pairs a model answers
right on both runs. Both return `CounterfactualTask`: `CounterfactualPairs` whose `positions` are the one column
where base and source differ (the polarity word, the repeated name) and whose `target` is the
mask, plus the base's own label and the sentences. Words that are not one token in the
tokenizer's vocabulary are left out, so a template tokenises to one length everywhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.analysis.causal.interchange import CounterfactualPairs

# (subject, adjective, antonym): states that negation turns into their opposite.
ANTONYMS = (
  ("door", "open", "closed"),
  ("statement", "true", "false"),
  ("patient", "alive", "dead"),
  ("glass", "full", "empty"),
  ("light", "on", "off"),
  ("answer", "right", "wrong"),
  ("water", "hot", "cold"),
  ("towel", "wet", "dry"),
  ("baby", "awake", "asleep"),
  ("room", "clean", "dirty"),
  ("road", "safe", "dangerous"),
  ("student", "present", "absent"),
  ("car", "fast", "slow"),
  ("story", "short", "long"),
  ("test", "easy", "hard"),
  ("street", "quiet", "loud"),
)
POLARITY = ("still", "not")  # affirmative, negated: the one word base and source differ in
NEGATION_TEMPLATES = (
  "the {subject} is {polarity} {adjective} , it is {mask} .",
  "the {subject} was {polarity} {adjective} , so it was {mask} .",
)
NAMES = (
  "mary", "john", "james", "robert", "michael", "william", "david", "richard", "thomas",
  "sarah", "linda", "susan", "karen", "lisa", "paul", "mark", "george", "kevin", "anna",
  "laura", "peter", "emma", "jack", "kate",
)  # fmt: skip
PLACES = ("store", "park", "school", "office", "beach", "station", "garden", "hospital")
OBJECTS = ("drink", "book", "gift", "letter", "ball", "key", "bag", "ring")
IOI_TEMPLATES = (
  "when {a} and {b} went to the {place} , {s} gave a {object} to {mask} .",
  "after {a} and {b} arrived at the {place} , {s} handed a {object} to {mask} .",
  "{a} and {b} spent the day at the {place} . then {s} gave a {object} to {mask} .",
)


@dataclasses.dataclass(frozen=True)
class CounterfactualTask:
  """Counterfactual pairs and what the task knows about them.

  Attributes:
    pairs: the `CounterfactualPairs` (candidates (B, C): each pair's own).
    base_label: int (B,): the answer of the base sentence (an index into its candidates).
    base_text, source_text: the sentences.
  """

  pairs: CounterfactualPairs
  base_label: np.ndarray
  base_text: tuple[str, ...]
  source_text: tuple[str, ...]


def one_token(tok, word: str) -> bool:
  """Whether `word`, after a space, is one token in `tok`'s vocabulary."""
  return len(tok.encode([f"the {word}"]).input_ids[0]) == len(tok.encode(["the"]).input_ids[0]) + 1


def _token_id(tok, word: str) -> int:
  return int(tok.encode([f"the {word}"]).input_ids[0][2])


def _mask_token(tok) -> str:
  if tok.mask_id is None:
    raise ValueError("the tokenizer has no mask token: the answer is read at a masked word")
  return tok.convert_ids_to_tokens([tok.mask_id])[0]


def _task(tok, base, source, candidates, label, base_label) -> CounterfactualTask:
  b_enc, s_enc = tok.encode(list(base)), tok.encode(list(source))
  if b_enc.input_ids.shape != s_enc.input_ids.shape:
    raise ValueError("base and source sentences tokenise to different lengths")
  differs = b_enc.input_ids != s_enc.input_ids
  if not (differs.sum(1) == 1).all():
    raise ValueError("base and source must differ in exactly one token")
  pairs = CounterfactualPairs(
    base_ids=b_enc.input_ids,
    source_ids=s_enc.input_ids,
    attention_mask=b_enc.attention_mask,
    positions=np.argmax(differs, axis=1)[:, None],
    target=np.argmax(b_enc.input_ids == tok.mask_id, axis=1),
    candidates=np.asarray(candidates, np.int64),
    label=np.asarray(label),
  )
  return CounterfactualTask(pairs, np.asarray(base_label), tuple(base), tuple(source))


def negation_pairs(tok, n: int, seed: int = 0) -> CounterfactualTask:
  """`n` negation pairs (see the module docstring): base and source of opposite polarity in
  every pair, the antonym pair, the stated member and the template drawn with `seed`.

  Raises:
    ValueError: the tokenizer has no mask token, fewer than 4 antonym pairs are one token
      each, or a polarity word is not one token.
  """
  mask = _mask_token(tok)
  if not all(one_token(tok, w) for w in POLARITY):
    raise ValueError(f"the polarity words {POLARITY} must be one token each")
  rows = [r for r in ANTONYMS if all(one_token(tok, w) for w in r)]
  if len(rows) < 4:
    raise ValueError(f"only {len(rows)} of the task's antonym pairs are one token each")
  rng = np.random.default_rng(seed)
  base, source, candidates, label, base_label = [], [], [], [], []
  for i in range(n):
    subject, *words = rows[int(rng.integers(len(rows)))]
    stated = int(rng.integers(2))
    adjective, antonym = words[stated], words[1 - stated]
    negated = int(rng.integers(2))  # the base's polarity; the source has the other
    fill = dict(subject=subject, adjective=adjective, mask=mask)
    template = NEGATION_TEMPLATES[i % len(NEGATION_TEMPLATES)]
    base.append(template.format(polarity=POLARITY[negated], **fill))
    source.append(template.format(polarity=POLARITY[1 - negated], **fill))
    candidates.append((_token_id(tok, adjective), _token_id(tok, antonym)))
    base_label.append(negated)
    label.append(1 - negated)
  return _task(tok, base, source, candidates, label, base_label)


def ioi_pairs(tok, n: int, seed: int = 0) -> CounterfactualTask:
  """`n` indirect-object pairs (see the module docstring): the base repeats one name, the
  source the other; the names, place, object, template and repeated name drawn with `seed`.

  Raises:
    ValueError: the tokenizer has no mask token or fewer than 4 names are one token.
  """
  mask = _mask_token(tok)
  names = [w for w in NAMES if one_token(tok, w)]
  if len(names) < 4:
    raise ValueError(f"only {len(names)} of the task's names are one token in this vocabulary")
  rng = np.random.default_rng(seed)
  base, source, candidates, label, base_label = [], [], [], [], []
  for i in range(n):
    a, b = (names[j] for j in rng.choice(len(names), 2, replace=False))
    repeated = int(rng.integers(2))  # 0: the base repeats a, so its answer is b (index 1)
    fill = dict(
      a=a,
      b=b,
      place=PLACES[int(rng.integers(len(PLACES)))],
      object=OBJECTS[int(rng.integers(len(OBJECTS)))],
      mask=mask,
    )
    template = IOI_TEMPLATES[i % len(IOI_TEMPLATES)]
    base.append(template.format(s=(a, b)[repeated], **fill))
    source.append(template.format(s=(a, b)[1 - repeated], **fill))
    candidates.append((_token_id(tok, a), _token_id(tok, b)))
    base_label.append(1 - repeated)
    label.append(repeated)
  return _task(tok, base, source, candidates, label, base_label)


TASKS = ("agreement", "negation", "ioi")


def task(name: str, tok, n: int, seed: int = 0):
  """`n` pairs of the task `name` (one of `TASKS`): `agreement.agreement_pairs`,
  `negation_pairs` or `ioi_pairs`; each result has `pairs`, `base_label`, `base_text` and
  `source_text`."""
  from bertjax.tasks import agreement

  make = {"agreement": agreement.agreement_pairs, "negation": negation_pairs, "ioi": ioi_pairs}
  if name not in make:
    raise ValueError(f"task {name!r} must be one of {TASKS}")
  return make[name](tok, n, seed=seed)


def solved(params, config, task) -> tuple[np.ndarray, dict[str, float]]:
  """(the rows of `task`'s pairs the model answers right on both runs, its accuracy on the
  base and on the source runs): an analysis of the variable keeps those rows, as MIB does."""
  from bertjax.analysis.causal.interchange import answers

  base, source = answers(params, config, task.pairs)
  right_base, right_source = base == task.base_label, source == task.pairs.label
  acc = {"base": float(right_base.mean()), "source": float(right_source.mean())}
  return np.flatnonzero(right_base & right_source), acc
