"""Figures are written as real PNGs of sensible size, and bad input is named."""

import numpy as np
import pytest

from bertjax.plots import charts

PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
  data = path.read_bytes()
  return data[:8] == PNG and len(data) > 2000


def test_head_heatmap(tmp_path):
  values = np.random.default_rng(0).normal(size=(6, 12))
  values[0, 0] = np.nan
  path = charts.head_heatmap(
    values, tmp_path / "sub" / "effect.png", title="effect", center=0.0, cmap="RdBu"
  )
  assert path == tmp_path / "sub" / "effect.png" and _is_png(path)
  with pytest.raises(ValueError, match=r"values shape \(12,\) must be \(layers, heads\)"):
    charts.head_heatmap(values[0], tmp_path / "x.png")
  with pytest.raises(ValueError, match="must end in .png"):
    charts.head_heatmap(values, tmp_path / "x.pdf")


def test_pattern_heatmap_and_type_ratios(tmp_path):
  codes = np.random.default_rng(1).integers(0, 5, (6, 12))
  assert _is_png(charts.pattern_heatmap(codes, tmp_path / "types.png"))
  ratios = np.random.default_rng(2).dirichlet(np.ones(5), 6)
  assert _is_png(charts.type_ratios(ratios, tmp_path / "ratios.png"))
  with pytest.raises(ValueError, match=r"codes in \[0, 7\]"):
    charts.pattern_heatmap(np.array([[0, 7]]), tmp_path / "bad.png")


def test_attention_grid(tmp_path):
  maps = np.random.default_rng(3).dirichlet(np.ones(9), (2, 4, 9))
  tokens = ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
  path = charts.attention_grid(maps, tokens, tmp_path / "grid.png", heads=[0, 3], title="sentence")
  assert _is_png(path)
  with pytest.raises(ValueError, match="10 tokens but maps are 9 wide"):
    charts.attention_grid(maps, ["t"] * 10, tmp_path / "bad.png")


def test_pruning_curve(tmp_path):
  x = np.linspace(0, 0.9, 10)
  path = charts.pruning_curve(
    {"importance": (x, 1 - x**2), "random": (x, 1 - x)},
    tmp_path / "curve.png",
    baseline=1.0,
    ylabel="accuracy",
  )
  assert _is_png(path)
  with pytest.raises(ValueError, match="curves is empty"):
    charts.pruning_curve({}, tmp_path / "bad.png")


def test_every_head_and_layer_figure_says_layer(tmp_path, monkeypatch):
  """One word for the rows of every (layers, heads) figure: "layer", numbered 1..L (the
  patching figure said "block" where every other figure says "layer")."""
  drawn = []
  save = charts.save_png
  monkeypatch.setattr(charts, "save_png", lambda fig, path: (drawn.append(fig), save(fig, path))[1])
  grid = np.random.default_rng(4).normal(size=(3, 4))
  charts.head_heatmap(grid, tmp_path / "heads.png")
  charts.patching_heatmaps(grid, grid * 0.9, tmp_path / "patching.png")
  for fig in drawn:
    for ax in fig.axes:
      if ax.get_ylabel() and ax.get_label() != "<colorbar>":
        assert ax.get_ylabel() == "layer", ax.get_ylabel()
        assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "3"]
  assert len(drawn) == 2


def test_draw_head_grid_into_a_panel(tmp_path):
  plt = charts.pyplot()
  fig, (a0, a1) = plt.subplots(1, 2)
  values = np.array([[0.0, 2.0], [-0.5, np.nan], [0.25, -3.0]])
  im = charts.draw_head_grid(
    a0, values, title="t", cbar_label="c", center=0.0, span=1.0, annotate=True, fmt="{:+.1f}"
  )
  assert im.norm.vmin == -1.0 and im.norm.vmax == 1.0  # saturated at the span
  assert fig.axes[-1].get_label() == "<colorbar>" and fig.axes[-1].get_ylabel() == "c"
  assert [t.get_text() for t in a0.get_yticklabels()] == ["1", "2", "3"]
  texts = sorted(t.get_text() for t in a0.texts)
  assert texts == sorted(["+0.0", "+2.0", "-0.5", "+0.2", "-3.0"])  # NaN left blank
  im = charts.draw_head_grid(a1, values[:2], vmin=0, vmax=1, first_layer=0)
  assert (im.norm.vmin, im.norm.vmax) == (0, 1) and not a1.texts
  assert [t.get_text() for t in a1.get_yticklabels()] == ["0", "1"]
  plt.close(fig)
