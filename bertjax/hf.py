"""Hugging Face checkpoints in and out: `config.json` + `model.safetensors` (or `pytorch_model.bin`).

Explicit name maps, one entry per tensor: our parameter path, the Hugging Face
name, and how the array is laid out on each side. Torch `nn.Linear` stores
`(out, in)`; we store `(in, out)` and split heads onto their own axis.
"""

from __future__ import annotations

import json
import pathlib
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.config import BertConfig
from bertjax.functional import HEADS, Params

# How a tensor is stored here vs in torch; `to_hf` and `from_hf` are inverses.
# Each kind maps (our array, config) -> torch array and back.
_Kind = tuple[Callable[[np.ndarray, BertConfig], np.ndarray],
              Callable[[np.ndarray, BertConfig], np.ndarray]]
_KINDS: dict[str, _Kind] = {
    "plain": (lambda a, c: a, lambda a, c: a),
    "linear": (lambda a, c: a.T, lambda a, c: a.T),
    # query/key/value kernels: ours (H, N, D), torch (N*D, H).
    # (N varies per layer in a pruned model, hence the -1.)
    "qkv": (lambda a, c: a.reshape(a.shape[0], -1).T,
            lambda a, c: a.T.reshape(a.shape[1], -1, c.head_dim)),
    "qkv_bias": (lambda a, c: a.reshape(-1), lambda a, c: a.reshape(-1, c.head_dim)),
    # attention output kernel: ours (N, D, H), torch (H, N*D).
    "out": (lambda a, c: a.reshape(-1, a.shape[-1]).T,
            lambda a, c: a.T.reshape(-1, c.head_dim, a.shape[0])),
}

# Within one encoder layer: our path, BERT suffix, ALBERT suffix, kind.
_LAYER_MAP = [
    (("attention", "query", "kernel"), "attention.self.query.weight", "attention.query.weight", "qkv"),
    (("attention", "query", "bias"), "attention.self.query.bias", "attention.query.bias", "qkv_bias"),
    (("attention", "key", "kernel"), "attention.self.key.weight", "attention.key.weight", "qkv"),
    (("attention", "key", "bias"), "attention.self.key.bias", "attention.key.bias", "qkv_bias"),
    (("attention", "value", "kernel"), "attention.self.value.weight", "attention.value.weight", "qkv"),
    (("attention", "value", "bias"), "attention.self.value.bias", "attention.value.bias", "qkv_bias"),
    (("attention", "output", "kernel"), "attention.output.dense.weight", "attention.dense.weight", "out"),
    (("attention", "output", "bias"), "attention.output.dense.bias", "attention.dense.bias", "plain"),
    (("attention", "LayerNorm", "scale"), "attention.output.LayerNorm.weight", "attention.LayerNorm.weight", "plain"),
    (("attention", "LayerNorm", "bias"), "attention.output.LayerNorm.bias", "attention.LayerNorm.bias", "plain"),
    (("intermediate", "kernel"), "intermediate.dense.weight", "ffn.weight", "linear"),
    (("intermediate", "bias"), "intermediate.dense.bias", "ffn.bias", "plain"),
    (("output", "kernel"), "output.dense.weight", "ffn_output.weight", "linear"),
    (("output", "bias"), "output.dense.bias", "ffn_output.bias", "plain"),
    (("LayerNorm", "scale"), "output.LayerNorm.weight", "full_layer_layer_norm.weight", "plain"),
    (("LayerNorm", "bias"), "output.LayerNorm.bias", "full_layer_layer_norm.bias", "plain"),
]

_ARCHITECTURES = {
    ("bert", ()): "BertModel",
    ("bert", ("mlm",)): "BertForMaskedLM",
    ("bert", ("mlm", "nsp")): "BertForPreTraining",
    ("bert", ("nsp",)): "BertForNextSentencePrediction",
    ("bert", ("classifier",)): "BertForSequenceClassification",
    ("bert", ("token_classifier",)): "BertForTokenClassification",
    ("albert", ()): "AlbertModel",
    ("albert", ("mlm",)): "AlbertForMaskedLM",
    ("albert", ("mlm", "sop")): "AlbertForPreTraining",
    ("albert", ("classifier",)): "AlbertForSequenceClassification",
    ("albert", ("token_classifier",)): "AlbertForTokenClassification",
}
# Architectures built without a pooler (`add_pooling_layer=False`).
_NO_POOLER = {"BertForMaskedLM", "BertForTokenClassification", "AlbertForMaskedLM",
              "AlbertForTokenClassification"}


