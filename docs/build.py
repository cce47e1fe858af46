"""Builds the documentation site: the README and the pages in docs/ as HTML, one navigation bar
over them, and the API reference generated from the docstrings (pdoc), in one static folder.

Run:
  ./run.sh docs [--out DIR] [--no-api]     # default DIR: out/site; open DIR/index.html

Links between the pages become links between their HTML files; a link to a file of the
repository (a script, a result) becomes its path in code type, since the site holds only the
pages; links to the web stay as they are. The API reference documents every module of
`bertjax` (`bertjax.kernels` included) under DIR/api/.
"""

from __future__ import annotations

import argparse
import html
import pathlib
import pkgutil
import re
import shutil
import sys
import warnings

REPO = pathlib.Path(__file__).resolve().parents[1]
# (source, page, title), in the navigation's order.
PAGES = (("README.md", "index.html", "Overview"),
         ("docs/manual.md", "manual.html", "Manual"),
         ("docs/results.md", "results.html", "Measured results"),
         ("docs/findings.md", "findings.html", "Findings"))
CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1150px;margin:0 auto;
padding:0 1em 3em;color:#222;line-height:1.5}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.6em 0;z-index:1}
nav a{margin-right:1.2em;text-decoration:none;font-weight:600}nav a.here{color:#222}
table{border-collapse:collapse;margin:.8em 0;font-size:.85em;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25em .5em;vertical-align:top}th{background:#f3f3f3}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto}code{font-size:.92em}
h1,h2,h3{scroll-margin-top:3em}
"""


def page_of(source: str) -> str | None:
  """The site page of a repository Markdown file, or None when it is not one of `PAGES`."""
  return {src: page for src, page, _ in PAGES}.get(source)


def rewrite_links(text: str, source: str) -> str:
  """`text`'s Markdown links rewritten for the site: to another page (with its anchor), to a
  repository file as its path in code type, web links unchanged."""
  base = pathlib.PurePosixPath(source).parent

  def one(m: re.Match) -> str:
    label, target = m.group(1), m.group(2)
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
      return m.group(0)
    path, _, anchor = target.partition("#")
    resolved = _normalise(f"{base}/{path}") if path else source
    page = page_of(resolved)
    if page is not None:
      return f"[{label}]({page}{'#' + anchor if anchor else ''})"
    shown = label if label.startswith("`") else f"`{label}`"
    return shown if label.strip("`") == resolved else f"{shown} (`{resolved}`)"

  parts = re.split(r"(```.*?```)", text, flags=re.DOTALL)  # code blocks stay as written
  return "".join(part if part.startswith("```") else
                 re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", one, part) for part in parts)


def _normalise(path: str) -> str:
  """`a/../b` -> `b` (paths within the repository)."""
  out: list[str] = []
  for part in path.split("/"):
    if part == "..":
      if out:
        out.pop()
    elif part and part != ".":
      out.append(part)
  return "/".join(out)


def render_page(source: str, title: str, api: bool) -> str:
  """One page's HTML: the navigation bar and the Markdown rendered (tables, fenced code, ids
  on headings)."""
  import markdown

  text = rewrite_links((REPO / source).read_text(encoding="utf-8"), source)
  body = markdown.markdown(text, extensions=["tables", "fenced_code", "toc"],
                           output_format="html")
  links = [(page, name) for _, page, name in PAGES] + ([("api/bertjax.html", "API")] if api
                                                        else [])
  here = page_of(source)
  nav = "".join(f"<a href='{p}'{' class=here' if p == here else ''}>{html.escape(n)}</a>"
                for p, n in links)
  return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
          f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
          f"<title>bertjax: {html.escape(title)}</title><style>{CSS}</style></head>"
          f"<body><nav>{nav}</nav>{body}</body></html>")


def api_modules() -> list[str]:
  """Every module of the installed `bertjax` package, `bertjax.kernels` included (not the
  `__main__` entry points, which run a command when imported)."""
  import bertjax
  from bertjax import kernels  # installed as bertjax.kernels from the top-level kernels/

  names = {"bertjax", "bertjax.kernels"}
  for package, prefix in ((bertjax, "bertjax."), (kernels, "bertjax.kernels.")):
    names |= {m.name for m in pkgutil.walk_packages(package.__path__, prefix)
              if not m.name.endswith(".__main__")}
  return sorted(names)


def build_api(out: pathlib.Path) -> int:
  """The API reference (pdoc, Google-style docstrings) in `out`; returns its page count."""
  import pdoc

  pdoc.render.configure(docformat="google", search=True)
  with warnings.catch_warnings():  # a package listed beside its modules is documented once
    warnings.filterwarnings("ignore", message="The module specification")
    warnings.filterwarnings("ignore", message="Error parsing type annotation")
    pdoc.pdoc(*api_modules(), output_directory=out)
  return sum(1 for _ in out.rglob("*.html"))


def build(out: pathlib.Path, api: bool = True) -> dict[str, int]:
  """Writes the site into `out` (replaced); returns how many pages of each kind."""
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  for source, page, title in PAGES:
    (out / page).write_text(render_page(source, title, api), encoding="utf-8")
  return {"pages": len(PAGES), "api_pages": build_api(out / "api") if api else 0}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="out/site", metavar="DIR",
                 help="the site's folder, replaced (default: out/site)")
  p.add_argument("--no-api", action="store_true", help="the pages only, no API reference")
  args = p.parse_args(argv)
  try:
    import markdown  # noqa: F401
    if not args.no_api:
      import pdoc  # noqa: F401
  except ImportError as e:
    print(f"docs: {e.name} is missing; `./run.sh setup` installs it (the docs extra)",
          file=sys.stderr)
    return 2
  out = pathlib.Path(args.out)
  counts = build(out, api=not args.no_api)
  print(f"wrote {counts['pages']} pages and {counts['api_pages']} API pages to {out}; open "
        f"{out / 'index.html'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
