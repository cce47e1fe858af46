"""An attribution graph as an interactive page: nodes by layer and position, edges by weight,
and on hover a feature's top-activating contexts.

`feature_contexts` finds, over a text (the report and `experiments/attribution_graphs.py` read
WikiText-2), the tokens where each of a graph's features fires most; `write` lays out a pruned
graph (`bertjax.analysis.circuits.graphs.view`) as one self-contained HTML file: an SVG whose
x is the position and y the layer (embeddings at the bottom, the targets on top), each node's
area its influence on the targets, each edge blue where it excites and red where it inhibits,
its width the weight's size. Hovering (or focusing, with the keyboard) a node shows what it
is, its activation and influence, its strongest edges and, for a feature, its contexts with
the firing token marked; the node's edges are drawn over the rest.
"""

from __future__ import annotations

import functools
import html
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from bertjax.analysis.batching import as_batch
from bertjax.analysis.circuits import transcoders as tcs
from bertjax.model.config import BertConfig

Params = dict[str, Any]


@functools.partial(jax.jit, static_argnums=(1, 2))
def _latents(tc: Params, tc_config: tcs.TranscoderConfig, layer: int, x, columns):
  return tcs.latents_at(tc, tc_config, layer, x)[:, columns]


def feature_contexts(
  params: Params,
  config: BertConfig,
  tc: Params,
  tc_config: tcs.TranscoderConfig,
  tokenizer,
  batches: Iterable,
  features: Iterable[tuple[int, int]],
  *,
  top: int = 5,
  width: int = 8,
) -> list[list[dict[str, Any]]]:
  """Each feature's `top` highest activations over the real tokens of `batches`.

  Args:
    features: (layer, latent) pairs, as the rows of a graph's `features`.
    width: tokens of context kept on each side of the firing token.

  Returns:
    One list per feature, highest first, of {"value", "before", "token", "after"}: the
    latent's activation and the text around the token (decoded by `tokenizer`); only
    tokens where it fires (activation > 0), so a list may be shorter than `top`.
  """
  if top < 1 or width < 0:
    raise ValueError(f"top={top} must be >= 1 and width={width} >= 0")
  features = [(int(layer), int(latent)) for layer, latent in features]
  for layer, latent in features:
    if not (0 <= layer < tc_config.layers and 0 <= latent < tc_config.latents):
      raise ValueError(
        f"feature (layer {layer}, latent {latent}) is not in a transcoder of "
        f"{tc_config.layers} layers x {tc_config.latents} latents"
      )
  by_layer: dict[int, list[int]] = {}
  for layer, latent in features:
    by_layer.setdefault(layer, [])
    if latent not in by_layer[layer]:
      by_layer[layer].append(latent)
  best: dict[tuple[int, int], list[tuple[float, int, int, int]]] = {f: [] for f in features}
  rows = []  # each batch's input ids, for the contexts
  for b, batch in enumerate(batches):
    batch = as_batch(batch)
    ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"]) > 0
    rows.append(ids)
    x, _ = tcs.activations(params, config, [batch])  # (real tokens, L, d), row-major
    seq, pos = np.nonzero(mask)
    n = len(x)  # padded to a multiple of 512 rows, so that batches share compiled programs
    x = np.concatenate([x, np.zeros((-n % 512, *x.shape[1:]), x.dtype)])
    for layer, latents in by_layer.items():
      z = np.asarray(_latents(tc, tc_config, layer, x[:, layer], np.asarray(latents)))[:n]
      for j, latent in enumerate(latents):
        keep = best[(layer, latent)]
        for i in np.argsort(-z[:, j], kind="stable")[:top]:
          if z[i, j] > 0:
            keep.append((float(z[i, j]), b, int(seq[i]), int(pos[i])))
        keep.sort(key=lambda t: -t[0])
        del keep[top:]

  def text(ids):  # the tokenizer's decoder joins the pieces and drops special tokens
    return tokenizer.decode(ids) if len(ids) else ""

  out = []
  for feature in features:
    found = []
    for value, b, s, p in best[feature]:
      line = rows[b][s]
      found.append(
        {
          "value": value,
          "before": text(line[max(0, p - width) : p]),
          "token": tokenizer.convert_ids_to_tokens([line[p]])[0],
          "after": text(line[p + 1 : p + 1 + width]),
        }
      )
    out.append(found)
  return out