def _name_map(config: BertConfig, heads: tuple[str, ...], pooler: bool):
  """(hf_name, our_path, param_layer or None, kind) for every tensor of the model."""
  albert = config.model_type == "albert"
  base = "albert." if albert else "bert."
  entries = []
  for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    entries.append((f"{base}embeddings.{table}.weight", ("embeddings", table, "embedding"), None,
                    "plain"))
  for ours, theirs in (("scale", "weight"), ("bias", "bias")):
    entries.append((f"{base}embeddings.LayerNorm.{theirs}", ("embeddings", "LayerNorm", ours),
                    None, "plain"))
  if config.has_embedding_projection:
    for ours, theirs, kind in (("kernel", "weight", "linear"), ("bias", "bias", "plain")):
      entries.append((f"{base}encoder.embedding_hidden_mapping_in.{theirs}",
                      ("embeddings", "projection", ours), None, kind))
  for p in range(config.num_param_layers):
    if albert:
      g, j = divmod(p, config.inner_group_num)
      prefix = f"{base}encoder.albert_layer_groups.{g}.albert_layers.{j}."
    else:
      prefix = f"{base}encoder.layer.{p}."
    for path, bert_name, albert_name, kind in _LAYER_MAP:
      entries.append((prefix + (albert_name if albert else bert_name),
                      ("encoder", "layers") + path, p, kind))
  if pooler:
    pooler_name = f"{base}pooler" if albert else f"{base}pooler.dense"
    for ours, theirs, kind in (("kernel", "weight", "linear"), ("bias", "bias", "plain")):
      entries.append((f"{pooler_name}.{theirs}", ("pooler", "dense", ours), None, kind))
  dense = lambda hf, path: [(f"{hf}.weight", path + ("kernel",), None, "linear"),
                            (f"{hf}.bias", path + ("bias",), None, "plain")]
  for head in heads:
    if head == "mlm":
      mlm = "predictions" if albert else "cls.predictions"
      transform = mlm if albert else f"{mlm}.transform"
      entries += dense(f"{transform}.dense", ("mlm", "dense"))
      entries += [(f"{transform}.LayerNorm.weight", ("mlm", "LayerNorm", "scale"), None, "plain"),
                  (f"{transform}.LayerNorm.bias", ("mlm", "LayerNorm", "bias"), None, "plain"),
                  (f"{mlm}.bias", ("mlm", "bias"), None, "plain")]
    elif head == "nsp":
      entries += dense("cls.seq_relationship", ("nsp", "dense"))
    elif head == "sop":
      entries += dense("sop_classifier.classifier", ("sop", "dense"))
    else:
      entries += dense("classifier", (head, "dense"))
  return entries


def _tied_names(config: BertConfig) -> set[str]:
  mlm = "predictions" if config.model_type == "albert" else "cls.predictions"
  return {f"{mlm}.decoder.weight", f"{mlm}.decoder.bias"}


def _architecture(config: BertConfig, heads: tuple[str, ...]) -> str:
  key = (config.model_type, tuple(sorted(heads)))
  if key not in _ARCHITECTURES:
    raise ValueError(f"heads={list(key[1])} on a {config.model_type} model have no Hugging Face "
                     f"class; supported: {sorted(h for t, h in _ARCHITECTURES if t == key[0])}")
  return _ARCHITECTURES[key]


# Reading --------------------------------------------------------------------


