"""circuit-tracer 0.5.0's pruning and graph scores on hand-made graphs.

Run by `tests/test_attribution_graphs.py` in a subprocess with `.venv/hf4` on the path (where
`./run.sh setup` puts circuit-tracer, without its dependencies: `circuit_tracer.graph` needs
only torch and transformers 4.57 from them). Usage: python reference_circuit_tracer.py IN.npz
OUT.npz. IN holds adjacency matrices in circuit-tracer's node order (features, errors,
tokens, logits), the logit weights, the (node, edge) thresholds and the node counts. OUT holds,
per graph, `compute_graph_scores` and, per threshold pair, `prune_graph`'s masks and
cumulative scores.
"""

import sys
from importlib.metadata import version
from types import SimpleNamespace

import numpy as np
import torch
from circuit_tracer.graph import compute_graph_scores, prune_graph


def main(src: str, dst: str) -> None:
  inp = dict(np.load(src))
  weights = torch.tensor(inp["weights"])
  n_pos, n_features = int(inp["n_pos"]), int(inp["n_features"])
  out = {"version": version("circuit-tracer")}
  i = 0
  while f"adjacency{i}" in inp:
    # prune_graph and compute_graph_scores read only these attributes of a Graph.
    graph = SimpleNamespace(
      adjacency_matrix=torch.tensor(inp[f"adjacency{i}"]),
      input_tokens=torch.arange(n_pos),
      logit_targets=[None] * len(weights),
      logit_probabilities=weights,
      selected_features=torch.arange(n_features),
      cfg=SimpleNamespace(n_layers=int(inp["layers"])),
    )
    out[f"replacement{i}"], out[f"completeness{i}"] = compute_graph_scores(graph)
    for j, (node_t, edge_t) in enumerate(inp["thresholds"]):
      pruned = prune_graph(graph, float(node_t), float(edge_t))
      out[f"nodes{i}_{j}"] = pruned.node_mask.numpy()
      out[f"edges{i}_{j}"] = pruned.edge_mask.numpy()
      out[f"cumulative{i}_{j}"] = pruned.cumulative_scores.numpy()
    i += 1
  np.savez(dst, **out)


if __name__ == "__main__":
  main(*sys.argv[1:3])
