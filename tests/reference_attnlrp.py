"""AttnLRP relevance from the released code (`lxt` 2.1, `lxt.efficient`) on a random BERT.

Run by `tests/test_lrp.py` in a subprocess with transformers 4.57 (`.venv/hf4`, where
`./run.sh setup` also puts `lxt`): its BERT patch replaces transformers 4's BERT module.
Usage: python reference_attnlrp.py OUT_DIR. Builds a seeded random BertForMaskedLM and a
BertForSequenceClassification on the same encoder (norms and biases randomised), saves both
to OUT_DIR/{mlm,classifier}, explains a classifier logit and an MLM logit on a padded batch
with LXT's rules, and writes OUT_DIR/reference.npz.

`lxt/efficient/__init__.py` imports every model it patches, ViT's with torchvision, which
this environment does not have; the packages `lxt`, `lxt.efficient` and
`lxt.efficient.models` are therefore registered without running their `__init__`, and the
modules used (`rules`, `patches`, `models/bert`) are imported from the installed package.
"""

import importlib
import importlib.util
import pathlib
import sys
import types

import numpy as np
import torch


def _package(name: str) -> None:
  parent = name.rpartition(".")[0]
  spec = importlib.util.find_spec(name.split(".")[0]) if not parent else None
  root = (
    pathlib.Path(spec.submodule_search_locations[0])
    if spec
    else pathlib.Path(sys.modules[parent].__path__[0]) / name.rpartition(".")[2]
  )
  module = types.ModuleType(name)
  module.__path__ = [str(root)]
  sys.modules[name] = module


def _lxt_bert():
  for name in ("lxt", "lxt.efficient", "lxt.efficient.models"):
    _package(name)
  lxt_bert = importlib.import_module("lxt.efficient.models.bert")
  for target, patch in lxt_bert.attnLRP.items():  # as lxt.efficient.monkey_patch does
    patch(target)
  from transformers.models.bert import modeling_bert

  return modeling_bert


def _randomise(model, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.2 * torch.randn(p.shape, generator=gen))


def main(out: pathlib.Path) -> None:
  modeling_bert = _lxt_bert()
  import transformers

  config = transformers.BertConfig(
    vocab_size=120,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=72,
    max_position_embeddings=40,
    num_labels=3,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    attn_implementation="eager",
  )
  torch.manual_seed(0)
  mlm = modeling_bert.BertForMaskedLM(config).eval()
  _randomise(mlm, 1)
  classifier = modeling_bert.BertForSequenceClassification(config).eval()
  classifier.bert.load_state_dict(mlm.bert.state_dict(), strict=False)
  _randomise(classifier.classifier, 2)
  mlm.save_pretrained(out / "mlm")
  classifier.save_pretrained(out / "classifier")

  rng = np.random.default_rng(0)
  ids = rng.integers(5, 120, (3, 11))
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  mask[2, 4:] = 0
  types_ = (np.arange(11)[None] >= 5).astype(np.int64) * mask
  cls, positions, tokens = 2, np.array([3, 1, 2]), np.array([7, 50, 99])

  def relevance(model, pick):
    embeds = model.bert.embeddings.word_embeddings(torch.as_tensor(ids)).detach()
    embeds.requires_grad_(True)
    logits = model(
      inputs_embeds=embeds,
      attention_mask=torch.as_tensor(mask),
      token_type_ids=torch.as_tensor(types_),
    ).logits
    target = pick(logits)
    target.sum().backward()
    return (embeds * embeds.grad).sum(-1).detach().numpy(), target.detach().numpy()

  r_cls, t_cls = relevance(classifier, lambda z: z[:, cls])
  r_mlm, t_mlm = relevance(mlm, lambda z: z[np.arange(3), positions, tokens])
  np.savez(
    out / "reference.npz",
    ids=ids,
    mask=mask,
    types=types_,
    cls=cls,
    positions=positions,
    tokens=tokens,
    r_cls=r_cls,
    t_cls=t_cls,
    r_mlm=r_mlm,
    t_mlm=t_mlm,
    transformers=transformers.__version__,
  )


if __name__ == "__main__":
  main(pathlib.Path(sys.argv[1]))
