"""The main job: `bertjax report` in reduced mode, on MiniLM and on random-weight checkpoints."""

import fcntl
import functools
import http.server
import json
import math
import os
import pathlib
import shutil
import struct
import sys
import threading
import zlib

import numpy as np
import pyrunner
import pytest

import bertjax
from bertjax import cli, report
from bertjax.tasks.sentences import load_sentences

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_png(path: pathlib.Path) -> None:
  """A PNG whose every chunk's CRC is right, that starts with IHDR and ends with IEND."""
  data = path.read_bytes()
  assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
  pos, names = 8, []
  while pos < len(data):
    (length,) = struct.unpack(">I", data[pos : pos + 4])
    name = data[pos + 4 : pos + 8]
    body = data[pos + 8 : pos + 8 + length]
    (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
    assert zlib.crc32(name + body) == crc, f"{path}: bad CRC in chunk {name!r}"
    names.append(name)
    pos += 12 + length
  assert names[0] == b"IHDR" and names[-1] == b"IEND", f"{path}: chunks {names[:3]}...{names[-2:]}"
  width, height = struct.unpack(">II", data[16:24])
  assert width > 50 and height > 50, f"{path}: {width}x{height}"


def _numbers(x, where="report"):
  """Yields (where, number) for every number in a JSON tree."""
  if isinstance(x, dict):
    for k, v in x.items():
      yield from _numbers(v, f"{where}.{k}")
  elif isinstance(x, list):
    for i, v in enumerate(x):
      yield from _numbers(v, f"{where}[{i}]")
  elif isinstance(x, (int, float)) and not isinstance(x, bool):
    yield where, x


def _check_outputs(out: pathlib.Path, results: dict) -> dict:
  html = (out / "index.html").read_text()
  saved = json.loads((out / "report.json").read_text())
  assert saved["model"] == results["model"]
  assert saved["model"]["name"] in html
  figures = saved["figures"]
  assert figures, "no figures"
  for name in figures.values():
    _check_png(out / name)
    assert f'src="{name}"' in html, f"{name} is not shown in index.html"
  assert sorted(p.name for p in out.glob("*.png")) == sorted(figures.values())
  bad = [(w, v) for w, v in _numbers(saved) if not math.isfinite(v)]
  assert not bad, f"non-finite numbers: {bad[:5]}"
  return saved


def _check_consistency(r: dict) -> None:
  failed = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and v.get("failed")}
  assert not failed, failed
  layers, heads = r["model"]["layers"], r["model"]["heads"]
  task, ab = r["task"], r["ablation"]
  # The ablation baseline is the unablated metric, computed by another path.
  assert ab["baseline_loss"] == pytest.approx(task["test_loss"], abs=1e-4)
  assert ab["baseline_accuracy"] == pytest.approx(task["test_accuracy"], abs=1e-6)
  assert len(task["probe_accuracy_by_layer"]) == layers + 1
  assert task["probe_accuracy_by_layer"][-1] == task["test_accuracy"]
  assert 0 <= task["majority_accuracy"] <= 1 and task["majority_accuracy"] >= 0.5
  assert np.shape(ab["head_loss"]) == (layers, heads) == np.shape(ab["importance"])
  assert np.shape(ab["layer_skip_loss"]) == (layers,) == np.shape(ab["layer_heads_accuracy"])
  acc = np.asarray(ab["layer_heads_accuracy"] + ab["layer_skip_accuracy"])
  assert ((acc >= 0) & (acc <= 1)).all()
  # The pruning curve starts at the intact model and masks more heads at every step.
  fractions = np.asarray(ab["pruning_fraction"])
  assert fractions[0] == 0 and (np.diff(fractions) > 0).all()
  assert ab["pruning_accuracy"][0] == pytest.approx(ab["baseline_accuracy"], abs=1e-6)
  assert ab["pruning_loss"][0] == pytest.approx(ab["baseline_loss"], abs=1e-4)
  masks = np.asarray(ab["pruning_masks"])
  np.testing.assert_allclose(1 - masks.mean((1, 2)), fractions, atol=1e-6)
  assert np.isclose(np.asarray(ab["importance"]), 0).sum() < layers * heads
  # Importance is layer-normalised (unit 2-norm per layer).
  np.testing.assert_allclose(np.linalg.norm(ab["importance"], axis=1), 1, atol=1e-4)

  clark = r["clark"]
  mass = sum(np.asarray(clark[k]) for k in ("cls", "sep", "punct"))
  assert (mass <= 1 + 1e-5).all() and (mass >= 0).all()
  for k in ("cls", "sep", "punct", "self", "prev", "next"):
    np.testing.assert_allclose(clark["by_layer"][k], np.mean(clark[k], -1), atol=1e-5)
  assert (np.asarray(clark["entropy"]) >= -1e-6).all()

  pat = r["patterns"]
  counts = np.asarray(pat["counts"])
  assert counts.shape == (layers, heads, 5)
  assert (counts.sum(-1) == pat["num_inputs"]).all()
  assert sum(pat["overall"]) == pytest.approx(1, abs=1e-5)
  np.testing.assert_allclose(np.sum(pat["per_layer"], -1), 1, atol=1e-5)

  an = r["anisotropy"]
  assert len(an["anisotropy"]) == layers + 1
  assert all(-1 <= v <= 1 for v in an["anisotropy"] + an["anisotropy_centered"])

  if r["pos"]["available"]:
    pos = r["pos"]
    assert len(pos["accuracy"]) == layers + 1
    assert all(0 <= v <= 1 for v in pos["accuracy"])
    np.testing.assert_allclose(
      np.subtract(pos["accuracy"], pos["control_accuracy"]), pos["selectivity"], atol=1e-5
    )
  else:
    assert r["pos"]["reason"]

  eff = r["effective"]
  corr = np.asarray(eff["stats"]["effective"]["raw_corr"])
  assert corr.shape == (layers, heads) and (np.abs(corr) <= 1 + 1e-6).all()
  for e in eff["examples"]:
    raw, effective = np.asarray(e["raw"]), np.asarray(e["effective"])
    assert raw.shape == effective.shape == (len(eff["example_tokens"]),) * 2
    np.testing.assert_allclose(raw.sum(-1), 1, atol=1e-3)

  # The per-item values behind the readings' confidence intervals average to the numbers shown.
  np.testing.assert_allclose(
    np.mean(clark["per_sentence"]["sep"], 0), clark["by_layer"]["sep"], atol=1e-5
  )
  np.testing.assert_allclose(np.mean(pat["per_input"], 0), pat["overall"], atol=1e-5)
  np.testing.assert_allclose(
    np.mean(task["probe_correct_by_layer"], 1), task["probe_accuracy_by_layer"], atol=1e-6
  )
  ex = ab["per_example"]
  assert np.mean(ex["loss_baseline"]) == pytest.approx(ab["baseline_loss"], abs=1e-4)
  np.testing.assert_allclose(np.mean(ex["loss_heads"], -1), ab["head_loss"], atol=1e-4)
  np.testing.assert_allclose(np.mean(ex["loss_layers"], -1), ab["layer_heads_loss"], atol=1e-4)
  np.testing.assert_allclose(np.mean(ex["correct_pruning"], -1), ab["pruning_accuracy"], atol=1e-6)
  low, high = (np.asarray(x) for x in an["ci"]["anisotropy"])
  point = np.asarray(an["ci"]["all_pairs"])
  assert ((low <= point) & (point <= high)).all()
  per = eff["per_passage"]
  st = eff["stats"]
  raw = np.mean(st["raw"]["cls"]) + np.mean(st["raw"]["sep"])
  assert np.average(per["raw"], weights=per["tokens"]) == pytest.approx(raw, abs=1e-5)

  stages = {k: v for k, v in r["timing"].items() if k != "total_seconds"}
  assert r["timing"]["total_seconds"] >= sum(stages.values()) - 1e-3


