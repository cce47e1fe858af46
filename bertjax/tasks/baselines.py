"""What a task's surface cues alone score, the floor a fine-tuned model is read against
(Kovaleva et al. 2019 ask whether BERT's fine-tuned accuracy needs more than such cues):
the majority label, each word's commonest tag, and a bag of subwords."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertjax.training.losses import IGNORE_INDEX


def majority_accuracy(train: dict, test: dict) -> float:
  """Accuracy on `test` of always predicting `train`'s commonest label (tag); -100 marks
  tokens without a label, on both sides."""
  y_train, y_test = train["labels"], test["labels"]
  y_train, y_test = y_train[y_train != IGNORE_INDEX], y_test[y_test != IGNORE_INDEX]
  return float((y_test == np.bincount(y_train).argmax()).mean())


def word_tag_accuracy(train: dict, test: dict) -> float:
  """Token accuracy of each word's commonest training tag, keyed by the id of the subword
  that carries the label (unseen words get the commonest tag overall): what a model without
  context can do."""
  keep_tr, keep_te = train["labels"] != IGNORE_INDEX, test["labels"] != IGNORE_INDEX
  ids, tags = train["input_ids"][keep_tr], train["labels"][keep_tr]
  default = int(np.bincount(tags).argmax())
  counts: dict[int, np.ndarray] = {}
  n_tags = int(max(tags.max(), test["labels"][keep_te].max())) + 1
  for i, t in zip(ids.tolist(), tags.tolist()):
    counts.setdefault(i, np.zeros(n_tags, np.int64))[t] += 1
  pred = np.asarray(
    [counts[i].argmax() if i in counts else default for i in test["input_ids"][keep_te].tolist()]
  )
  return float((pred == test["labels"][keep_te]).mean())


def bag_of_words_accuracy(
  train: dict,
  test: dict,
  special_ids: Sequence[int],
  *,
  steps: int,
  l2: float = 1e-3,
  learning_rate: float = 0.5,
) -> float:
  """Test accuracy of an L2 logistic regression on which subwords a sentence contains
  (no order, no context, `special_ids` left out), fitted by `steps` of full-batch gradient
  descent on the training split. Subwords never seen in training are ignored."""
  vocab = np.unique(train["input_ids"][train["attention_mask"] > 0])
  vocab = vocab[~np.isin(vocab, special_ids)]
  col = {int(v): j for j, v in enumerate(vocab)}

  def features(data):
    x = np.zeros((len(data["labels"]), len(vocab) + 1))
    x[:, -1] = 1.0  # bias
    for row, (ids, mask) in enumerate(zip(data["input_ids"], data["attention_mask"])):
      for i in ids[mask > 0].tolist():
        if i in col:
          x[row, col[i]] = 1.0
    return x

  x, y = features(train), train["labels"]
  classes = int(max(y.max(), test["labels"].max())) + 1
  onehot = np.eye(classes)[y]
  w = np.zeros((x.shape[1], classes))
  for _ in range(steps):
    z = x @ w
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    w -= learning_rate * (x.T @ (p - onehot) / len(y) + l2 * w)
  return float(((features(test) @ w).argmax(1) == test["labels"]).mean())
