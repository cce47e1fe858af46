"""The attribution graph's interactive page (`bertjax.report.graph_page`): a feature's top
contexts against every token's latents computed directly, and the page in headless Chromium
(Debian's, driven by Playwright): every node and edge drawn, no console error, and hovering a
feature shows its contexts with the firing token marked."""

import functools
import html
import http.server
import threading

import numpy as np
import pytest
from test_report import CHROMIUM_ARGS, _chromium, _QuietHandler

import bertjax
from bertjax.analysis.circuits import graphs as G
from bertjax.analysis.circuits import transcoders as T
from bertjax.report import graph_page
from bertjax.tasks.sentences import load_sentences

H, L, M, K = 16, 2, 24, 4


@pytest.fixture(scope="module")
def setup(minilm_dir):
  """A tiny random BERT on MiniLM's real tokenizer, a random CLT, a graph and its contexts."""
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  config = bertjax.BertConfig(
    vocab_size=tok.vocab_size,
    hidden_size=H,
    num_hidden_layers=L,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=64,
  )
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  tc_config = T.TranscoderConfig(d_model=H, layers=L, latents=M, cross_layer=True, k=K)
  x = rng.standard_normal((64, L, H)).astype(np.float32)
  tc = T.init(1, tc_config, x, x)
  ids = np.asarray(tok.encode(["The old man did not believe it."]).input_ids)[0]
  direction = tuple(float(v) for v in rng.standard_normal(H))
  graph = G.attribute(params, config, tc, tc_config, ids, [G.Projection(direction, "probe")])
  view = G.view(graph, G.prune(graph, 0.9, 0.98), tok.convert_ids_to_tokens(ids))
  texts = [s.text for s in load_sentences()[:24]]
  batches = [tok.encode(texts[i : i + 8]) for i in range(0, len(texts), 8)]
  return params, config, tc, tc_config, tok, batches, view


def test_contexts_are_the_tokens_where_each_feature_fires_most(setup):
  params, config, tc, tc_config, tok, batches, _ = setup
  features = [(0, 3), (1, 5), (0, 3), (1, 0)]  # a feature asked twice gets the same list
  got = graph_page.feature_contexts(
    params, config, tc, tc_config, tok, batches, features, top=3, width=2
  )
  assert got[0] == got[2]
  for (layer, latent), found in zip(features, got):
    values, where = [], []
    for b, batch in enumerate(batches):
      x, _ = T.activations(params, config, [batch])
      z = np.asarray(T.latents_at(tc, tc_config, layer, x[:, layer]))[:, latent]
      seq, pos = np.nonzero(np.asarray(batch.attention_mask))
      values += z.tolist()
      where += [(b, s, p) for s, p in zip(seq, pos)]
    order = [i for i in np.argsort(-np.asarray(values), kind="stable") if values[i] > 0][:3]
    assert [c["value"] for c in found] == pytest.approx([values[i] for i in order], rel=1e-5)
    for c, i in zip(found, order):
      b, s, p = where[i]
      assert c["token"] == tok.convert_ids_to_tokens([batches[b].input_ids[s][p]])[0]
  with pytest.raises(ValueError, match="latent 99"):
    graph_page.feature_contexts(params, config, tc, tc_config, tok, batches, [(0, 99)])
  with pytest.raises(ValueError, match="top=0"):
    graph_page.feature_contexts(params, config, tc, tc_config, tok, batches, [(0, 1)], top=0)


