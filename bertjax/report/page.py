"""The report's HTML page (`render_html`) and its sections in page order (`SECTIONS`).

`bertjax.report.build_report` computes the numbers and `bertjax.report.figures` draws
them; this module lays them out, one helper per section, each ending in the section's
generated reading (`bertjax.report.reading`). Layers are numbered one way throughout
(`report.LAYER_NUMBERING`): transformer blocks 1..L, the embedding output 0, heads
0..H-1. Figures open at full size on a click; the page has a table of contents and
names the model analysed.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertjax.analysis.attention import patterns
from bertjax.report import reading

# id, title: the sections in page order (the table of contents).
SECTIONS = (
  ("text", "The text"),
  ("clark", "1. Where attention goes (Clark et al. 2019)"),
  ("patterns", "2. Attention pattern types (Kovaleva et al. 2019)"),
  ("task", "3. The scoring task"),
  ("ablation", "4. Head and layer ablation (Michel et al. 2019)"),
  ("pruning", "5. Head importance and pruning (Michel et al. 2019)"),
  ("anisotropy", "6. Anisotropy (Ethayarajh 2019)"),
  ("pos", "7. Part-of-speech probe (UD English EWT)"),
  ("effective", "8. Raw vs effective attention (Brunner et al. 2020)"),
  ("attribution", "9. Token attribution and head patching (negation)"),
  ("circuit", "10. The negation circuit (Syed et al. 2023; Hanna et al. 2024)"),
  ("outliers", "11. Outlier dimensions and massive activations (Kovaleva et al. 2021)"),
  ("sae", "12. A sparse dictionary of the middle layer (Gao et al. 2024)"),
  ("timing", "Run time"),
)
# Sections only some models get (absent from report.json and the page otherwise): id, title,
# the section of `SECTIONS` it follows.
MODEL_SECTIONS = (
  ("disentangled", "13. Content vs position in DeBERTa's scores (He et al. 2021)", "sae"),
)
_TITLES = {**dict(SECTIONS), **{k: t for k, t, _ in MODEL_SECTIONS}}


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.7em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:.6em 1em .6em 0;vertical-align:top;max-width:100%}
figure.wide{display:block;margin-right:0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figure a{cursor:zoom-in}figcaption{font-size:.85em;color:#555}
.note{background:#fff7e0;border-left:4px solid #e0a800;padding:.5em .8em}
.reading{background:#eef5fb;border-left:4px solid #3c7fb1;padding:.5em .8em}
.meta td{text-align:left}
nav.toc{background:#f7f7f9;border:1px solid #ddd;padding:.4em 1.2em;margin:1em 0}
nav.toc h2{border:0;margin:.3em 0;font-size:1.1em}
nav.toc ul{margin:.3em 0;padding-left:1.2em;list-style:none}
"""

# Figures drawn wider than half the page: shown on their own line, at the page's width.
_WIDE = {"pattern_examples", "effective"}


def html_escape(text: str) -> str:
  """`text` (any value, as `str`) escaped for HTML, quotes included."""
  return html.escape(str(text), quote=True)


def _fmt(x, digits: int = 3) -> str:
  if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
    return str(int(x))
  if isinstance(x, (float, np.floating)):
    return f"{float(x):.{digits}f}"
  return html_escape(str(x))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 3) -> str:
  head = "".join(f"<th>{html_escape(h)}</th>" for h in headers)
  body = "".join(
    "<tr>" + "".join(f"<td>{_fmt(v, digits)}</td>" for v in row) + "</tr>" for row in rows
  )
  return f"<table><tr>{head}</tr>{body}</table>"


def _fig(figs: dict, key: str, caption: str) -> str:
  """A figure that opens at full size on a click."""
  if key not in figs:
    return ""
  src, wide = html_escape(figs[key]), " class='wide'" if key in _WIDE else ""
  return (
    f'<figure{wide}><a href="{src}" target="_blank" title="open at full size">'
    f'<img src="{src}" alt="{html_escape(caption)}"></a>'
    f"<figcaption>{html_escape(caption)} (click to enlarge)</figcaption></figure>"
  )


