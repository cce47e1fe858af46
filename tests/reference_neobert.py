"""NeoBERT in PyTorch, the reference bertjax's `neobert` row is tested against.

NeoBERT (Le Breton et al. 2025) is remote code only: transformers has no class for it, and the
model file on its hub page imports xformers' SwiGLU unconditionally, so it does not load on a
CPU without that package. This module restates, in plain PyTorch, the computation of that
released code (chandar-lab/NeoBERT: `model.py` and `rotary.py` of the hub repository; the
training code's `src/neobert/model/` at commit ed75b68), with its parameter names, so that a
state dict of the released checkpoint loads here strictly and one written by `bertjax.to_hf`
must too:

* `encoder` the token embedding; no scaling, no norm, no position table;
* per block `transformer_encoder.{i}`: `attention_norm` and `ffn_norm` (`torch.nn.RMSNorm`,
  `x * rsqrt(mean(x^2) + eps) * w`); `qkv` one bias-free linear whose output, viewed as
  (heads, 3 * head_dim), holds each head's query, key and value in turn; q and k rotated as
  complex numbers (`torch.view_as_complex` on consecutive pairs, `torch.polar` of
  `position * 10000^(-2i / head_dim)`); `scaled_dot_product_attention` with a boolean key mask
  and its default scale; `wo`; a SwiGLU `ffn` whose `w12` gives the gate (first half, SiLU)
  and the up projection, `w3` the down projection, `int(2 I / 3)` rounded up to a multiple of
  8 wide;
* `layer_norm` after the last block; `hidden_states` are the blocks' outputs before it;
* `NeoBERTLMHead`: `decoder` (with a bias) on the final states; `NeoBERTForSequenceClassification`:
  the first token through dropout, `dense`, tanh, dropout and `classifier`.

Attention maps (`output_attentions`) are the softmax of the masked logits, the maps the SDPA
path computes (the released eager branch multiplies logits by the mask instead).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass
class NeoBERTConfig:
  hidden_size: int = 768
  num_hidden_layers: int = 28
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  vocab_size: int = 30522
  pad_token_id: int = 0
  max_length: int = 1024
  norm_eps: float = 1e-6
  num_labels: int = 2
  classifier_dropout: float = 0.1

  @property
  def dim_head(self) -> int:
    return self.hidden_size // self.num_attention_heads


def _rotation(dim: int, length: int, theta: float = 10000.0) -> torch.Tensor:
  """(length, dim / 2) complex64 unit numbers `exp(i t f_j)`, `f_j = theta^(-2j / dim)`."""
  freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
  angles = torch.outer(torch.arange(length).float(), freqs)
  return torch.polar(torch.ones_like(angles), angles)


def _rotate(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
  """x (B, T, N, D) times the rotation (T, D / 2) on consecutive pairs, as complex numbers."""
  pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
  return torch.view_as_real(pairs * rotation[None, :, None, :]).flatten(3).type_as(x)


class SwiGLU(nn.Module):
  def __init__(self, hidden: int, width: int):
    super().__init__()
    self.w12 = nn.Linear(hidden, 2 * width, bias=False)
    self.w3 = nn.Linear(width, hidden, bias=False)

  def forward(self, x):
    gate, up = self.w12(x).chunk(2, dim=-1)
    return self.w3(F.silu(gate) * up)


class EncoderBlock(nn.Module):
  def __init__(self, config: NeoBERTConfig):
    super().__init__()
    self.config = config
    h = config.hidden_size
    self.attention_norm = nn.RMSNorm(h, eps=config.norm_eps)
    self.qkv = nn.Linear(h, 3 * h, bias=False)
    self.wo = nn.Linear(h, h, bias=False)
    self.ffn_norm = nn.RMSNorm(h, eps=config.norm_eps)
    width = 8 * ((int(2 * config.intermediate_size / 3) + 7) // 8)
    self.ffn = SwiGLU(h, width)

  def forward(self, x, keep, rotation, output_attentions):
    b, t, _ = x.shape
    n, d = self.config.num_attention_heads, self.config.dim_head
    q, k, v = self.qkv(self.attention_norm(x)).view(b, t, n, 3 * d).chunk(3, dim=-1)
    q, k = _rotate(q, rotation), _rotate(k, rotation)
    q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # (B, N, T, D)
    allowed = keep[:, None, None, :].expand(b, n, t, t)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    maps = None
    if output_attentions:
      logits = (q @ k.transpose(-1, -2)) / d**0.5
      maps = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    x = x + self.wo(out.transpose(1, 2).reshape(b, t, n * d))
    return x + self.ffn(self.ffn_norm(x)), maps


class NeoBERT(nn.Module):
  def __init__(self, config: NeoBERTConfig):
    super().__init__()
    self.config = config
    self.encoder = nn.Embedding(config.vocab_size, config.hidden_size)
    self.transformer_encoder = nn.ModuleList(
      EncoderBlock(config) for _ in range(config.num_hidden_layers)
    )
    self.layer_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
    self.register_buffer(
      "freqs_cis", _rotation(config.dim_head, config.max_length), persistent=False
    )

  def forward(self, input_ids, attention_mask, output_attentions=False):
    x = self.encoder(input_ids)
    rotation = self.freqs_cis[: input_ids.shape[1]]
    hidden, maps = [], []
    for block in self.transformer_encoder:
      x, a = block(x, attention_mask.bool(), rotation, output_attentions)
      hidden.append(x)
      maps.append(a)
    return {"last_hidden_state": self.layer_norm(x), "hidden_states": hidden, "attentions": maps}


class NeoBERTLMHead(nn.Module):
  def __init__(self, config: NeoBERTConfig):
    super().__init__()
    self.model = NeoBERT(config)
    self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

  def forward(self, input_ids, attention_mask, output_attentions=False):
    out = self.model(input_ids, attention_mask, output_attentions)
    return {**out, "logits": self.decoder(out["last_hidden_state"])}


class NeoBERTForSequenceClassification(nn.Module):
  def __init__(self, config: NeoBERTConfig):
    super().__init__()
    self.model = NeoBERT(config)
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(config.classifier_dropout)
    self.classifier = nn.Linear(config.hidden_size, config.num_labels)

  def forward(self, input_ids, attention_mask, output_attentions=False):
    out = self.model(input_ids, attention_mask, output_attentions)
    x = self.dropout(out["last_hidden_state"][:, 0])
    x = self.dropout(torch.tanh(self.dense(x)))
    return {**out, "logits": self.classifier(x)}


CLASSES = {
  "NeoBERT": NeoBERT,
  "NeoBERTLMHead": NeoBERTLMHead,
  "NeoBERTForSequenceClassification": NeoBERTForSequenceClassification,
}


def config_json(config: NeoBERTConfig, architecture: str) -> dict:
  """The `config.json` the released code's `NeoBERTConfig.save_pretrained` writes (the keys it
  reads, its leftover ones, and transformers' bookkeeping)."""
  return {
    "model_type": "neobert",
    "architectures": [architecture],
    "hidden_size": config.hidden_size,
    "num_hidden_layers": config.num_hidden_layers,
    "num_attention_heads": config.num_attention_heads,
    "dim_head": config.dim_head,
    "intermediate_size": config.intermediate_size,
    "vocab_size": config.vocab_size,
    "pad_token_id": config.pad_token_id,
    "max_length": config.max_length,
    "norm_eps": config.norm_eps,
    "embedding_init_range": 0.02,
    "decoder_init_range": 0.02,
    "classifier_init_range": 0.02,
    "classifier_dropout": config.classifier_dropout,
    "num_labels": config.num_labels,
    "kwargs": {},
    "auto_map": {
      "AutoConfig": "model.NeoBERTConfig",
      "AutoModel": "model.NeoBERT",
      "AutoModelForMaskedLM": "model.NeoBERTLMHead",
      "AutoModelForSequenceClassification": "model.NeoBERTForSequenceClassification",
    },
    "torch_dtype": "float32",
    "transformers_version": "4.48.2",
  }
