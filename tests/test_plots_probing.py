"""The probing figures are valid PNG files of sensible size."""

import matplotlib.image
import numpy as np
import pytest

from bertjax.plots import probing as probing_plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_png(path):
  assert path.read_bytes()[:8] == PNG_MAGIC
  img = matplotlib.image.imread(path)
  assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
  assert img[..., :3].std() > 0  # not blank


def test_all_figures(tmp_path):
  rng = np.random.default_rng(0)
  layers = 7
  task, control = rng.uniform(0.6, 0.95, layers), rng.uniform(0.3, 0.6, layers)
  check_png(probing_plots.plot_probing(task, tmp_path / "pos.png", control, task_name="UPOS"))
  check_png(probing_plots.plot_probing(task, tmp_path / "pos_only.png"))
  check_png(
    probing_plots.plot_structural(
      {"UUAS": task, "DSpr.": control, "root acc.": task * 0.9}, tmp_path / "sub" / "s.png"
    )
  )
  summary = {"anisotropy": control, "self_similarity": task, "anisotropy_centered": control / 10}
  check_png(probing_plots.plot_contextuality(summary, tmp_path / "ctx.png"))
  check_png(probing_plots.plot_cka(rng.uniform(size=(layers, layers)), tmp_path / "cka.png"))
  w = rng.uniform(size=layers)
  check_png(probing_plots.plot_mix_weights(w / w.sum(), tmp_path / "mix.png", gamma=1.3))


def test_bad_input_is_named(tmp_path):
  with pytest.raises(ValueError, match="must end in .png"):
    probing_plots.plot_probing([0.5, 0.6], tmp_path / "x.pdf")
  with pytest.raises(ValueError, match=r"control_accuracy shape \(3,\)"):
    probing_plots.plot_probing([0.5, 0.6], tmp_path / "x.png", [0.1, 0.2, 0.3])
  with pytest.raises(ValueError, match="different numbers of layers"):
    probing_plots.plot_layer_curves({"a": [1, 2], "b": [1, 2, 3]}, tmp_path / "x.png")
  assert not list(tmp_path.iterdir())  # nothing written half-way


def test_layers_are_numbered_from_0_with_the_embeddings_else_from_1(tmp_path, monkeypatch):
  """One numbering: blocks 1..L, the embedding output 0 (README, "Layer numbering")."""
  figures = []
  monkeypatch.setattr(probing_plots, "_save", lambda fig, path: figures.append(fig) or path)
  probing_plots.plot_probing([0.5, 0.6, 0.7, 0.8], tmp_path / "a.png", [0.1] * 4)
  probing_plots.plot_layer_curves({"x": [1, 2, 3]}, tmp_path / "b.png", embeddings_first=False)
  probing_plots.plot_cka(np.eye(3), tmp_path / "c.png", embeddings_first=False)
  with_embeddings, blocks, cka = (f.axes[0] for f in figures)
  assert list(with_embeddings.get_xticks()) == [0, 1, 2, 3]
  assert with_embeddings.get_xlabel() == "layer (0 = embeddings)"
  assert list(blocks.get_xticks()) == [1, 2, 3]
  assert list(blocks.lines[0].get_xdata()) == [1, 2, 3]
  assert [t.get_text() for t in cka.get_xticklabels()] == ["1", "2", "3"]
  assert cka.get_xlabel() == "layer"
