"""Builds the documentation site with MkDocs (Material theme) and mkdocstrings: the README and
docs/*.md as pages, and an API reference page for every module, from its docstrings, all checked
strictly (`mkdocs build --strict`): a link to a page or an anchor that does not exist, a
cross-reference that resolves to nothing or a docstring section that cannot be parsed fails
the build.

Run:
  ./run.sh docs [--out DIR] [--no-api] [--no-run]   # default DIR: out/site; open DIR/index.html

The site's settings are in `mkdocs.yml`. This script stages what MkDocs reads into
`DIR.src/` (replaced each time):

* the pages, their links rewritten for the site: a link to another page keeps its anchor, a
  link to a file of the repository (a script, a result) becomes its path in code type, since
  the site holds only the pages, and links to the web stay as they are; images stay images,
  their targets as written (the tutorials' figures are written beside their pages);
* `api/<module>.md` for every module of `bertjax` and of `bertjax.kernels` (the `__main__`
  entry points aside), each a mkdocstrings `::: module` directive, found by reading the
  source tree (nothing is imported);
* a package tree that puts the top-level `kernels/` where the installed package has it
  (`bertjax/kernels`), for mkdocstrings to read;
* `tutorials/<name>.md` for every tutorial of `TUTORIALS` (jupytext percent scripts in
  `docs/tutorials/`): executed in a fresh Python kernel (nbclient) and rendered with what each
  cell printed and drew, so a tutorial that fails fails the build (`--no-run`: the code
  alone, not executed);
* `mkdocs.yml`: the repository's, with the staged folders and the navigation added.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# (source, page, title), in the navigation's order.
PAGES = (
  ("README.md", "index.md", "Overview"),
  ("docs/manual.md", "manual.md", "Manual"),
  ("docs/results.md", "results.md", "Measured results"),
  ("docs/testing.md", "testing.md", "The test suite"),
  ("docs/findings.md", "findings.md", "Findings"),
  ("docs/experiments.md", "experiments.md", "Experiments"),
)
REPO_PAGES = REPO  # where the PAGES' sources are read from
# (script, title) of the tutorials, jupytext percent scripts run on MiniLM, in order.
TUTORIALS = (
  ("docs/tutorials/clark_attention.py", "Clark et al.'s attention statistics"),
  ("docs/tutorials/negation_patching.py", "Patching and attribution on negation"),
  ("docs/tutorials/adding_a_family.py", "Adding a family"),
)
TUTORIAL_TIMEOUT = 900  # seconds a tutorial's cell may run
# Where each package's source lies: the top-level kernels/ installs as bertjax.kernels.
SOURCES = (("bertjax", REPO / "bertjax"), ("bertjax.kernels", REPO / "kernels"))


def page_of(source: str) -> str | None:
  """The site page of a repository file, or None when it is none of `PAGES` or `TUTORIALS`."""
  if any(source == src for src, _ in TUTORIALS):
    return tutorial_page(source)
  return {src: page for src, page, _ in PAGES}.get(source)


def rewrite_links(text: str, source: str, page: str = "") -> str:
  """`text`'s Markdown links rewritten for the site: to another page (with its anchor), to a
  repository file as its path in code type, web links unchanged. `page` is where the text goes
  on the site (links from `tutorials/x.md` climb one folder). Images (`![alt](x.png)`) stay as
  written: the only ones are the tutorials' figures, which `_markdown` writes beside the page
  (a target the site lacks fails the strict build). A bracketed list right after a bracketed
  word (`[CLS] [0.29, 0.36]`) is escaped, or Markdown would read a reference link."""
  base = pathlib.PurePosixPath(source).parent
  up = "../" * page.count("/")

  def one(m: re.Match) -> str:
    image, label, target = m.group(1), m.group(2), m.group(3)
    if image or re.match(r"[a-z]+:", target) or target.startswith("#"):
      return m.group(0)
    path, _, anchor = target.partition("#")
    resolved = _normalise(f"{base}/{path}") if path else source
    linked = page_of(resolved)
    if linked is not None:
      return f"[{label}]({up}{linked}{'#' + anchor if anchor else ''})"
    shown = label if label.startswith("`") else f"`{label}`"
    return shown if label.strip("`") == resolved else f"{shown} (`{resolved}`)"

  def prose(part: str) -> str:
    part = re.sub(r"(!?)\[([^\]]+)\]\(([^)\s]+)\)", one, part)
    return re.sub(r"\] \[(?=[^\]]*\](?!\())", r"] \\[", part)

  parts = re.split(r"(```.*?```)", text, flags=re.DOTALL)  # code blocks stay as written
  return "".join(part if part.startswith("```") else prose(part) for part in parts)


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


def api_modules() -> list[str]:
  """Every module of `bertjax` and `bertjax.kernels`, from the source tree (not `__main__`)."""
  names = set()
  for package, root in SOURCES:
    for path in root.rglob("*.py"):
      parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
      if "__pycache__" not in path.parts and parts[-1:] != ["__main__"]:
        names.add(".".join([package, *parts]))
  return sorted(names)


def tutorial_page(source: str) -> str:
  """The site page of a tutorial script: `docs/tutorials/x.py` -> `tutorials/x.md`."""
  return f"tutorials/{pathlib.PurePosixPath(source).stem}.md"


def run_tutorial(script: pathlib.Path, figures: pathlib.Path, run: bool = True) -> str:
  """A jupytext percent script as a Markdown page: its prose cells as written, its code cells
  as Python blocks, each followed (with `run`) by what it printed and the figures it drew,
  written as `figures/<script>-<n>.png`. The script runs as a notebook in a fresh `python3`
  kernel (nbclient) whose working directory is the repository.

  Raises:
    RuntimeError: a cell failed, ran past `TUTORIAL_TIMEOUT` or killed its kernel; the
      message names the tutorial and holds the cell and its traceback.
  """
  import jupytext
  import nbclient

  nb = jupytext.read(script)
  if run:
    nb.metadata["kernelspec"] = {
      "name": "python3",
      "display_name": "Python 3",
      "language": "python",
    }
    client = nbclient.NotebookClient(
      nb,
      timeout=TUTORIAL_TIMEOUT,
      kernel_name="python3",
      resources={"metadata": {"path": str(REPO)}},
    )
    try:
      client.execute()
    except (
      nbclient.exceptions.CellExecutionError,
      nbclient.exceptions.CellTimeoutError,
      nbclient.exceptions.DeadKernelError,
    ) as e:
      raise RuntimeError(f"tutorial {script.name} failed:\n{e}") from None
  return _markdown(nb, script.stem, figures)


def _markdown(nb, stem: str, figures: pathlib.Path) -> str:
  """The notebook's cells as Markdown: stdout as text blocks, PNG outputs as figure files
  (stderr, progress bars and warnings, is left out)."""
  import base64

  parts, count = [], 0
  for cell in nb.cells:
    if cell.cell_type == "markdown":
      parts.append(cell.source)
      continue
    if cell.cell_type != "code" or not cell.source.strip():
      continue
    parts.append(f"```python\n{cell.source}\n```")
    printed = []
    for output in cell.get("outputs", []):
      data = output.get("data", {})
      if output.output_type == "stream" and output.name == "stdout":
        printed.append(output.text)
      elif "image/png" in data:
        count += 1
        name = f"{stem}-{count}.png"
        (figures / name).write_bytes(base64.b64decode(data["image/png"]))
        if printed:
          parts.append(f"```text\n{''.join(printed).rstrip()}\n```")
          printed = []
        parts.append(f"![{stem}, figure {count}]({name})")
      elif "text/plain" in data and output.output_type == "execute_result":
        printed.append(data["text/plain"] + "\n")
    if printed:
      parts.append(f"```text\n{''.join(printed).rstrip()}\n```")
  return "\n\n".join(parts) + "\n"


def stage(
  src: pathlib.Path, site: pathlib.Path, api: bool = True, run_tutorials: bool = True
) -> pathlib.Path:
  """Writes what MkDocs reads into `src` (replaced); returns the config to build with. With
  `api=False`, no API reference; with `run_tutorials=False`, the tutorials' code without its
  output. Relative `src` and `site` are the caller's (the current directory's)."""
  import yaml

  # MkDocs reads a relative path in the config against the config's own folder, src/.
  src, site = src.resolve(), site.resolve()
  if src.exists():
    shutil.rmtree(src)
  docs = src / "docs"
  (docs / "api").mkdir(parents=True)
  for source, page, _ in PAGES:
    text = (REPO_PAGES / source).read_text(encoding="utf-8")
    (docs / page).write_text(rewrite_links(text, source), encoding="utf-8")
  (docs / "tutorials").mkdir()
  for source, _ in TUTORIALS:
    page = tutorial_page(source)
    text = run_tutorial(REPO_PAGES / source, docs / "tutorials", run_tutorials)
    (docs / page).write_text(rewrite_links(text, source, page), encoding="utf-8")
  modules = api_modules() if api else []
  for module in modules:
    (docs / "api" / f"{module}.md").write_text(f"# `{module}`\n\n::: {module}\n")
  tree = src / "packages" / "bertjax"
  tree.mkdir(parents=True)
  for entry in (REPO / "bertjax").iterdir():
    if entry.name != "__pycache__":
      (tree / entry.name).symlink_to(entry)
  (tree / "kernels").symlink_to(REPO / "kernels")
  config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
  config.update(
    docs_dir=str(docs),
    site_dir=str(site),
    nav=[
      *({title: page} for _, page, title in PAGES),
      *(
        [{"Tutorials": [{title: tutorial_page(src)} for src, title in TUTORIALS]}]
        if TUTORIALS
        else []
      ),
      *([{"API reference": [f"api/{m}.md" for m in modules]}] if modules else []),
    ],
  )
  for plugin in config["plugins"]:
    if isinstance(plugin, dict) and "mkdocstrings" in plugin:
      plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(tree.parent)]
  path = src / "mkdocs.yml"
  path.write_text(yaml.safe_dump(config, sort_keys=False))
  return path


def build(site: pathlib.Path, api: bool = True, run_tutorials: bool = True) -> dict[str, int]:
  """Stages and builds the site into `site` (replaced), strictly; returns how many pages of
  each kind. Raises RuntimeError with MkDocs' warnings when the build fails, or naming the
  tutorial and cell that failed. A relative `site` is the current directory's."""
  site = site.resolve()  # `.` or `out/..` has no name of its own to add `.src` to
  config = stage(site.with_name(site.name + ".src"), site, api, run_tutorials)
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  run = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(config)],
    capture_output=True,
    text=True,
    env=env,
    check=False,
  )
  if run.returncode:
    raise RuntimeError(f"mkdocs build --strict failed:\n{run.stdout}{run.stderr}"[-6000:])
  return {
    "pages": len(PAGES),
    "tutorials": len(TUTORIALS),
    "api_pages": len(api_modules()) if api else 0,
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--out",
    default="out/site",
    metavar="DIR",
    help="the site's folder, replaced (default: out/site; staged in DIR.src)",
  )
  p.add_argument("--no-api", action="store_true", help="the pages only, no API reference")
  p.add_argument(
    "--no-run",
    action="store_true",
    help="render the tutorials' code without running them (by default each runs, a minute or "
    "so on a laptop CPU, and its output is shown)",
  )
  args = p.parse_args(argv)
  for module in ("mkdocs", "material", "mkdocstrings", "yaml", "jupytext", "nbclient"):
    try:
      __import__(module)
    except ImportError:
      print(
        f"docs: {module} is missing; `./run.sh setup` installs it (the docs extra)", file=sys.stderr
      )
      return 2
  out = pathlib.Path(args.out)
  try:
    if not args.no_run:
      print(f"docs: running {len(TUTORIALS)} tutorials ...", file=sys.stderr)
    counts = build(out, api=not args.no_api, run_tutorials=not args.no_run)
  except RuntimeError as e:
    print(f"docs: {e}", file=sys.stderr)
    return 1
  print(
    f"wrote {counts['pages']} pages, {counts['tutorials']} tutorials and {counts['api_pages']} "
    f"API pages to {out}; open "
    f"{out / 'index.html'}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
