"""The ground floor: the encoder of every family, its named sites and its checkpoints.

* `families`: the family table (one row per Hugging Face `model_type`, the whole block), whose
  rows `family_schema` describes (`Family`, `Head`);
* `config`: one frozen `BertConfig` for every family, presets, the `config.json` mapping, with
  its groups in `settings` (`Runtime`, `TaskHeads`) and `options` (each family's own);
* `intervention`: one `Intervention` value: the masks, patches and captures of a pass;
* `sites`: the named sites (`SITES`) and `Sites`, one block's view of the intervention;
* `layers`: the Flax modules of the block, which read the family's row, never `model_type`;
* `heads`: the task heads and what each reads (`head_logits`);
* `forward`: the pure API (`init`, `forward`, `embed`, `run_layers`, `attention_statistics`);
* `prune`: physical head pruning and its inverse;
* `input_checks`: what bad input gets, before any compute;
* `hf`: Hugging Face checkpoints in and out; `tokenizer`: every family's tokenizer.

The public names are imported from `bertjax` itself (`bertjax.forward`, `bertjax.from_hf`, ...).
"""
