# %% [markdown]
# # Adding a family
#
# bertjax has one encoder. What differs between BERT, RoBERTa, MPNet, ModernBERT or EuroBERT
# is a row of `bertjax.model.families.FAMILIES`: where the norms sit, which norm, how
# positions enter, the FFN, and the names of every tensor, head and `config.json` key. The
# layer reads the row and never asks for `model_type`, so a new family is a new row, and it
# gets every site, head mask, patch, sweep and analysis at once.
#
# This tutorial adds CamemBERT (Martin et al. 2020), which transformers has and bertjax does
# not ship: RoBERTa's block under its own class names. It registers the row, checks a
# random-weight transformers model against it to float32 rounding, writes it back for
# transformers, and shows that the analyses work on it unchanged. The last section says
# which fields to change when the block itself differs.

# %%
import dataclasses
import tempfile

import jax.numpy as jnp
import numpy as np
import torch
import transformers

import bertjax
from bertjax.model import families

roberta = families.FAMILIES["roberta"]
for field in ("norm", "norm_kind", "positions", "position_bias", "ffn", "token_types", "prefix"):
  print(f"{field:>14}: {getattr(roberta, field)!r}")
print(f"{'layer_names':>14}: {dict(roberta.layer_names)}")
print(f"{'architectures':>14}: {dict(roberta.architectures)}")

# %% [markdown]
# ## The row
#
# CamemBERT's block, embeddings, heads and `config.json` keys are RoBERTa's; only the class
# names differ (`CamembertForMaskedLM` where RoBERTa has `RobertaForMaskedLM`), and
# transformers keeps RoBERTa's `roberta.` prefix for its tensors. So the row is RoBERTa's
# with a new `model_type` and renamed classes. `families.register` refuses a `model_type`
# that is already there, a layer role or a head it does not know.

# %%
rename = lambda name: name.replace("Roberta", "Camembert")
camembert = dataclasses.replace(
  roberta,
  model_type="camembert",
  architectures={heads: rename(cls) for heads, cls in roberta.architectures.items()},
  no_pooler=frozenset(map(rename, roberta.no_pooler)),
  what_differs="RoBERTa's block, pre-trained on French (OSCAR) with a SentencePiece vocabulary",
)
families.register(camembert)
print(sorted(families.FAMILIES))

# %% [markdown]
# ## Exact against transformers
#
# A reference model with odd sizes (3 layers, 5 heads of 8) and every parameter random,
# LayerNorms included, so that a norm read as the identity cannot pass. bertjax loads the
# directory transformers writes, by its `config.json`'s `model_type`.

# %%
hf_config = transformers.CamembertConfig(
  vocab_size=120,
  hidden_size=40,
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=52,
  max_position_embeddings=48,
  attn_implementation="eager",  # attention maps to compare
)
torch.manual_seed(0)
reference = transformers.CamembertForMaskedLM(hf_config).eval()
with torch.no_grad():
  for tensor in reference.parameters():
    tensor.normal_(0.0, 0.2)
checkpoint = tempfile.mkdtemp()
reference.save_pretrained(checkpoint)

config, params = bertjax.from_hf(checkpoint)
print(
  config.model_type,
  config.depth,
  "layers,",
  config.num_attention_heads,
  "heads; heads:",
  sorted(set(params) - {"embeddings", "encoder"}),
)

# %%
ids = np.random.default_rng(0).integers(5, 120, (3, 11))
mask = np.ones((3, 11), np.int64)
mask[1, 7:] = 0  # padded rows: positions count real tokens only, as RoBERTa's
mask[2, 4:] = 0
out = bertjax.forward(params, config, ids, mask, output_hidden_states=True, output_attentions=True)
logits = bertjax.head_logits(params, config, out, "mlm")
with torch.no_grad():
  ref = reference(
    torch.tensor(ids),
    attention_mask=torch.tensor(mask),
    output_hidden_states=True,
    output_attentions=True,
  )
real = mask.astype(bool)


def map_gap(ours, theirs):  # (batch, heads, query, key), compared at real query rows
  return np.abs(np.asarray(ours) - theirs.numpy()).transpose(0, 2, 1, 3)[real].max()