def _read_state_dict(path: pathlib.Path) -> dict[str, np.ndarray]:
  safetensors_file = path / "model.safetensors"
  if safetensors_file.exists():
    from safetensors import safe_open

    state = {}
    with safe_open(str(safetensors_file), framework="numpy") as f:
      for name in f.keys():
        try:
          state[name] = f.get_tensor(name)
        except (TypeError, ValueError):  # bfloat16 has no NumPy dtype: go through torch.
          with safe_open(str(safetensors_file), framework="pt") as g:
            state[name] = g.get_tensor(name).float().numpy()
    return state
  torch_file = path / "pytorch_model.bin"
  if torch_file.exists():
    import torch

    raw = torch.load(str(torch_file), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in raw.items()}
  raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {path}")


def _normalise_name(name: str) -> str:
  # Old TF-converted checkpoints call LayerNorm parameters gamma and beta.
  if name.endswith(".gamma"):
    return name[: -len(".gamma")] + ".weight"
  if name.endswith(".beta"):
    return name[: -len(".beta")] + ".bias"
  return name


def from_hf(path: str | pathlib.Path, **config_overrides: Any) -> tuple[BertConfig, Params]:
  """Loads a Hugging Face BERT or ALBERT directory.

  Reads `config.json` and `model.safetensors` (or `pytorch_model.bin`), with or
  without the `bert.`/`albert.` prefix and with task heads (MLM, NSP, SOP,
  sequence and token classification) when present.

  Args:
    path: the model directory.
    **config_overrides: fields of `BertConfig` to set, e.g. `dtype="bfloat16"`,
      `attention_impl="pallas"`.

  Returns:
    `(config, params)`.

  Raises:
    ValueError: unknown `model_type`, or missing, unexpected or mis-shaped
      tensors (all of them listed).
  """
  path = pathlib.Path(path)
  config_file = path / "config.json"
  if not config_file.exists():
    raise FileNotFoundError(f"no config.json in {path}")
  hf_config = json.loads(config_file.read_text())
  config = BertConfig.from_hf_dict(hf_config)
  state = {_normalise_name(k): v for k, v in _read_state_dict(path).items()}

  base = "albert." if config.model_type == "albert" else "bert."
  if not any(k.startswith(base) for k in state):
    state = {(k if _is_head_name(k) else base + k): v for k, v in state.items()}
  heads = _detect_heads(state, hf_config)
  pooler = any(k.startswith(f"{base}pooler") for k in state)
  config = config.replace(use_pooler=pooler, **config_overrides)
  for head_weight in ("classifier.weight", "sop_classifier.classifier.weight"):
    if head_weight in state:
      config = config.replace(num_labels=state[head_weight].shape[0])
  params = _params_from_state(config, heads, state)
  return config, params


def _is_head_name(name: str) -> bool:
  return name.split(".")[0] in ("cls", "predictions", "sop_classifier", "classifier")


def _detect_heads(state: dict[str, np.ndarray], hf_config: dict[str, Any]) -> tuple[str, ...]:
  heads = []
  if any(k.startswith(("cls.predictions.", "predictions.")) for k in state):
    heads.append("mlm")
  if any(k.startswith("cls.seq_relationship.") for k in state):
    heads.append("nsp")
  if any(k.startswith("sop_classifier.") for k in state):
    heads.append("sop")
  if "classifier.weight" in state:
    archs = " ".join(hf_config.get("architectures") or [])
    heads.append("token_classifier" if "TokenClassification" in archs else "classifier")
  return tuple(heads)