def _layer_rows(columns: dict[str, Sequence[float]], first: int) -> list[list[Any]]:
  """Table rows `[layer number, values...]`; `first` is 1 for blocks, 0 with the embeddings."""
  n = len(next(iter(columns.values())))
  return [[i + first] + [columns[k][i] for k in columns] for i in range(n)]


def _head_name(layer_index: int, head: int) -> str:
  """Block `layer_index` (0-based) and head, as the page numbers them: `L1H0` is layer 1."""
  return f"L{layer_index + 1}H{head}"


def _top_heads(grid, k: int, largest: bool = True) -> str:
  """The `k` largest (or smallest) cells, keeping only those above (below) 0."""
  grid = np.asarray(grid)
  order = np.argsort(-grid.ravel() if largest else grid.ravel(), kind="stable")[:k]
  order = [i for i in order if (grid.ravel()[i] > 0 if largest else grid.ravel()[i] < 0)]
  return ", ".join(
    f"{_head_name(i // grid.shape[1], i % grid.shape[1])} ({grid.ravel()[i]:+.3f})" for i in order
  )


def _heading(section: str) -> str:
  return f"<h2 id='{section}'>{html_escape(_TITLES[section])}</h2>"


def _page_order() -> list[str]:
  """Every section id, `MODEL_SECTIONS` each after the section it follows."""
  order = []
  for key, _ in SECTIONS:
    order.append(key)
    order += [k for k, _, after in MODEL_SECTIONS if after == key]
  return order


def _contents(present: Sequence[str]) -> str:
  items = "".join(
    f"<li><a href='#{key}'>{html_escape(_TITLES[key])}</a></li>"
    for key in _page_order()
    if key in present
  )
  return f"<nav class='toc'><h2>Contents</h2><ul>{items}</ul></nav>"


def _reading(readings: dict[str, list[str]], section: str) -> str:
  """A section's generated reading (`reading`): the paper's finding against this model."""
  sentences = readings.get(section)
  if not sentences:
    return ""
  return (
    "<p class='reading'><b>Reading.</b> " + " ".join(html_escape(x) for x in sentences) + "</p>"
  )