gaps = {
  "hidden states": max(
    np.abs(np.asarray(a) - b.numpy())[real].max()
    for a, b in zip(out.hidden_states, ref.hidden_states)
  ),
  "attention maps": max(map_gap(a, b) for a, b in zip(out.attentions, ref.attentions)),
  "MLM logits": np.abs(np.asarray(logits) - ref.logits.numpy())[real].max(),
}
for what, gap in gaps.items():
  print(f"{what:>14}: largest difference {gap:.1e}")
  assert gap < 1e-4, what

# %% [markdown]
# ## Back to transformers
#
# `to_hf` writes the family's own class and tensor names; transformers loads the directory
# with no missing or unexpected key and computes the same logits.

# %%
written = tempfile.mkdtemp()
bertjax.to_hf(config, params, written)
again, info = transformers.AutoModelForMaskedLM.from_pretrained(written, output_loading_info=True)
print(type(again).__name__, "keys missing or unexpected:", {k: v for k, v in info.items() if v})
assert type(again).__name__ == "CamembertForMaskedLM" and not any(info.values())
with torch.no_grad():
  back = again.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
round_trip = np.abs(back - ref.logits.numpy())[real].max()
print(f"logits after the round trip: largest difference {round_trip:.1e}")
assert round_trip < 1e-4

# %% [markdown]
# ## Everything else comes with the row
#
# Sites, head masks, patches and the fused kernel read the same layer, so they need nothing
# new. Ablating head 2 of layer 3 (index 2) changes the output; the fused Pallas kernel
# (interpret mode on a CPU) gives the same states as the XLA path; and the `probs` site is
# the attention map transformers returns (at real query rows; padded rows are not compared).

# %%
head_mask = jnp.ones((config.depth, config.num_attention_heads)).at[2, 2].set(0.0)
ablated = bertjax.forward(params, config, ids, mask, head_mask=head_mask)
print(
  f"head 2 of layer 3 ablated: final states move by {np.abs(ablated.last_hidden_state - out.last_hidden_state)[real].max():.2f}"
)
fused = bertjax.forward(params, config.replace(attention_impl="pallas"), ids, mask)
print(
  f"fused kernel against XLA: {np.abs(fused.last_hidden_state - out.last_hidden_state)[real].max():.1e}"
)
captured = bertjax.forward(params, config, ids, mask, capture=("probs",))
print(
  f"probs site against transformers' attentions: {map_gap(captured.cache['probs'][1], ref.attentions[1]):.1e}"
)

# %% [markdown]
# ## When the block differs
#
# CamemBERT needed no new field. A family whose block differs sets the row's block fields,
# each of which the layer already reads:
#
# | field | values | families that use it |
# |---|---|---|
# | `norm` | `"post"` (`LN(x + f(x))`), `"pre"` (`x + f(LN(x))`, a final norm) | BERT; ModernBERT, EuroBERT |
# | `norm_kind` | `"layernorm"`, `"rmsnorm"` | most; EuroBERT |
# | `positions` | `"absolute"`, `"after_padding"`, `"rotary"` | BERT; RoBERTa, MPNet; NomicBERT, ModernBERT, EuroBERT |
# | `position_bias` | `None`, `"relative_buckets"`, `"disentangled"` | most; MPNet; DeBERTa |
# | `ffn` | `"dense"`, `"gated"` (GeGLU, SwiGLU) | BERT; NomicBERT, ModernBERT, EuroBERT |
# | `layer_names` | role -> tensor name; `"qkv"` and `"gate_in"` for fused tensors | NomicBERT, ModernBERT |
#
# What a checkpoint may switch (biases, grouped key/value heads, a rope theta per layer
# type, which layers have a window) is a config field, read from `config.json` through
# `config_fields` and `config_keys`. EuroBERT's row, a Llama-like block, for comparison:

# %%
eurobert = families.FAMILIES["eurobert"]
for field in ("norm", "norm_kind", "positions", "ffn", "final_norm"):
  print(f"{field:>10}: {getattr(eurobert, field)!r}")
print(f"{'layer':>10}: {dict(eurobert.layer_names)}")

# %% [markdown]
# A block that none of these fields describes (a new attention, say) is new code in
# `bertjax/model/`, written once for every family, with a field in the row to switch it:
# DeBERTa's disentangled attention came in that way. The
# [manual's families section](../manual.md#families-in-full) lists every field and what the
# tests check for each family.
