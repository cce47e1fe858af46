# %% [markdown]
# # An attribution graph of negation
#
# Which transcoder features carry negation from the word "not" to MiniLM's sentence
# embedding? This tutorial trains a small cross-layer transcoder (CLT) on MiniLM's FFNs, then
# builds the attribution graph (Ameisen et al. 2025, "Circuit Tracing") of one negated
# sentence for a probe's reading of negation, prunes it as circuit-tracer does, draws it, and
# checks what it predicts against interventions on the model itself. It uses only what ships
# with bertjax and runs in about two minutes on a laptop CPU.

# %%
import matplotlib.pyplot as plt
import numpy as np

import bertjax
from bertjax.analysis.circuits import graphs as G
from bertjax.analysis.circuits import transcoders as tcs
from bertjax.plots import graphs as graph_plots
from bertjax.tasks import negation
from bertjax.tasks.sentences import load_sentences

path = bertjax.minilm_path()
config, params = bertjax.from_hf(path)
tok = bertjax.Tokenizer.from_pretrained(path)
sentences = load_sentences()

# %% [markdown]
# ## The target: a probe's reading of negation
#
# A target is any linear read-out of the final states. Here it is a logistic-regression
# probe on the mean-pooled embedding (negated minus affirmative logit), so the target is the
# pooled state projected on one direction: a `G.Projection`. A masked-token logit through an
# MLM head (`G.Logit`) works the same way.

# %%
features, labels = negation.pooled_features(params, config, tok, sentences)
w, b, mu, sd = negation.fit_probe(features, labels)
weight, _ = negation.probe_weights(w, b, mu, sd)  # (hidden, 2): class 1 is "negated"
direction = tuple(float(v) for v in weight[:, 1] - weight[:, 0])

# %% [markdown]
# ## A cross-layer transcoder
#
# The features of layer l read that block's FFN input and write to the FFN outputs of l and
# every later layer. A real one is trained on many more tokens (`experiments/transcoders.py`
# trains on 102k WikiText-2 tokens); this one sees the project's 385 sentences, a few
# thousand tokens, for 100 steps.

# %%
batches = [
  tok.encode([s.text for s in sentences[i : i + 64]]) for i in range(0, len(sentences), 64)
]
x, y = tcs.activations(params, config, batches)  # (tokens, 6, 384) FFN inputs and outputs
cfg = tcs.TranscoderConfig(d_model=384, layers=6, latents=1536, k=16, cross_layer=True, lr=2e-3)
state, log = tcs.train(x, y, cfg, steps=100, batch_tokens=512, progress=False)
print("FVU by layer", np.round(tcs.evaluate(state.params, cfg, x, y)["fvu"], 3))

# %% [markdown]
# ## The graph
#
# In the local replacement model the CLT stands in for every FFN, its errors are constants,
# and the attention patterns and norm scales are frozen at this sentence's values, so the
# target is linear in the nodes: active features at (layer, position), errors, embeddings.
# An edge is one node's direct effect on another's input, exact. Attention is bidirectional:
# an edge may run to an earlier position as well as a later one, but always up in layer.

# %%
text = "The old man did not believe the story."
ids = np.asarray(tok.encode([text]).input_ids)[0]
graph = G.attribute(params, config, state.params, cfg, ids, [G.Projection(direction, "negated")])
print(f"{graph.n_features} active features; target {graph.target_values[0]:.2f}")
print("scores", {k: round(v, 3) for k, v in G.scores(graph).items()})
pruned = G.prune(graph, node_threshold=0.8, edge_threshold=0.98)
print(f"kept {pruned.node_mask[: graph.n_features].sum()} features, {pruned.edge_mask.sum()} edges")

# %% [markdown]
# The replacement score is the share of the embeddings' and errors' influence on the target
# that is the embeddings'; completeness is the influence-weighted share of every node's input
# that comes from features and embeddings rather than errors (circuit-tracer's definitions).
# The pruned graph, each node's area its influence:

# %%
view = G.view(graph, pruned, tok.convert_ids_to_tokens(ids))
fig, ax = plt.subplots(figsize=(10, 5))
graph_plots.draw(view, ax, title=f"{text}  (target: the probe's negated logit)")
plt.show()

# %% [markdown]
# ## What the graph predicts, and what the model does
#
# `G.predict` reads off the graph what ablating a feature does to the target: the change
# flows along the edges, every other feature staying active. `G.steer` ablates the same
# feature in the model itself (its decoder rows removed from the FFN outputs it writes to),
# where attention, norms and the real FFNs respond. The closer the points lie to the
# diagonal, the better the frozen linear picture holds.

# %%
top = np.argsort(-G.node_influence(graph)[: graph.n_features])[:12]
predicted = [G.predict(graph, [i], 0.0)[0] for i in top]
real = [G.steer(params, config, state.params, graph, [i], 0.0)[0] for i in top]
for i, p, r in list(zip(top, predicted, real))[:5]:
  layer, pos, latent = graph.features[i]
  token = tok.convert_ids_to_tokens(ids)[pos]
  print(f"layer {layer + 1} {token!r:>10} latent {latent:4d}: predicted {p:+.3f}, model {r:+.3f}")
print(f"sign agreement {np.mean(np.sign(predicted) == np.sign(real)):.2f}")
fig, ax = plt.subplots(figsize=(4, 4))
ax.scatter(predicted, real)
lim = max(map(abs, predicted + real)) * 1.1
ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
ax.set(xlabel="change the graph predicts", ylabel="change in the model", title="Ablations")
plt.show()