def view_features(view: Mapping) -> dict[int, tuple[int, int]]:
  """The features of a pruned graph's `view`: {index into view["nodes"]: (layer, latent)},
  what `feature_contexts` reads and `write`'s contexts are keyed by."""
  return {
    i: (n["layer"], n["latent"]) for i, n in enumerate(view["nodes"]) if n["kind"] == "feature"
  }


_LEFT = 50  # room for the layer labels, left of the first column


def _layout(view: Mapping) -> list[tuple[float, float, float]]:
  # (x, y, largest radius) of each node: its position's column, its layer's row (the
  # embeddings at the bottom, the targets on top). Nodes sharing a cell spread across its
  # 84 x 48 px in rows of at most 8, each small enough not to cover its neighbours (a
  # covered node could not be hovered).
  nodes = view["nodes"]
  top = max(n["layer"] for n in nodes)
  cells: dict[tuple, list[int]] = {}
  for i, n in enumerate(nodes):
    pos = n.get("position")
    column = len(view["tokens"]) if pos is None else pos  # a pooled target: its own column
    cells.setdefault((column, n["layer"]), []).append(i)
  where = [(0.0, 0.0, 0.0)] * len(nodes)
  for (column, layer), members in cells.items():
    per_row = min(len(members), 8)
    rows = -(-len(members) // per_row)
    dx, dy = 84.0 / (per_row + 1), 48.0 / (rows + 1)
    cap = max(1.5, min(14.0, dx / 2 - 0.5, dy / 2 - 0.5 if rows > 1 else 14.0))
    for k, i in enumerate(members):
      row, slot = divmod(k, per_row)
      x = _LEFT + 90.0 * column + 3 + dx * (slot + 1)
      y = 60.0 * (top - layer) + 40 + (dy * (row + 1) - 24 if rows > 1 else 0)
      where[i] = (x, y, cap)
  return where


def write(
  path,
  view: Mapping,
  contexts: Mapping[int, Sequence[Mapping]] | None = None,
  *,
  title: str = "Attribution graph",
  note: str = "",
) -> pathlib.Path:
  """Writes the pruned graph `view` as one self-contained HTML page.

  Args:
    contexts: {index into view["nodes"]: `feature_contexts`' list} for the features whose
      contexts the hover shows.
    note: a line under the title (what the contexts were read from, the settings); the
      page adds how much of the pruned graph a capped view (`graphs.view`'s `max_edges`) shows.
  """
  nodes = list(view["nodes"])
  if view.get("kept_edges", 0) > len(view["edges"]):
    note = (
      f"{note} Drawn: the {len(view['edges']):,} edges the pruning scores highest of its "
      f"{view['kept_edges']:,}, and the {len(nodes):,} nodes they join of its "
      f"{view['kept_nodes']:,}."
    ).strip()
  if not nodes:
    raise ValueError("the graph has no nodes to draw (was everything pruned?)")
  contexts = {int(k): list(v) for k, v in (contexts or {}).items()}
  bad = [k for k in contexts if not (0 <= k < len(nodes)) or nodes[k]["kind"] != "feature"]
  if bad:
    raise ValueError(f"contexts are given for nodes {bad}, which are not features of the view")
  where = _layout(view)
  top = max(n["layer"] for n in nodes)
  tokens = [str(t) for t in view["tokens"]]
  influence = np.asarray([max(n.get("influence", 0.0), 0.0) for n in nodes])
  radius = 4 + 10 * np.sqrt(influence / max(influence.max(), 1e-12))
  radius = np.minimum(radius, [cap for _, _, cap in where])
  weights = np.abs([w for _, _, w in view["edges"]]) if view["edges"] else np.ones(1)
  scale = max(float(weights.max()), 1e-12)
  width = _LEFT + 90 * (len(tokens) + 1) + 40
  height = 60 * (top + 1) + 110
  data = {
    "tokens": tokens,
    "targets": list(view.get("targets", [])),
    "nodes": [
      {**n, "x": x, "y": y, "r": float(r), "contexts": contexts.get(i, [])}
      for i, (n, (x, y, _), r) in enumerate(zip(nodes, where, radius))
    ],
    "edges": [[int(s), int(t), float(w)] for s, t, w in view["edges"]],
  }
  svg = [f'<svg id="graph" viewBox="0 0 {width} {height}" width="{width}" height="{height}">']
  svg.append('<g id="edges" pointer-events="none">')
  for k, (s, t, w) in enumerate(data["edges"]):
    (x1, y1, _), (x2, y2, _) = where[s], where[t]
    colour = "#2166ac" if w > 0 else "#b2182b"
    svg.append(
      f'<line id="e{k}" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
      f'stroke="{colour}" stroke-width="{0.5 + 4 * abs(w) / scale:.2f}" stroke-opacity="0.35"/>'
    )
  svg.append('</g><g id="nodes">')
  fills = {"feature": "#f4a582", "error": "#bababa", "embedding": "#92c5de", "target": "#4d4d4d"}
  for i, n in enumerate(data["nodes"]):
    svg.append(
      f'<circle id="n{i}" class="node {n["kind"]}" data-index="{i}" tabindex="0" '
      f'cx="{n["x"]:.1f}" cy="{n["y"]:.1f}" r="{n["r"]:.1f}" fill="{fills[n["kind"]]}" '
      f'stroke="#333" stroke-width="0.6"/>'
    )
  svg.append("</g><g id='axes' font-size='11' fill='#333' pointer-events='none'>")
  for p, token in enumerate(tokens):
    x = _LEFT + 90 * p + 45
    svg.append(f'<text x="{x}" y="{height - 30}" text-anchor="middle">{html.escape(token)}</text>')
  for layer in range(-1, top + 1):
    name = "emb" if layer == -1 else ("target" if layer == top else f"L{layer + 1}")
    svg.append(f'<text x="2" y="{60 * (top - layer) + 44}">{name}</text>')
  svg.append("</g></svg>")
  blob = json.dumps(data).replace("</", "<\\/")
  page = _PAGE.format(
    title=html.escape(title),
    note=html.escape(note),
    scores=html.escape(", ".join(f"{k} {v:.3f}" for k, v in dict(view.get("scores", {})).items())),
    svg="\n".join(svg),
    data=blob,
  )
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(page, encoding="utf-8")
  return path


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<link rel="icon" href="data:,">
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
#wrap {{ display: flex; gap: 1.5em; align-items: flex-start; }}
#canvas {{ overflow-x: auto; border: 1px solid #ddd; }}
#detail {{ min-width: 22em; max-width: 30em; }}
#detail mark {{ background: #fddbc7; font-weight: bold; }}
#detail li {{ margin-bottom: .3em; }}
.node {{ cursor: pointer; }}
.node:focus, .node.on {{ stroke: #000; stroke-width: 2.5; outline: none; }}
line.on {{ stroke-opacity: .95; }}
</style></head><body>
<h1>{title}</h1>
<p>{note}</p>
<p>Scores: {scores}. Hover over a node (or tab to it) for what it is and what it connects to;
a feature shows the contexts where it fires most.</p>
<div id="wrap"><div id="canvas">
{svg}
</div><div id="detail"><p>No node selected.</p></div></div>
<script id="graph-data" type="application/json">{data}</script>
<script>
const G = JSON.parse(document.getElementById("graph-data").textContent);
const detail = document.getElementById("detail");
function esc(s) {{ const d = document.createElement("span"); d.textContent = s; return d.innerHTML; }}
function name(n) {{
  if (n.kind === "target") return "target: " + (G.targets[n.index] || "target " + n.index);
  if (n.kind === "embedding") return "embedding of \u201c" + G.tokens[n.position] + "\u201d";
  const where = "layer " + (n.layer + 1) + " at \u201c" + G.tokens[n.position] + "\u201d";
  return n.kind === "feature" ? "feature " + n.latent + ", " + where : "error, " + where;
}}
function show(i) {{
  document.querySelectorAll(".on").forEach(e => e.classList.remove("on"));
  const n = G.nodes[i];
  document.getElementById("n" + i).classList.add("on");
  const ins = [], outs = [];
  G.edges.forEach((e, k) => {{
    if (e[1] === i) ins.push([e[2], e[0]]);
    if (e[0] === i) outs.push([e[2], e[1]]);
    if (e[0] === i || e[1] === i) document.getElementById("e" + k).classList.add("on");
  }});
  const strongest = list => list.sort((a, b) => Math.abs(b[0]) - Math.abs(a[0])).slice(0, 5)
    .map(([w, j]) => "<li>" + esc(name(G.nodes[j])) + ": " + w.toPrecision(3) + "</li>").join("");
  let h = "<h2>" + esc(name(n)) + "</h2><p>influence " + n.influence.toPrecision(3);
  if (n.activation !== undefined) h += ", activation " + n.activation.toPrecision(3);
  if (n.value !== undefined) h += ", value " + n.value.toPrecision(3);
  h += "</p>";
  if (n.kind === "feature") {{
    h += "<h3>Top contexts</h3>";
    h += n.contexts.length ? "<ol class='contexts'>" + n.contexts.map(c => "<li>" + esc(c.before) +
      " <mark>" + esc(c.token) + "</mark> " + esc(c.after) + " <small>(" +
      c.value.toPrecision(3) + ")</small></li>").join("") + "</ol>" : "<p>none read</p>";
  }}
  if (ins.length) h += "<h3>Strongest inputs</h3><ul>" + strongest(ins) + "</ul>";
  if (outs.length) h += "<h3>Strongest outputs</h3><ul>" + strongest(outs) + "</ul>";
  detail.innerHTML = h;
}}
document.querySelectorAll(".node").forEach(c => {{
  const i = Number(c.dataset.index);
  c.addEventListener("mouseenter", () => show(i));
  c.addEventListener("focus", () => show(i));
}});
</script></body></html>
"""


def report_graph(
  params: Params,
  config: BertConfig,
  tokenizer,
  transcoders,
  task: Mapping,
  sentences: Sequence,
  out_dir,
  *,
  data_dir=None,
  contexts_windows: int = 64,
) -> dict[str, Any]:
  """The report's graph page: the attribution graph of the first negated sentence of
  `sentences` for the report's negation probe (section 3: its negated-minus-affirmative
  logit as a `Projection` of the pooled state), pruned as circuit-tracer does (node
  threshold 0.8, edge 0.98), written to `out_dir/graph.html` with each feature's top
  contexts in the first `contexts_windows` paragraphs of WikiText-2's validation text (their
  first 128 tokens) when `data_dir` holds it, else in `sentences`.

  Args:
    transcoders: a directory written by `transcoders.save` (a CLT or PLT of this model).

  Returns:
    What report.json keeps: the page, the sentence, the scores, the kept nodes and edges,
    and where the contexts came from.
  """
  from bertjax.analysis.circuits import graphs as G
  from bertjax.report.sections import _task_probe
  from bertjax.tasks import passages

  tc, tc_config = tcs.load(transcoders)
  if tc_config.d_model != config.hidden_size or tc_config.layers != config.depth:
    raise ValueError(
      f"transcoders={transcoders}: a transcoder of {tc_config.layers} layers x "
      f"{tc_config.d_model}, for a model of {config.depth} x {config.hidden_size}"
    )
  negated = [s.text for s in sentences if getattr(s, "negated", False)]
  if not negated:
    raise ValueError("the report's sentences hold no negated sentence to explain")
  w, _ = _task_probe(task)
  direction = tuple(float(v) for v in w[:, 1] - w[:, 0])
  ids = np.asarray(tokenizer.encode([negated[0]]).input_ids)[0]
  target = G.Projection(direction, "the probe's negated logit")
  graph = G.attribute(params, config, tc, tc_config, ids, [target])
  view = G.view(graph, G.prune(graph, 0.8, 0.98), tokenizer.convert_ids_to_tokens(ids))
  text = pathlib.Path(data_dir or "") / "wikitext2_tokens" / "valid.txt"
  if data_dir is not None and text.is_file():
    windows = passages.wikitext_paragraphs(text, contexts_windows)
    source = f"{len(windows)} paragraphs of WikiText-2's validation text"
  else:
    windows = [s.text for s in sentences]
    source = f"the report's {len(windows)} sentences (no WikiText-2 found)"
  batches = [
    tokenizer.encode(windows[i : i + 16], max_length=128, truncation=True)
    for i in range(0, len(windows), 16)
  ]
  feats = view_features(view)
  found = feature_contexts(params, config, tc, tc_config, tokenizer, batches, feats.values())
  page = write(
    pathlib.Path(out_dir) / "graph.html",
    view,
    dict(zip(feats, found)),
    title=f"Attribution graph: {negated[0]}",
    note=f"Target: the negation probe's logit (section 3). Contexts: {source}.",
  )
  return {
    "page": page.name,
    "sentence": negated[0],
    "scores": view["scores"],
    "nodes": len(view["nodes"]),
    "features": len(feats),
    "edges": len(view["edges"]),
    "contexts": source,
  }
