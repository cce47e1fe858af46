"""A rotated interchange intervention from pyvene 0.1.8 on the real all-MiniLM-L6-v2.

Run by `tests/test_causal_pyvene.py` in a subprocess with `.venv/hf4` on the path (transformers
4.57, where `./run.sh setup` also puts pyvene). Usage: python reference_pyvene.py IN.npz
OUT.npz MODEL_DIR. IN holds the base and source ids, their attention mask, one position per
pair, the layer, k and a seed. A `RotatedSpaceIntervention` (its rotation set to a seeded
random orthogonal matrix through its orthogonal parametrisation) interchanges the first k
rotated coordinates of the layer's output (`encoder.layer[L].output`, pyvene's direct module
path: its model cards have no BERT) at each pair's position, from the source run into the
base run. OUT holds the realised rotation and the intervened run's last hidden state.
"""

import sys

import numpy as np
import pyvene as pv
import torch
import transformers


def main(src: str, dst: str, model_dir: str) -> None:
  inp = dict(np.load(src))
  layer, k = int(inp["layer"]), int(inp["k"])
  model = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
  dim = model.config.hidden_size
  intervention = pv.RotatedSpaceIntervention(embed_dim=dim)
  rng = np.random.default_rng(int(inp["seed"]))
  q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
  with torch.no_grad():
    intervention.rotate_layer.weight = torch.tensor(q, dtype=torch.float32)
  intervention.set_interchange_dim(k)
  config = pv.IntervenableConfig(
    representations=[
      pv.RepresentationConfig(
        layer=layer,
        component=f"encoder.layer[{layer}].output",
        unit="pos",
        max_number_of_units=1,
        intervention=intervention,
      )
    ]
  )
  wrapped = pv.IntervenableModel(config, model)
  at = [[[int(p)] for p in inp["positions"]]]  # one intervention, each pair, one position
  mask = torch.tensor(inp["attention_mask"])
  base = {"input_ids": torch.tensor(inp["base_ids"]), "attention_mask": mask}
  source = {"input_ids": torch.tensor(inp["source_ids"]), "attention_mask": mask}
  with torch.no_grad():
    _, out = wrapped(base, [source], {"sources->base": (at, at)})
    rotation = intervention.rotate_layer.weight.detach().numpy()
  np.savez(
    dst,
    rotation=rotation,
    last_hidden_state=out.last_hidden_state.numpy(),
    transformers=transformers.__version__,
    pyvene=pv.__version__ if hasattr(pv, "__version__") else "0.1.8",
  )


if __name__ == "__main__":
  main(*sys.argv[1:4])