def _header(r: dict) -> list[str]:
  """The document head, the title and the table naming the model and the run."""
  m, t = r["model"], r["text"]
  title = f"BERTology report: {m['name']}"
  meta = [("model", m["name"]), ("directory", m["path"])]
  if m.get("name_or_path") and m["name_or_path"] != m["name"]:
    meta.append(("trained from (config.json's _name_or_path)", m["name_or_path"]))
  meta += [
    ("type", m["model_type"]),
    ("layers x heads", f"{m['layers']} x {m['heads']}"),
    ("hidden size", m["hidden_size"]),
    ("parameters", f"{m['parameters']:,}"),
    ("text analysed", t["description"]),
    (
      "run time",
      (f"{r['timing']['total_seconds']:.1f} s ({r['run']['mode']} mode, {r['run']['backend']})"),
    ),
    ("generated", r["run"]["finished"]),
  ]
  return [
    (
      "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
      "<meta name='viewport' content='width=device-width, initial-scale=1'>"
      "<link rel='icon' href='data:,'>"
      f"<title>{html_escape(title)}</title><style>{_CSS}</style>"
      f"</head><body><h1>{html_escape(title)}</h1>"
    ),
    "<table class='meta'>"
    + "".join(f"<tr><th>{html_escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in meta)
    + "</table>",
    (
      "<p>Every number on this page is in <code>report.json</code> beside it. "
      f"Layers are numbered 1..{m['layers']} for the transformer blocks and 0 for the "
      "embedding output, in the text, the tables and the figures alike (L3H5 is head 5 "
      "of layer 3; heads are numbered from 0, as in head-mask arrays). Click a figure "
      "to open it at full size.</p>"
    ),
  ]


def _text_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """The built-in sentences by phenomenon (nothing for UD text)."""
  t = r["text"]
  if not t.get("phenomena"):
    return []
  return [
    _heading("text") + "<p>" + html_escape(t["about"]) + "</p>",
    _reading(reads, "text"),
    _table(
      ["phenomenon", "sentences", "negated", "questions"],
      [[k, *v] for k, v in t["phenomena"].items()],
    ),
  ]


def _clark_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 1: attention to [CLS], [SEP] and punctuation; entropy."""
  bl = r["clark"]["by_layer"]
  return [
    _heading("clark") + "<p>For every real query token, the attention mass a head puts on "
    "[CLS], on [SEP] tokens and on punctuation ('.' and ','), and the entropy of its attention "
    "distribution, averaged per sentence and then over sentences, as in Clark et al.'s "
    "released notebook. Clark et al. found BERT's middle layers attending heavily to [SEP] (a "
    "no-op when a head's function does not apply) and early layers attending broadly (high "
    "entropy).</p>",
    _reading(reads, "clark"),
    _fig(figs, "clark_layers", "Mass on [CLS], [SEP] and punctuation by layer"),
    _fig(figs, "entropy_layers", "Attention entropy by layer"),
    _fig(figs, "entropy_heads", "Attention entropy by layer and head"),
    _table(
      ["layer", "[CLS]", "[SEP]", "punctuation", "self", "previous", "next", "entropy (nats)"],
      _layer_rows(
        {k: bl[k] for k in ("cls", "sep", "punct", "self", "prev", "next", "entropy")}, first=1
      ),
    ),
  ]


def _patterns_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 2: Kovaleva et al.'s pattern types."""
  p = r["patterns"]
  names = list(patterns.PATTERN_TYPES)
  parts = [
    _heading("patterns") + "<p>Every head's map of every "
    f"input ({p['num_inputs']} sentence pairs: consecutive sentences of the text, so the "
    "block pattern can occur) is classified into Kovaleva et al.'s five types by a decision "
    "list over three features: mass on [CLS]/[SEP] (vertical), mass on the diagonal band "
    "(offsets -1, 0, +1), and the share of token-to-token mass inside the query's own "
    "sentence (block). Thresholds: " + html_escape(p["thresholds"]) + ".</p>",
    _reading(reads, "patterns"),
    _fig(figs, "pattern_layers", "Pattern types per layer"),
    _fig(figs, "pattern_heads", "Most frequent type of each head"),
    _table(
      ["", *names],
      [["all layers", *p["overall"]]]
      + [[f"layer {i + 1}", *row] for i, row in enumerate(p["per_layer"])],
    ),
    _fig(
      figs, "pattern_examples", "One example map of each type (the most typical one in one batch)"
    ),
  ]
  missing = [n for n in names if n not in p["examples"]]
  if missing:
    parts.append(
      f"<p>No example of {html_escape(', '.join(missing))} occurred in the batch "
      "the examples were drawn from.</p>"
    )
  return parts


def _task_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 3: the negation task and its probe on every layer."""
  task = r["task"]
  acc = task["probe_accuracy_by_layer"]
  return [
    _heading("task") + f"<p><b>{html_escape(task['name'])}</b>. {html_escape(task['why'])}"
    f"</p><p>Classifier: {html_escape(task['classifier'])}. {task['num_train']} training and "
    f"{task['num_test']} held-out sentences ({100 * task['test_negated_fraction']:.0f}% of the "
    "held-out ones negated). The same probe fitted on every layer's mean-pooled states shows "
    f"where negation is linearly readable: held-out accuracy {acc[0]:.3f} on the embeddings "
    f"(layer 0), best {max(acc):.3f} (layer {int(np.argmax(acc))}), "
    f"{task['test_accuracy']:.3f} on the final layer ({len(acc) - 1}).</p>",
    _reading(reads, "task"),
    _fig(figs, "task_layers", "Negation probe accuracy by layer"),
    _table(
      ["", "value"],
      [
        ["held-out accuracy (final layer; the ablation baseline)", task["test_accuracy"]],
        ["held-out cross-entropy (final layer)", task["test_loss"]],
        ["majority-class accuracy", task["majority_accuracy"]],
      ],
    ),
    _table(
      ["layer (0 = embeddings)", "held-out accuracy", "held-out cross-entropy"],
      _layer_rows({"a": acc, "l": task["probe_loss_by_layer"]}, first=0),
    ),
  ]


def _ablation_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 4: single heads and whole layers ablated."""
  ab = r["ablation"]
  delta = np.asarray(ab["head_loss"]) - ab["baseline_loss"]
  return [
    _heading("ablation") + "<p>Each head is ablated in turn "
    "(its output multiplied by 0) and the fixed negation head is scored on the held-out "
    f"sentences. Baseline: cross-entropy {ab['baseline_loss']:.4f}, accuracy "
    f"{ab['baseline_accuracy']:.4f}. Red cells: ablating that head hurts. Most harmful single "
    f"heads (loss up): {html_escape(_top_heads(delta, 3) or 'none')}; most helpful to remove "
    f"(loss down): {html_escape(_top_heads(delta, 3, False) or 'none')}. "
    "The layer chart masks all heads of one layer (the feed-forward part still runs) or skips "
    "the whole block (its output becomes its input); skipping the last block hands the fixed "
    "head a representation it was not fitted on, so expect a large loss there.</p>",
    _reading(reads, "ablation"),
    _fig(figs, "ablation_heads", "Loss change per ablated head"),
    _fig(figs, "ablation_layers", "Layer ablation: loss change"),
    _fig(figs, "ablation_layers_acc", "Layer ablation: accuracy"),
    _table(
      [
        "layer",
        "loss, heads masked",
        "accuracy, heads masked",
        "loss, layer skipped",
        "accuracy, layer skipped",
      ],
      _layer_rows(
        {
          "a": ab["layer_heads_loss"],
          "b": ab["layer_heads_accuracy"],
          "c": ab["layer_skip_loss"],
          "d": ab["layer_skip_accuracy"],
        },
        first=1,
      ),
    ),
  ]


def _pruning_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 5: head importance and the pruning curve."""
  ab = r["ablation"]
  rho = ab.get("importance_vs_ablation") or reading.importance_vs_ablation(ab)
  return [
    _heading("pruning") + "<p>Importance of head h is "
    "E<sub>x</sub>|dL(x)/d&xi;<sub>h</sub>| for a mask variable &xi; on the head's output "
    "(one backward pass over the training split), normalised per layer. Pruning masks the "
    f"least important {100 * r['settings']['prune_step']:.0f}% of all heads, re-estimates "
    "importance and repeats; each mask is scored on the held-out split. Importance is "
    "unsigned (how much the loss moves), so it is compared with the size of the single-head "
    "ablation loss change, |&Delta;L|: Spearman "
    f"{rho['spearman_abs']:.3f} over all heads, {rho['spearman_abs_within_layer']:.3f} within "
    "a layer (averaged over layers); against the signed &Delta;L, which importance does not "
    f"estimate, {rho['spearman_signed']:.3f}. Best held-out accuracy along the curve: "
    f"{max(ab['pruning_accuracy']):.3f} with "
    f"{100 * ab['pruning_fraction'][int(np.argmax(ab['pruning_accuracy']))]:.0f}% of the heads "
    "masked.</p>",
    _reading(reads, "pruning"),
    _fig(figs, "importance", "Head importance"),
    _fig(figs, "pruning", "Pruning curve: accuracy"),
    _fig(figs, "pruning_loss", "Pruning curve: loss"),
    _table(
      ["heads pruned (%)", "held-out accuracy", "held-out cross-entropy"],
      [
        [100 * f, a, l]
        for f, a, l in zip(ab["pruning_fraction"], ab["pruning_accuracy"], ab["pruning_loss"])
      ],
      3,
    ),
  ]


def _anisotropy_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 6: Ethayarajh's anisotropy."""
  an = r["anisotropy"]
  return [
    _heading("anisotropy") + "<p>Mean cosine similarity between the "
    f"representations of random pairs of tokens ({an['num_tokens']} real, non-special tokens "
    "of the text), per layer (0 = the embedding output). High values mean the "
    "representations occupy a narrow cone; Ethayarajh used it as the baseline against which "
    "to read contextual similarity. The mean-centred curve removes the common direction.</p>",
    _reading(reads, "anisotropy"),
    _fig(figs, "anisotropy", "Anisotropy by layer"),
    _table(
      ["layer (0 = embeddings)", "anisotropy", "mean-centred"],
      _layer_rows({"a": an["anisotropy"], "c": an["anisotropy_centered"]}, first=0),
    ),
  ]


def _pos_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 7: the UPOS probe, or why it did not run."""
  pos = r["pos"]
  if not pos.get("available"):
    return [_heading("pos"), f"<p class='note'>Not available: {html_escape(pos['reason'])}</p>"]
  return [
    _heading("pos"),
    (
      f"<p>A linear probe on each layer's first-subword word vectors predicts the UPOS tag "
      f"({pos['num_tags']} tags) of {pos['num_test_words']} held-out words "
      f"({pos['num_sentences']} sentences of {html_escape(', '.join(pos['files']))}, split "
      "by sentence). The control task (Hewitt &amp; Liang 2019) gives each word type a "
      "random tag; selectivity is the difference. Best layer: "
      f"{pos['best_layer']} (0 = the embedding output).</p>"
    ),
    _reading(reads, "pos"),
    _fig(figs, "pos", "UPOS probe accuracy by layer"),
    _table(
      ["layer (0 = embeddings)", "accuracy", "control", "selectivity"],
      _layer_rows(
        {"a": pos["accuracy"], "c": pos["control_accuracy"], "s": pos["selectivity"]}, first=0
      ),
    ),
  ]


def _effective_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 8: raw vs effective attention."""
  eff = r["effective"]
  st = eff["stats"]
  rows = [
    [
      d + 1,
      np.mean(st["raw"]["cls"][d]),
      np.mean(st["effective"]["cls"][d]),
      np.mean(st["raw"]["sep"][d]),
      np.mean(st["effective"]["sep"][d]),
      np.mean(st["effective"]["raw_corr"][d]),
    ]
    for d in range(len(st["raw"]["cls"]))
  ]
  return [
    _heading("effective") + "<p>A head's output is "
    "A&middot;T with T = (E W<sub>V</sub> + b<sub>V</sub>) W<sub>O</sub>; any component of an "
    "attention row in the left null space of T changes nothing, so it cannot be read as "
    "'what the head uses'. Effective attention removes it. The null space exists only when a "
    f"sequence is longer than the head dimension ({eff['head_dim']}), so this section reads "
    f"{eff['num_passages']} passages of consecutive sentences (about "
    f"{eff['mean_passage_tokens']:.0f} tokens). The example heads are those with the most raw "
    "attention on [CLS] + [SEP]; effective attention can be negative (red on its "
    "diverging colour scale).</p>",
    _reading(reads, "effective"),
    _fig(figs, "effective", "Raw vs effective attention"),
    _table(
      [
        "layer",
        "raw [CLS]",
        "effective [CLS]",
        "raw [SEP]",
        "effective [SEP]",
        "corr(raw, effective)",
      ],
      rows,
    ),
  ]


def _attribution_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 9: token attribution and head patching, when the report ran it."""
  a = r.get("attribution")
  if not a:
    return []
  if not a.get("available"):
    return [
      _heading("attribution"),
      f"<p class='note'>Not available: {html_escape(a.get('reason', ''))}</p>",
    ]
  cues = a["cues"]
  return [
    _heading("attribution")
    + (
      "<p>Which input token explains the scoring task's negation probe (section 3)? For "
      f"each of {len(cues['sentences'])} negated sentences with a one-token cue (not, never, "
      "n't, nobody, ...), each method scores every input token's share in the mean-pooled "
      "final state the probe reads (context-mixing methods: the final rolled-out matrix "
      "averaged over the sentence's tokens; gradient methods: the probe logit's "
      "attribution), and the rank of the cue among the sentence's word pieces is recorded. "
      f"Then {a['patching']['pairs']} negated sentences are each paired with their "
      "affirmative twin (the cue replaced by a same-length word: not &rarr; also, never "
      "&rarr; often), and every head's output is patched from the negated run into the "
      "twin's, exactly and by the gradient approximation.</p>"
    ),
    _reading(reads, "attribution"),
    _fig(figs, "attribution_methods", "Rank of the negation cue by method"),
    _table(
      ["method", "cue ranked first", "mean reciprocal rank", "mean rank"],
      [[k, v["top1"], v["mrr"], v["mean_rank"]] for k, v in cues["stats"].items()],
    ),
    _fig(
      figs, "attribution_patching", "Share of the negation logit restored by patching each head"
    ),
  ]


def _head_list(heads) -> str:
  """`[layer (from 1), head]` pairs as the page names heads (L3H5)."""
  return ", ".join(f"L{l}H{h}" for l, h in heads) or "none"


def _circuit_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 10: EAP and EAP-IG against exact edge patching, and the circuits' faithfulness."""
  c = r.get("circuit")
  if not c:
    return []
  if not c.get("available"):
    return [
      _heading("circuit"),
      f"<p class='note'>Not available: {html_escape(c.get('reason', ''))}</p>",
    ]
  a, f = c["agreement"], c["faithfulness"]
  return [
    _heading("circuit") + "<p>The model as a graph: the embeddings, every head and every FFN "
    "send into the residual stream; every later head's query, key and value inputs, every "
    f"FFN and the probe's input receive from it ({c['edges']:,} edges). Each edge is scored "
    "from the negated sentences (clean) and their affirmative twins (corrupted) by edge "
    "attribution patching (EAP, one gradient) and EAP-IG (integrated gradients), and a seeded "
    f"sample of {a['eap']['edges']} edges is patched exactly (the edge carrying its "
    f"corrupted value) on {c['pairs']} pairs; probe logit {c['clean_logit']:.2f} clean, "
    f"{c['corrupted_logit']:.2f} corrupted. A circuit keeps its edges clean and corrupts every "
    "other; its faithfulness is (circuit - corrupted) / (clean - corrupted).</p>",
    _reading(reads, "circuit"),
    _fig(figs, "circuit", "EAP and EAP-IG against exact patching; faithfulness by size"),
    _table(
      ["edges in the top-k circuit", "faithfulness"],
      [[e, v] for e, v in zip(f["edges"], f["normalized"])],
      2,
    ),
    _table(["edge (EAP-IG's largest)", "score"], c["top_edges"], 3),
  ]


def _outliers_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 11: outlier dimensions by layer, massive activations, special-token attention."""
  o = r.get("outliers")
  if not o:
    return []
  m, mass = o["massive"], o["special_mass"]
  ratio = np.asarray(m["max_abs"], float) / np.asarray(m["median_abs"], float)
  z = np.abs(np.asarray(o["z"], float))
  return [
    _heading("outliers") + "<p>For every layer, each dimension's mean activation over the "
    f"text's {o['tokens']} real tokens, as a z-score among the layer's {o['hidden_size']} "
    "dimensions; a dimension is an <b>outlier</b> of the model when |z| >= 3 in at least 25% "
    "of the layers (Kovaleva et al. 2021, as Puccetti et al. 2022 read them). Disabling one "
    "sets every norm's scale and bias to zero there. Massive activations (Sun et al. 2024): "
    "entries above both 100 and 1000 times the layer's median magnitude. The attention on "
    "special tokens is each sentence's mean over real query rows, heads and layers: "
    f"{np.mean(mass['intact']):.3f} intact"
    + (
      f", {np.mean(mass['disabled']):.3f} with the outliers disabled" if "disabled" in mass else ""
    )
    + ".</p>",
    _reading(reads, "outliers"),
    _fig(figs, "outliers", "The outlier dimensions' |z| by layer"),
    _table(
      [
        "layer",
        "outlier dimensions",
        "largest |z|",
        "massive entries",
        "largest / median magnitude",
      ],
      _layer_rows(
        {"n": o["outliers_per_layer"], "z": z.max(1), "c": m["count"], "r": ratio}, first=1
      ),
      1,
    ),
  ]


def _sae_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 12: the SAE's reconstruction and dead latents, and what a few latents fire on."""
  d = r.get("sae")
  if not d:
    return []
  if not d.get("available"):
    return [
      _heading("sae"),
      f"<p class='note'>Not available: {html_escape(d.get('reason', ''))}</p>",
    ]
  rows = [
    [f"latent {k}", f"{html_escape(t['token'])} ({t['value']:.2f})", html_escape(t["text"])]
    for k, items in d["top"].items()
    for t in items[:3]
  ]
  return [
    _heading("sae") + f"<p>A top-k sparse autoencoder (k = {d['k']}, {d['latents']:,} "
    f"latents, AuxK; Gao et al. 2024) on layer {d['layer']}'s output, trained for "
    f"{d['steps']} steps on {d['train_tokens']:,} tokens of the text and evaluated on "
    f"{d['held_tokens']:,} held-out tokens ({d['held_sentences']} sentences): fraction of "
    f"variance unexplained {d['fvu']:.3f}, {d['l0']:.1f} active latents per token, "
    f"{d['dead']:.1%} of the latents dead (firing on no held-out token), {d['dense']:.1%} "
    "dense (firing on more than 10% of them). Below, eight latents drawn at random among "
    "those that fire on held-out text, each with its strongest tokens in context.</p>",
    _reading(reads, "sae"),
    "<table><tr><th>latent</th><th>token (activation)</th><th>context</th></tr>"
    + "".join(f"<tr><td>{a}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in rows)
    + "</table>",
  ]


def _disentangled_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """Section 13 (DeBERTa only): the score terms' shares, and the heads position drives."""
  d = r.get("disentangled")
  if not d:
    return []
  if not d.get("available"):
    return [
      _heading("disentangled"),
      f"<p class='note'>Not available: {html_escape(d.get('reason', ''))}</p>",
    ]
  bl, thr = d["by_layer"], d["threshold"]
  terms = ", ".join(d["position_terms"]) or "none (relative_attention is off)"
  parts = [
    _heading("disentangled") + "<p>DeBERTa's attention logit is the sum of three terms "
    "(He et al. 2021): content-to-content q<sub>i</sub>&middot;k<sub>j</sub>, "
    "content-to-position (c2p: the query reads the relative position) and "
    "position-to-content (p2c: the key reads it); this model has the position terms "
    f"{html_escape(terms)}. Over {d['num_pairs']} real (query, key) pairs of the text, each "
    "term is centred within its query row (softmax ignores a row's constant), and a "
    "term's share of a head's score variance is Cov(term, sum) / Var(sum): the three shares "
    "sum to 1, and can be negative when one term cancels another. A head is <b>mostly "
    f"positional</b> when c2p + p2c carry over {thr} of it. TV is the total-variation "
    "distance between a query's attention with and without the position terms, averaged "
    f"over {d['num_rows']} query rows: 'direct' removes them from that head alone (its "
    "inputs unchanged), 'all layers' from every layer at once (one patched forward).</p>",
    _reading(reads, "disentangled"),
    _fig(figs, "disentangled_layers", "Share of c2p and p2c by layer"),
    _fig(figs, "disentangled_heads", "Positional share of each head"),
    _table(
      [
        "layer",
        "c2c share",
        "c2p share",
        "p2c share",
        "positional share",
        "mostly positional heads",
        "TV direct",
        "TV all layers",
      ],
      _layer_rows(
        {
          k: bl[k]
          for k in (
            "share_c2c",
            "share_c2p",
            "share_p2c",
            "positional_share",
            "mostly_positional",
            "tv_direct_c2p+p2c",
            "tv_total",
          )
        },
        first=1,
      ),
    ),
    (
      f"<p>Mostly positional heads ({len(d['positional_heads'])}): "
      f"{html_escape(_head_list(d['positional_heads']))}.</p>"
    ),
  ]
  rows = []
  kinds = (
    ("prev_next", f"previous/next token (section 1: mass > {d['prev_next_min']})"),
    ("diagonal", f"most frequent type {' or '.join(d['diagonal_types'])} (section 2)"),
  )
  for key, what in kinds:
    o = d["overlap"].get(key)
    if o is None:
      rows.append([what, "not available (its section failed)", "", "", ""])
      continue
    rate = lambda x: "n/a" if x is None else f"{x:.2f}"
    rows.append(
      [
        what,
        _head_list(o["heads"]),
        _head_list(o["positional"]),
        rate(o["positional_rate"]),
        rate(o["other_rate"]),
      ]
    )
  parts.append(
    _table(
      [
        "heads with a positional pattern",
        "heads",
        "of them mostly positional",
        "share mostly positional",
        "share among the other heads",
      ],
      rows,
    )
  )
  return parts


def _timing_html(r: dict, figs: dict, reads: dict) -> list[str]:
  """How long each stage took."""
  compiled = r.get("compiled_programs") or {}
  return [
    _heading("timing")
    + _table(
      ["stage", "seconds", "XLA programs compiled"],
      [[k, v, compiled.get(k, "")] for k, v in r["timing"].items()],
      1,
    )
  ]


# The page's body after its header, in the order of `SECTIONS`: (section id, the results it
# reads, its helper).
_SECTION_HTML = (
  ("text", "text", _text_html),
  ("clark", "clark", _clark_html),
  ("patterns", "patterns", _patterns_html),
  ("task", "task", _task_html),
  ("ablation", "ablation", _ablation_html),
  ("pruning", "ablation", _pruning_html),
  ("anisotropy", "anisotropy", _anisotropy_html),
  ("pos", "pos", _pos_html),
  ("effective", "effective", _effective_html),
  ("attribution", "attribution", _attribution_html),
  ("circuit", "circuit", _circuit_html),
  ("outliers", "outliers", _outliers_html),
  ("sae", "sae", _sae_html),
  ("disentangled", "disentangled", _disentangled_html),
  ("timing", "timing", _timing_html),
)


def _failed_note(section: str, what: str, error: str) -> list[str]:
  return [
    _heading(section),
    f"<p class='note'><b>{html_escape(what)}</b>: {html_escape(error)}</p>",
  ]


def _section(r: dict, figs: dict, reads: dict, section: str, source: str, helper) -> list[str]:
  """One section's HTML; a section that failed (or cannot be laid out) says so, with the
  error, in place of its tables and figures, as one left out (`build_report(sections=...)`)
  says why."""
  data = r.get(source)
  if isinstance(data, dict) and data.get("failed"):
    return _failed_note(section, "This section failed, so it has no numbers", data["error"])
  if isinstance(data, dict) and data.get("skipped"):
    return _failed_note(section, "This section was not run", data["reason"])
  try:
    parts = helper(r, figs, reads)
  except Exception as e:  # noqa: BLE001 (the rest of the page is still written)
    return _failed_note(section, "This section could not be laid out", f"{type(e).__name__}: {e}")
  error = (r.get("figure_errors") or {}).get(section)
  if error and parts:
    parts = [*parts, f"<p class='note'>Its figures could not be drawn: {html_escape(error)}</p>"]
  return parts


def _graph_link(g: dict | None) -> str:
  """A line linking the attribution graph page, when the report wrote one (`--transcoders`)."""
  if not g:
    return ""
  if g.get("failed") or g.get("skipped"):
    return f"<p class='note'>Attribution graph: {html_escape(g.get('error') or g['reason'])}</p>"
  scores = ", ".join(f"{k} {v:.2f}" for k, v in g["scores"].items())
  return (
    f"<p>The <a href='{html_escape(g['page'])}'>attribution graph</a> of "
    f"&ldquo;{html_escape(g['sentence'])}&rdquo; for the task's probe: {g['features']} "
    f"features and {g['edges']} edges kept ({scores}); hover a feature for its top "
    f"contexts in {html_escape(g['contexts'])}.</p>"
  )


def render_html(r: dict, figs: dict[str, str]) -> str:
  """The report page from the results of `build_report` and its figure file names.

  Args:
    r: the results of `build_report` (as in `report.json`). Each section's generated
      reading is `r["readings"]` when present (as `build_report` stores it), else
      computed here by `reading.readings` from the same numbers.
    figs: figure key -> file name, as `figures.write_figures` returns them.

  Returns:
    The whole HTML document.
  """
  reads = r.get("readings") or reading.readings(r)
  present = [key for key, _ in SECTIONS if key != "text" or r["text"].get("phenomena")]
  present += [key for key, _, _ in MODEL_SECTIONS if r.get(key)]
  parts = [*_header(r), _graph_link(r.get("graph")), _contents(present)]
  for section, source, helper in _SECTION_HTML:
    parts.extend(_section(r, figs, reads, section, source, helper))
  parts.append("</body></html>")
  return "\n".join(x for x in parts if x)
