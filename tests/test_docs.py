"""The documentation site (`docs/build.py`, `./run.sh docs`): MkDocs builds it strictly, every
module has its API page from its docstrings, every link inside the site resolves to a page and
an anchor that exist, links to repository files become their paths, and the five tutorials
run (on the real MiniLM, in a fresh kernel) with their output on their pages."""

import html
import html.parser
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs"))
import build  # docs/build.py

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("jupytext")
pytest.importorskip("nbclient")


class _Links(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.hrefs, self.ids, self.images = [], set(), []

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    if a.get("id"):
      self.ids.add(a["id"])
    if tag == "a" and a.get("href"):
      self.hrefs.append(a["href"])
    if tag == "img" and a.get("src"):
      self.images.append(a["src"])


def _text(page: pathlib.Path) -> str:
  """A page's text, tags (and the highlighter's spans) removed."""
  return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _parse(path: pathlib.Path) -> _Links:
  p = _Links()
  p.feed(path.read_text(encoding="utf-8"))
  return p


@pytest.fixture(scope="module")
def site(tmp_path_factory, minilm_dir):
  """The whole site, tutorials run (they read the real MiniLM) as a user runs them: with
  XLA's optimisations, not the suite's cheap compiles (`tests/conftest.py`), under which the
  attribution-graph tutorial's transcoder training ran for minutes instead of a minute."""
  out = tmp_path_factory.mktemp("docs") / "site"
  with pytest.MonkeyPatch.context() as env:
    env.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    counts = build.build(out)
  return out, counts


def test_every_page_and_module_is_built(site):
  out, counts = site
  assert counts["pages"] == len(build.PAGES)
  assert counts["finding_pages"] == len(build.finding_pages()) >= 15  # one per experiment
  for _, page, _ in (*build.PAGES, *build.finding_pages()):
    assert (out / page.replace(".md", ".html")).is_file(), page
  # The Findings' rows link to the experiments' pages.
  assert 'href="findings/sixteen_heads.html"' in (out / "findings.html").read_text()
  modules = build.api_modules()
  assert {
    "bertjax",
    "bertjax.mesh",
    "bertjax.analysis.attention.statistics",
    "bertjax.kernels.flash_attention",
    "bertjax.cli.train",
  } <= set(modules)
  assert not [m for m in modules if m.endswith("__main__")]
  for module in modules:
    assert (out / "api" / f"{module}.html").is_file(), module
  index = (out / "index.html").read_text()
  assert "<table>" in index and "./run.sh demo" in index  # the README's tables and set-up
  # The API pages are made from the docstrings: a function's and its arguments'.
  reading = (out / "api/bertjax.report.reading_representations.html").read_text()
  assert "outlier_sentences" in reading
  kernel = (out / "api/bertjax.kernels.attention.html").read_text()
  assert "kv_lengths" in kernel


def test_every_link_inside_the_site_resolves(site):
  out, _ = site
  pages = sorted(p for p in out.rglob("*.html") if p.name != "404.html")
  ids = {p: _parse(p).ids for p in pages}
  checked = 0
  for page in pages:
    for href in _parse(page).hrefs:
      if href.startswith(("http:", "https:", "mailto:")):
        continue
      target, _, anchor = href.partition("#")
      path = (page.parent / target).resolve() if target else page
      if path.is_dir():
        path = path / "index.html"
      assert path.exists(), f"{page.relative_to(out)}: {href} points at nothing"
      if anchor and path.suffix == ".html":
        assert anchor in ids[path], f"{page.relative_to(out)}: {href}: no such anchor"
      checked += 1
  assert checked > 1000


def test_a_broken_link_or_reference_fails_the_build(tmp_path, monkeypatch):
  page = tmp_path / "README.md"
  page.write_text("# Title\n\n[a page](docs/nothing.md) and [an anchor](#nowhere)\n")
  monkeypatch.setattr(build, "PAGES", (("README.md", "index.md", "Overview"),))
  monkeypatch.setattr(build, "REPO_PAGES", tmp_path)
  monkeypatch.setattr(build, "TUTORIALS", ())
  with pytest.raises(RuntimeError, match="nowhere"):
    build.build(tmp_path / "site", api=False)


def test_tutorials_run_and_show_their_output(site):
  """Each tutorial's page holds its prose, its code and what the code printed and drew."""
  out, counts = site
  assert counts["tutorials"] == len(build.TUTORIALS) == 5
  expected = {
    "clark_attention": ("most to [CLS]", "largest difference"),
    "negation_patching": ("held-out accuracy", "exact against attribution patching", "attnlrp"),
    "adding_a_family": ("camembert", "MLM logits: largest difference", "CamembertForMaskedLM"),
    "attribution_graphs": ("FVU by layer", "active features", "completeness", "sign agreement"),
    "das_agreement": ("the probe reads the number right", "DAS (one direction) IIA", "by strength"),
  }
  for source, title in build.TUTORIALS:
    page = out / build.tutorial_page(source).replace(".md", ".html")
    text = _text(page)
    assert title in text, source
    for shown in expected[pathlib.Path(source).stem]:
      assert shown in text, (source, shown)
  figures = sorted((out / "tutorials").glob("*.png"))
  drew = {"clark_attention", "negation_patching", "attribution_graphs", "das_agreement"}
  assert {f.name.rsplit("-", 1)[0] for f in figures} == drew
  assert all(f.read_bytes().startswith(b"\x89PNG") for f in figures)
  # The figures are on the pages, not only beside them: one <img> per figure, each at its file.
  for source, _ in build.TUTORIALS:
    page = out / build.tutorial_page(source).replace(".md", ".html")
    shown = [(page.parent / src).resolve() for src in _parse(page).images]
    assert all(path.is_file() for path in shown), (source, shown)
    drawn = [f.resolve() for f in figures if f.name.startswith(pathlib.Path(source).stem + "-")]
    assert sorted(p for p in shown if p.suffix == ".png") == drawn, (source, shown, drawn)


def test_a_relative_out_is_the_callers_folder(tmp_path, monkeypatch):
  """`./run.sh docs` (default `--out out/site`) from the checkout or any folder: a relative
  folder is the caller's, not the staged `mkdocs.yml`'s."""
  (tmp_path / "README.md").write_text("# Title\n")
  monkeypatch.setattr(build, "PAGES", (("README.md", "index.md", "Overview"),))
  monkeypatch.setattr(build, "REPO_PAGES", tmp_path)
  monkeypatch.setattr(build, "TUTORIALS", ())
  caller = tmp_path / "caller"
  caller.mkdir()
  monkeypatch.chdir(caller)
  assert build.main(["--no-api", "--no-run"]) == 0
  assert (caller / "out/site/index.html").is_file()
  assert build.main(["--out", "site", "--no-api", "--no-run"]) == 0
  assert (caller / "site/index.html").is_file()


def test_a_failing_tutorial_fails_the_build(tmp_path, monkeypatch):
  (tmp_path / "README.md").write_text("# Title\n")
  (tmp_path / "bad.py").write_text(
    "# %% [markdown]\n# # Bad\n\n# %%\nx = 1\n\n# %%\nraise ValueError(f'boom {x}')\n"
  )
  monkeypatch.setattr(build, "PAGES", (("README.md", "index.md", "Overview"),))
  monkeypatch.setattr(build, "REPO_PAGES", tmp_path)
  monkeypatch.setattr(build, "TUTORIALS", (("bad.py", "Bad"),))
  with pytest.raises(RuntimeError, match=r"(?s)tutorial bad.py failed.*boom 1"):
    build.build(tmp_path / "site", api=False)
  # Without running, the same script renders as code.
  build.build(tmp_path / "site", api=False, run_tutorials=False)
  assert "raise ValueError" in _text(tmp_path / "site/tutorials/bad.html")


def test_links_are_rewritten_for_the_site():
  text = (
    "[manual](docs/manual.md), [data](#data), [`x`](../experiments/x.py), "
    "[README](../README.md#data), [web](https://jax.dev)"
  )
  got = build.rewrite_links(text, "docs/findings.md")
  assert "[manual](manual.md)" not in got  # docs/docs/manual.md is no page: a path
  assert "`x` (`experiments/x.py`)" in got and "[README](index.md#data)" in got
  assert "[data](#data)" in got and "[web](https://jax.dev)" in got
  assert "[manual](manual.md)" in build.rewrite_links("[manual](docs/manual.md)", "README.md")
  code = "```python\nx = f[0](docs/manual.md)\n```"
  assert build.rewrite_links(code, "README.md") == code  # code blocks are left alone
  # A bracketed list after a bracketed word is no reference link.
  assert build.rewrite_links("[CLS] [0.29, 0.36]", "README.md") == "[CLS] \\[0.29, 0.36]"


def test_images_stay_images():
  """A tutorial's figure, written beside its page, stays an image of that file."""
  figure = "![clark_attention, figure 1](clark_attention-1.png)"
  source, page = "docs/tutorials/clark_attention.py", "tutorials/clark_attention.md"
  assert build.rewrite_links(f"Text.\n\n{figure}\n", source, page) == f"Text.\n\n{figure}\n"