@pytest.mark.slow
def test_the_page_in_a_real_browser(setup, tmp_path):
  params, config, tc, tc_config, tok, batches, view = setup
  feats = [i for i, n in enumerate(view["nodes"]) if n["kind"] == "feature"]
  assert feats, "the pruned graph kept no feature"
  found = graph_page.feature_contexts(
    params,
    config,
    tc,
    tc_config,
    tok,
    batches,
    [(view["nodes"][i]["layer"], view["nodes"][i]["latent"]) for i in feats],
  )
  contexts = dict(zip(feats, found))
  assert graph_page.view_features(view) == {
    i: (view["nodes"][i]["layer"], view["nodes"][i]["latent"]) for i in feats
  }
  path = graph_page.write(tmp_path / "graph.html", view, contexts, note="the built-in sentences")
  assert "Drawn:" not in path.read_text()
  capped = {**view, "edges": view["edges"][:2], "kept_edges": 40, "kept_nodes": 50}
  page = graph_page.write(tmp_path / "capped.html", capped, note="Contexts: none.").read_text()
  assert "Contexts: none. Drawn: the 2 edges the pruning scores highest of its 40, and the " in page
  with pytest.raises(ValueError, match="not features"):
    embedding = next(i for i, n in enumerate(view["nodes"]) if n["kind"] == "embedding")
    graph_page.write(tmp_path / "bad.html", view, {embedding: []})

  exe = _chromium()
  sync_api = pytest.importorskip("playwright.sync_api", reason="./run.sh setup installs it")
  server = http.server.ThreadingHTTPServer(
    ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(tmp_path))
  )
  threading.Thread(target=server.serve_forever, daemon=True).start()
  problems = []
  try:
    with sync_api.sync_playwright() as pw:
      browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
      page = browser.new_page(viewport={"width": 1400, "height": 900})
      page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
      page.on("pageerror", lambda e: problems.append(str(e)))
      page.goto(f"http://127.0.0.1:{server.server_address[1]}/{path.name}")
      counts = page.evaluate(
        "() => [document.querySelectorAll('circle.node').length,"
        " document.querySelectorAll('#edges line').length]"
      )
      feature = max(feats, key=lambda i: len(contexts[i]))
      page.hover(f"#n{feature}")
      shown = page.inner_text("#detail")
      marked = page.evaluate(
        "() => Array.from(document.querySelectorAll('#detail mark')).map(m => m.textContent)"
      )
      lit = page.evaluate("() => document.querySelectorAll('line.on').length")
      reached = []  # every node can be hovered: nothing drawn over it takes the pointer
      for i in range(len(view["nodes"])):
        page.hover(f"#n{i}", timeout=2000)
        reached.append(page.evaluate("() => document.querySelector('.node.on').id"))
      page.focus(f"#n{embedding}")
      focused = page.inner_text("#detail h2")
      page.screenshot(path=str(tmp_path / "graph.png"), full_page=True)
      browser.close()
  finally:
    server.shutdown()
    server.server_close()
  assert not problems, problems
  assert counts == [len(view["nodes"]), len(view["edges"])]
  assert reached == [f"n{i}" for i in range(len(view["nodes"]))]
  node = view["nodes"][feature]
  assert f"feature {node['latent']}, layer {node['layer'] + 1}" in shown
  assert marked == [c["token"] for c in contexts[feature]] and "Top contexts" in shown
  edges = sum(feature in (s, t) for s, t, _ in view["edges"])
  assert lit == edges
  assert (
    focused == f"embedding of \u201c{view['tokens'][view['nodes'][embedding]['position']]}\u201d"
  )


@pytest.mark.slow
def test_the_report_writes_and_links_the_graph_page(minilm_dir, data_dir, tmp_path):
  """`bertjax report --transcoders DIR`: graph.html for a negated sentence and the task's
  probe, contexts from WikiText-2, linked from the page; a transcoder of another model is
  a failed graph (the rest written), a folder without one a FileNotFoundError up front."""
  from bertjax.report import build_report

  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  texts = [s.text for s in load_sentences()[:64]]
  x, y = T.activations(params, config, [tok.encode(texts[i : i + 32]) for i in (0, 32)])
  cfg = T.TranscoderConfig(d_model=384, layers=6, latents=768, k=8, cross_layer=True)
  state, _ = T.train(x, y, cfg, steps=3, batch_tokens=128, progress=False)
  T.save(tmp_path / "clt", state.params, cfg)
  small = T.TranscoderConfig(d_model=H, layers=L, latents=M, k=K)
  rng = np.random.default_rng(0).standard_normal((32, L, H)).astype(np.float32)
  T.save(tmp_path / "other", T.init(0, small, rng, rng), small)

  def report(out, transcoders):
    return build_report(
      minilm_dir,
      tmp_path / out,
      data_dir,
      reduced=True,
      progress=False,
      sections=["task"],
      transcoders=tmp_path / transcoders,
    )

  g = report("report", "clt")["graph"]
  assert not g.get("failed"), g
  assert g["features"] > 0 and g["nodes"] >= g["features"] and "WikiText-2" in g["contexts"]
  page = (tmp_path / "report" / "graph.html").read_text()
  assert html.escape(g["sentence"]) in page and page.count('class="node ') == g["nodes"]
  index = (tmp_path / "report" / "index.html").read_text()
  assert "<a href='graph.html'>attribution graph</a>" in index
  other = report("other-report", "other")["graph"]
  assert (
    other["failed"] and "a transcoder of 2 layers x 16, for a model of 6 x 384" in other["error"]
  )
  assert "Attribution graph: ValueError" in (tmp_path / "other-report" / "index.html").read_text()
  with pytest.raises(FileNotFoundError, match="no saved transcoder"):
    report("none", ".")