def _build_report(cwd: pathlib.Path) -> pathlib.Path:
  """`bertjax report --reduced` as a user runs it: a subprocess in the fresh directory `cwd`."""
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    BERTJAX_NO_SHARED_DATA="1",
    BERTJAX_DATA_DIR=str(cwd / "no-data"),
  )
  proc = pyrunner.run(
    [sys.executable, "-m", "bertjax.cli", "report", "--reduced", "--out", "report"],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=1800,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert f"report: {pathlib.Path('report') / 'index.html'}" in proc.stdout
  assert "[report" in proc.stdout  # progress lines
  return cwd / "report"


@pytest.fixture(scope="module")
def minilm_report(minilm_dir, tmp_path_factory):
  """The reduced report on MiniLM, built once per test session: under pytest-xdist the first
  worker to ask builds it in the session's shared temporary directory while the others wait
  on a lock, then read it."""
  if "PYTEST_XDIST_WORKER" not in os.environ:
    out = _build_report(tmp_path_factory.mktemp("user"))
  else:
    shared = tmp_path_factory.getbasetemp().parent  # the session's, above every worker's
    cwd, done = shared / "minilm-report", shared / "minilm-report.done"
    with open(shared / "minilm-report.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      try:
        if not done.exists():
          shutil.rmtree(cwd, ignore_errors=True)  # a failed build's leftovers
          cwd.mkdir()
          _build_report(cwd)
          done.touch()
      finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
    out = cwd / "report"
  return out, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_reduced_report_on_minilm(minilm_report):
  out, results = minilm_report
  saved = _check_outputs(out, results)
  assert saved["model"]["name"] == "all-MiniLM-L6-v2"
  assert (saved["model"]["layers"], saved["model"]["heads"]) == (6, 12)
  _check_consistency(saved)
  html = (out / "index.html").read_text()
  for title in (
    "Clark et al.",
    "Kovaleva et al.",
    "Michel et al.",
    "Ethayarajh",
    "Brunner et al.",
    "negation",
    "Run time",
    "Contents",
  ):
    assert title in html
  assert "<title>BERTology report: all-MiniLM-L6-v2</title>" in html
  # Each stage says how many XLA programs it compiled (the log and the run-time table).
  compiled = saved["compiled_programs"]
  assert set(compiled) == set(saved["timing"]) - {"total_seconds"}
  assert all(isinstance(n, int) and n >= 0 for n in compiled.values()) and sum(compiled.values())
  assert "XLA programs compiled" in html
  # One layer numbering: blocks 1..L in every table, figure and JSON field, 0 = embeddings.
  assert "blocks are layers 1..L" in saved["layer_numbering"]["layers"]
  for e in list(saved["patterns"]["examples"].values()) + saved["effective"]["examples"]:
    assert 1 <= e["layer"] <= 6
  assert "layer 6" in html and "<td>6</td>" in html
  assert "layer 0 (the first encoder block)" not in html
  assert not saved["pos"]["available"] and "bertjax data fetch" in saved["pos"]["reason"]
  # Every section reads its numbers (from report.json alone), naming the model analysed.
  from bertjax.report import page, reading

  readings = saved["readings"]
  assert readings == reading.readings({k: v for k, v in saved.items() if k != "readings"})
  assert set(readings) == {k for k, _ in page.SECTIONS} - {"timing"}
  for section, sentences in readings.items():
    assert sentences and all(sentences), section
    if section == "pos":  # the probe did not run here; the page's note says why
      continue
    assert " ".join(page.html_escape(x) for x in sentences) in html, section
    if section != "text":
      assert reading.verdicts(sentences, "all-MiniLM-L6-v2"), section


def test_sentences_are_labelled():
  sentences = load_sentences()
  assert len(sentences) >= 300
  assert len({s.text for s in sentences}) == len(sentences), "duplicate sentences"
  for s in sentences:
    assert s.question == int(s.text.endswith("?")), s
  negated = [s.negated for s in sentences]
  assert 0.25 < np.mean(negated) < 0.5
  assert {"declarative", "question", "negation", "agreement", "punctuation", "relative_clause"} <= {
    s.phenomenon for s in sentences
  }


def test_bad_sentences_file(tmp_path):
  bad = tmp_path / "s.tsv"
  bad.write_text("sentence\tnegated\tquestion\tphenomenon\nIt rains.\t2\t0\tdeclarative\n")
  with pytest.raises(ValueError, match="negated='2'"):
    load_sentences(bad)
  bad.write_text("sentence\tnegated\nIt rains.\t0\n")
  with pytest.raises(ValueError, match="lacks the columns"):
    load_sentences(bad)


def test_report_help(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["report", "--help"])
  assert e.value.code == 0
  text = capsys.readouterr().out
  for flag in ("--model", "--out", "--data-dir", "--reduced", "--sections"):
    assert flag in text


def test_missing_model_dir(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    report.build_report(tmp_path / "nowhere", tmp_path / "out", progress=False)


@pytest.mark.parametrize("model_type", ["bert", pytest.param("albert", marks=pytest.mark.slow)])
def test_report_on_random_checkpoint(model_type, minilm_dir, tmp_path, monkeypatch):
  """`bertjax report --model PATH` on a random-weight Hugging Face directory."""
  extra = (
    {"model_type": "albert", "embedding_size": 32, "num_hidden_groups": 1, "hidden_act": "gelu_new"}
    if model_type == "albert"
    else {}
  )
  config = bertjax.BertConfig.preset("tiny", vocab_size=30522, **extra)
  model = tmp_path / f"random-{model_type}"
  bertjax.to_hf(config, bertjax.init(config, 0), model)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
    if (minilm_dir / name).exists():
      shutil.copy(minilm_dir / name, model / name)
  monkeypatch.setenv("BERTJAX_DATA_DIR", str(tmp_path / "no-data"))  # no POS probe: faster
  monkeypatch.setenv("BERTJAX_NO_SHARED_DATA", "1")
  out = tmp_path / "out"
  # The sections `_check_consistency` checks (the MiniLM report above runs them all).
  argv = ["report", "--model", str(model), "--out", str(out), "--reduced", "--quiet"]
  assert cli.main([*argv, "--sections", "clark,patterns,ablation,anisotropy,pos,effective"]) == 0
  saved = json.loads((out / "report.json").read_text())
  assert saved["model"]["name"] == model.name and saved["model"]["model_type"] == model_type
  assert (saved["model"]["layers"], saved["model"]["heads"]) == (2, 4)
  _check_outputs(out, saved)
  _check_consistency(saved)
  assert not saved["pos"]["available"]
  assert saved["run"]["sections"] == [
    "task",
    "clark",
    "patterns",
    "ablation",
    "anisotropy",
    "pos",
    "effective",
  ]


def _roberta_64(minilm_dir, directory):
  """A random RoBERTa-style checkpoint with 64 usable positions (65 position embeddings, the
  first for padding) and MiniLM's tokenizer, whose own limit is 512."""
  config = bertjax.BertConfig(
    model_type="roberta",
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=37,
    max_position_embeddings=65,
    pad_token_id=0,
    type_vocab_size=2,
  )
  assert config.max_length == 64
  bertjax.to_hf(config, bertjax.init(config, 0), directory)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
    if (minilm_dir / name).exists():
      shutil.copy(minilm_dir / name, directory / name)
  return directory


def test_effective_section_reads_no_more_than_the_model_s_usable_length(minilm_dir, tmp_path):
  """Passages were cut at max_position_embeddings (65 here), one token past what the model
  reads (64), so the section failed with "seq_len=65 must be <= 64" (issue #36)."""
  from bertjax.report import sections
  from bertjax.report.settings import ReportSettings

  config, params = bertjax.from_hf(_roberta_64(minilm_dir, tmp_path / "model"))
  tok = bertjax.Tokenizer.from_pretrained(tmp_path / "model")
  assert tok.model_max_length > config.max_length
  passage = " ".join(s.text for s in load_sentences()[:12])  # well over 64 tokens
  eff = sections.effective_section(
    params, config, tok, [passage, passage[:200]], ReportSettings.reduced()
  )
  assert len(eff["example_tokens"]) == config.max_length
  assert eff["mean_passage_tokens"] <= config.max_length


def test_sentences_longer_than_the_model_reads_are_left_out(minilm_dir, tmp_path):
  """The task and attribution sections read the built-in sentences whole: on a model with 16
  usable positions the longer ones are left out (as UD sentences are), not fed to it."""
  from bertjax.report import build
  from bertjax.report.settings import ReportSettings

  config = bertjax.BertConfig(
    model_type="roberta",
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=37,
    max_position_embeddings=17,
    pad_token_id=0,
  )
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  run = build._Run(None, config, tok, ReportSettings.reduced(), build._Clock(False), False)
  own = load_sentences()
  kept = build.fitting(run, own)
  lengths = [len(tok.encode([s.text]).input_ids[0]) for s in own]
  assert run.max_len == config.max_length == 16
  assert [s.text for s in kept] == [s.text for s, n in zip(own, lengths) if n <= 16]
  assert 0 < len(kept) < len(own)


def test_a_failing_section_is_shown_and_the_rest_of_the_report_written(
  minilm_dir, tmp_path, monkeypatch
):
  """`bertjax report --reduced` on a model with 64 usable positions, one section made to fail:
  the page and report.json are written, the failed section says so with its error, and every
  other section (effective attention included) has its numbers and figures."""
  from bertjax.report import page, reading, sections

  def broken(*args, **kwargs):
    raise RuntimeError("a stand-in failure")

  monkeypatch.setattr(sections, "anisotropy_section", broken)
  monkeypatch.setenv("BERTJAX_DATA_DIR", str(tmp_path / "no-data"))
  monkeypatch.setenv("BERTJAX_NO_SHARED_DATA", "1")
  model, out = _roberta_64(minilm_dir, tmp_path / "roberta-64"), tmp_path / "out"
  argv = ["report", "--model", str(model), "--out", str(out), "--reduced", "--quiet"]
  assert cli.main([*argv, "--sections", "clark,anisotropy,effective,ablation"]) == 0
  saved = json.loads((out / "report.json").read_text())
  assert saved["anisotropy"] == {"failed": True, "error": "RuntimeError: a stand-in failure"}
  html = (out / "index.html").read_text()
  assert "This section failed" in html and "RuntimeError: a stand-in failure" in html
  assert "anisotropy.png" not in html and not (out / "anisotropy.png").exists()
  assert "failed" in saved["readings"]["anisotropy"][0]
  assert not reading.verdicts(saved["readings"]["anisotropy"], saved["model"]["name"])
  for key in ("clark", "task", "ablation", "effective"):  # ablation reads task: it ran too
    assert saved[key] and not saved[key].get("failed"), (key, saved[key])
  assert reading.verdicts(saved["readings"]["pruning"], saved["model"]["name"])
  assert len(saved["effective"]["example_tokens"]) <= 64
  _check_outputs(out, saved)
  assert all(f"<h2 id='{k}'>" in html for k, _ in page.SECTIONS)  # every section, in place
  # The sections not asked for are on the page, in report.json and in the readings as not run.
  for key in ("patterns", "pos", "attribution", "circuit", "outliers", "sae"):
    assert saved[key] == {
      "skipped": True,
      "reason": "not asked for: this report was run for task, clark, ablation, anisotropy, "
      "effective only",
    }, key
    assert saved["readings"][key][0].startswith("This section was not run (not asked for")
    assert key not in saved["timing"] and f"{key}.png" not in html
  assert html.count("This section was not run</b>: not asked for") == 6


def test_report_sections_are_checked_before_the_model_is_read(tmp_path, capsys):
  code = cli.main(["report", "--model", str(tmp_path / "nowhere"), "--sections", "clark,pruned"])
  err = capsys.readouterr().err
  assert code != 0 and "sections=pruned not understood" in err and "Traceback" not in err
  assert "clark, patterns, ablation" in err and not (tmp_path / "nowhere").exists()
  assert report.build.chosen_sections(["pruning", "circuit"]) == {"ablation", "circuit", "task"}
  assert report.build.chosen_sections(["disentangled"]) == {"disentangled", "clark", "patterns"}
  assert report.build.chosen_sections(None) is None


def test_model_names(tmp_path):
  cache = tmp_path / "hub" / "models--google-bert--bert-base-uncased" / "snapshots" / ("a" * 40)
  cache.mkdir(parents=True)
  assert report.model_name(cache) == "google-bert/bert-base-uncased"
  assert report.model_name(cache, "google-bert/bert-base-uncased") == (
    "google-bert/bert-base-uncased"
  )
  run = tmp_path / "finetune-negation" / "model"
  run.mkdir(parents=True)
  assert report.model_name(run) == "finetune-negation/model"
  assert report.model_name(tmp_path / "finetune-negation") == "finetune-negation"


def test_default_data_dir_uses_the_one_lookup(tmp_path, monkeypatch):
  monkeypatch.setenv("BERTJAX_NO_SHARED_DATA", "1")
  monkeypatch.setenv("BERTJAX_DATA_DIR", str(tmp_path))
  assert report.default_data_dir() is None
  (tmp_path / "ud_english_ewt").mkdir()
  assert report.default_data_dir() == tmp_path


# The page in a real browser -------------------------------------------------------------------

CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
]


def _chromium() -> str:
  """Debian's chromium (or $BERTJAX_CHROMIUM); skips, saying how to get it, when absent."""
  exe = (
    os.environ.get("BERTJAX_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
  )
  if not exe:
    pytest.skip(
      "headless Chromium not found: install Debian's chromium (apt-get install "
      "chromium; .ci/run does) or set BERTJAX_CHROMIUM to a Chromium executable"
    )
  return exe


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


@pytest.fixture()
def served_report(minilm_report):
  """The report directory on an HTTP server at 127.0.0.1 (a thread); yields its URL."""
  out, _ = minilm_report
  server = http.server.ThreadingHTTPServer(
    ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(out))
  )
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.mark.slow
def test_report_in_a_real_browser(minilm_report, served_report, tmp_path):
  """Headless Chromium (Debian's, driven by Playwright) loads the page: every image, every
  section and every contents link, no console error, figures shown near their natural
  size; a full-page screenshot is saved beside the test."""
  exe = _chromium()
  sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (./run.sh setup installs it)"
  )
  from bertjax.report.page import SECTIONS

  _, saved = minilm_report
  problems = []
  with sync_api.sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
    try:
      page = browser.new_page(viewport={"width": 1280, "height": 900})
      page.on(
        "console",
        lambda m: (
          problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
        ),
      )
      page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
      page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
      page.on(
        "response",
        lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
      )
      response = page.goto(f"{served_report}/index.html", wait_until="load")
      assert response is not None and response.ok
      page.wait_for_function("Array.from(document.images).every(i => i.complete)")
      assert page.title() == "BERTology report: all-MiniLM-L6-v2"
      images = page.evaluate("""() => Array.from(document.images).map(i => ({
          src: i.getAttribute('src'), natural: i.naturalWidth, shown: i.width,
          link: i.parentElement.tagName === 'A' ? i.parentElement.getAttribute('href') : null}))""")
      sections = page.evaluate(
        "() => Array.from(document.querySelectorAll('h2[id]')).map(h => h.id)"
      )
      links = page.evaluate(
        "() => Array.from(document.querySelectorAll('nav.toc a'))"
        ".map(a => [a.getAttribute('href'), a.textContent])"
      )
      targets = page.evaluate(
        "ids => ids.map(id => document.getElementById(id) !== null)",
        [href[1:] for href, _ in links],
      )
      shot = tmp_path / "report.png"
      page.screenshot(path=str(shot), full_page=True)
    finally:
      browser.close()
  assert not problems, problems
  # Every figure of report.json is on the page, loaded, and opens at full size on a click.
  assert sorted(i["src"] for i in images) == sorted(saved["figures"].values())
  for image in images:
    assert image["natural"] > 0, f"{image['src']} did not load"
    assert image["link"] == image["src"], f"{image['src']} is not click-to-enlarge"
    # Legible at the page's width: no figure squeezed below 70% of its pixels.
    assert image["shown"] >= 0.7 * image["natural"], image
  # Every section, in order, and a contents entry that lands on each.
  expected = [key for key, _ in SECTIONS]
  assert sections == expected
  assert [href for href, _ in links] == [f"#{key}" for key in expected] and all(targets)
  data = shot.read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 50_000


def test_attribution_section_counts_what_each_part_read():
  """The token-attribution part reads `attribution_sentences` negated sentences, the patching
  part `patching_pairs` pairs: the page said 48 sentences beside a figure of 64 pairs."""
  from bertjax.report import page, reading

  stats = {k: {"mrr": 0.5, "top1": 0.2, "mean_rank": 2.0} for k in ("attention", "norm")}
  exact = np.zeros((2, 3))
  exact[1, 2] = 0.6
  r = {
    "attribution": {
      "available": True,
      "cues": {"sentences": ["s"] * 48, "stats": stats, "chance": {"mrr": 0.3}},
      "patching": {"pairs": 64, "exact": exact, "agreement": {"pearson": 0.9}},
    }
  }
  html = " ".join(page._attribution_html(r, {}, {}))
  assert "For each of 48 negated sentences" in html and "Then 64 negated sentences" in html
  assert "from each of 64 negated sentences" in reading.attribution_sentences(r["attribution"])[1]


def test_attribution_sentences_follow_the_numbers():
  """The report's generated reading agrees or disagrees as its JSON numbers say."""
  from bertjax.report import reading

  def section(mrr, pearson):
    stats = {k: {"mrr": v, "top1": 0.0, "mean_rank": 1 / v} for k, v in mrr.items()}
    exact = np.zeros((2, 3))
    exact[1, 2] = 0.6
    return {
      "cues": {"stats": stats, "chance": {"mrr": 0.3}},
      "patching": {"exact": exact, "agreement": {"pearson": pearson}},
    }

  agree = reading.attribution_sentences(
    section(
      {
        "attention": 0.3,
        "rollout": 0.2,
        "norm": 0.5,
        "globenc": 0.4,
        "alti": 0.45,
        "value_zeroing": 0.6,
      },
      0.95,
    )
  )
  assert "best method is value_zeroing" in agree[0] and "so this model agrees" in agree[0]
  assert "layer 2 head 2 alone restores 0.60" in agree[1] and "as they report" in agree[1]
  disagree = reading.attribution_sentences(
    section(
      {
        "attention": 0.7,
        "rollout": 0.2,
        "norm": 0.5,
        "globenc": 0.4,
        "alti": 0.45,
        "value_zeroing": 0.6,
      },
      0.3,
    )
  )
  assert "so this model disagrees" in disagree[0] and "poor estimate" in disagree[1]
  partly = reading.attribution_sentences(
    section(
      {
        "attention": 0.45,
        "rollout": 0.2,
        "norm": 0.5,
        "globenc": 0.4,
        "alti": 0.3,
        "value_zeroing": 0.6,
      },
      0.9,
    )
  )
  assert "2 of the 4" in partly[0] and "partly agrees" in partly[0]
  assert len(partly) == 2  # no decompositions in the section, no third sentence
  both = reading.attribution_sentences(
    section(
      {
        "attention": 0.3,
        "rollout": 0.2,
        "norm": 0.5,
        "integrated_gradients": 0.6,
        "decompx": 0.8,
        "attnlrp": 0.9,
      },
      0.9,
    )
  )
  assert "decompx 0.80, attnlrp 0.90" in both[2] and "integrated_gradients (0.60)" in both[2]
  assert "so this model agrees" in both[2]
  one = reading.attribution_sentences(
    section(
      {"attention": 0.3, "norm": 0.5, "integrated_gradients": 0.85, "decompx": 0.8, "attnlrp": 0.9},
      0.9,
    )
  )
  assert "partly agrees" in one[2]
