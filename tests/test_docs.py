"""The documentation site (`docs/build.py`, `./run.sh docs`): every page and the API reference
are built, every link inside the site resolves to a page and an anchor that exist, and links
to repository files become their paths."""

import html.parser
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs"))
import build  # docs/build.py

pytest.importorskip("markdown")
pytest.importorskip("pdoc")


class _Links(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.hrefs, self.ids = [], set()

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    if a.get("id"):
      self.ids.add(a["id"])
    if tag == "a" and a.get("href"):
      self.hrefs.append(a["href"])


def _parse(path: pathlib.Path) -> _Links:
  p = _Links()
  p.feed(path.read_text(encoding="utf-8"))
  return p


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  out = tmp_path_factory.mktemp("site") / "site"
  counts = build.build(out)
  return out, counts


def test_every_page_and_module_is_built(site):
  out, counts = site
  assert counts["pages"] == len(build.PAGES)
  assert {p.name for p in out.glob("*.html")} == {page for _, page, _ in build.PAGES}
  for module in ("bertjax", "bertjax/analysis/outliers", "bertjax/model/forward",
                 "bertjax/kernels/flash_attention", "bertjax/report/reading"):
    assert (out / "api" / f"{module}.html").is_file(), module
  assert counts["api_pages"] >= len(build.api_modules())
  index = (out / "index.html").read_text()
  assert "<table>" in index and "./run.sh demo" in index  # the README's tables and set-up
  assert "outlier_sentences" in (out / "api/bertjax/report/reading_representations.html").read_text()


def test_every_link_inside_the_site_resolves(site):
  out, _ = site
  pages = sorted(out.glob("*.html"))
  ids = {p.name: _parse(p).ids for p in pages}
  checked = 0
  for page in pages:
    for href in _parse(page).hrefs:
      if href.startswith(("http:", "https:", "mailto:")):
        continue
      target, _, anchor = href.partition("#")
      path = out / target if target else page
      assert path.is_file(), f"{page.name}: {href} points at nothing"
      if anchor and path.parent == out:
        assert anchor in ids[path.name], f"{page.name}: {href}: no such anchor"
      checked += 1
  assert checked > 20


def test_links_are_rewritten_for_the_site():
  text = ("[manual](docs/manual.md), [data](#data), [`x`](../experiments/x.py), "
          "[README](../README.md#data), [web](https://jax.dev)")
  got = build.rewrite_links(text, "docs/findings.md")
  assert "[manual](manual.html)" not in got  # docs/docs/manual.md is no page: a path
  assert "`x` (`experiments/x.py`)" in got and "[README](index.html#data)" in got
  assert "[data](#data)" in got and "[web](https://jax.dev)" in got
  assert "[manual](manual.html)" in build.rewrite_links("[manual](docs/manual.md)", "README.md")
  code = "```python\nx = f[0](docs/manual.md)\n```"
  assert build.rewrite_links(code, "README.md") == code  # code blocks are left alone