def _params_from_state(config: BertConfig, heads: tuple[str, ...],
                       state: dict[str, np.ndarray]) -> Params:
  entries = _name_map(config, heads, config.use_pooler)
  expected = {name for name, *_ in entries}
  ignorable = _tied_names(config) | {k for k in state if k.endswith("position_ids")}
  missing = sorted(expected - set(state))
  unexpected = sorted(set(state) - expected - ignorable)
  shapes = _expected_shapes(config, heads)
  wrong = [f"{name}: {state[name].shape} != expected {shapes[name]}"
           for name, *_ in entries if name in state and state[name].shape != shapes[name]]
  if missing or unexpected or wrong:
    raise ValueError(
        f"checkpoint does not match a {config.model_type} model with heads {list(heads)}:\n"
        f"  missing ({len(missing)}): {missing}\n  unexpected ({len(unexpected)}): {unexpected}\n"
        f"  wrong shape ({len(wrong)}): {wrong}")

  per_layer: dict[tuple[str, ...], list] = {}
  flat: dict[tuple[str, ...], np.ndarray] = {}
  for name, path, layer, kind in entries:
    array = _KINDS[kind][1](np.asarray(state[name], np.float32), config)
    if layer is None:
      flat[path] = array
    else:
      per_layer.setdefault(path, [None] * config.num_param_layers)[layer] = array
  params = _unflatten({k: jnp.asarray(v) for k, v in flat.items()})
  layer_trees = [_unflatten({path[2:]: jnp.asarray(arrays[i]) for path, arrays in per_layer.items()})
                 for i in range(config.num_param_layers)]
  if config.is_pruned:  # head counts differ between layers: a list, not a stack
    params["encoder"] = {"layers": layer_trees}
  else:
    params["encoder"] = {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layer_trees)}
  return params


def _expected_shapes(config: BertConfig, heads: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
  """Torch-side shapes of every tensor, derived from freshly initialised parameters."""
  from bertjax.functional import init

  abstract = jax.eval_shape(lambda: init(config, 0, heads))
  def shape(path, layer):
    layers = abstract["encoder"]["layers"]
    if layer is not None and not isinstance(layers, list):
      return _leaf(abstract, path, None).shape[1:]  # drop the stacked axis
    return _leaf(abstract, path, layer).shape

  return {name: tuple(_KINDS[kind][0](np.zeros(shape(path, layer)), config).shape)
          for name, path, layer, kind in _name_map(config, heads, config.use_pooler)}


def _leaf(tree, path, layer):
  """The array at `path`; for a layer parameter, that layer's slice (stacked or listed)."""
  if layer is not None:
    layers = tree["encoder"]["layers"]
    if isinstance(layers, list):
      tree, path, layer = layers[layer], path[2:], None
  for key in path:
    tree = tree[key]
  return tree if layer is None else tree[layer]


def _unflatten(flat: dict[tuple[str, ...], Any]) -> Params:
  tree: Params = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


# Writing --------------------------------------------------------------------


def hf_state_dict(config: BertConfig, params: Params) -> tuple[dict[str, np.ndarray], str]:
  """Our parameters as a Hugging Face state dict (float32 NumPy) and the architecture name."""
  heads = tuple(h for h in HEADS if h in params)
  arch = _architecture(config, heads)
  pooler = "pooler" in params and arch not in _NO_POOLER
  if "pooler" in params and not pooler:
    warnings.warn(f"{arch} has no pooler in Hugging Face; the pooler is not written")
  with_prefix = bool(heads)
  state = {}
  for name, path, layer, kind in _name_map(config, heads, pooler):
    array = np.asarray(_leaf(params, path, layer), np.float32)
    if not with_prefix:
      name = name.split(".", 1)[1]
    state[name] = np.ascontiguousarray(_KINDS[kind][0](array, config))
  return state, arch


def to_hf(config: BertConfig, params: Params, path: str | pathlib.Path) -> None:
  """Writes `config.json` (with `model_type` and `architectures`) and `model.safetensors`.

  The result loads in `transformers` with no missing or unexpected keys. The
  architecture follows the heads present in `params`.
  """
  from safetensors.numpy import save_file

  state, arch = hf_state_dict(config, params)
  hf_config = config.to_hf_dict([arch])
  if "classifier" in params or "token_classifier" in params:
    head = params.get("classifier", params.get("token_classifier"))
    labels = head["dense"]["kernel"].shape[-1]
    hf_config.update(num_labels=labels, id2label={str(i): f"LABEL_{i}" for i in range(labels)},
                     label2id={f"LABEL_{i}": i for i in range(labels)})
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  # Write to temporaries, then rename: a crash never leaves a half-written model.
  tmp_weights, tmp_config = path / "model.safetensors.tmp", path / "config.json.tmp"
  save_file(state, str(tmp_weights), metadata={"format": "pt"})
  tmp_config.write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  tmp_weights.replace(path / "model.safetensors")
  tmp_config.replace(path / "config.json")
