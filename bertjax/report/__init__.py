"""The BERTology report: `bertjax report` and `./run.sh demo`.

`build_report` loads a checkpoint of any family the encoder serves (the built-in all-MiniLM-L6-v2
by default; a directory or a hub id in the local cache), runs the analyses of
`bertjax.analysis` on the project's own sentences
(`bertjax/resources/sentences.tsv`) or, with `data_dir`, on UD English EWT, and
writes `index.html` (its PNG figures beside it) and `report.json` (every number the
page shows). Layers are numbered one way throughout (`LAYER_NUMBERING`): blocks 1..L,
the embedding output 0.

Sections: attention to [CLS], [SEP] and punctuation and attention entropy
(Clark et al. 2019); attention pattern types (Kovaleva et al. 2019); head and
layer ablation and head importance with a pruning curve (Michel et al. 2019) on
a negation-detection task scored without downloads; anisotropy (Ethayarajh
2019); a POS probe when UD data is present; raw vs effective attention (Brunner
et al. 2020); token attribution and head patching on negation; on DeBERTa only, how much of
each head's scores its position terms carry (He et al. 2021). Each section ends in a
generated reading (`bertjax.report.reading`, stored under `readings`): the paper's finding,
this model's measured value beside it, and whether they agree under a stated rule.

The project's labelled sentences (`bertjax.tasks.sentences`), their batches
(`bertjax.tasks.text_batches`) and the negation task scored by a fixed probe
(`bertjax.tasks.negation_probe`: `fit_task`, `task_loss`, `task_accuracy`) are shared with
the experiments. Modules, one concern each: `settings` (`ReportSettings`,
`LAYER_NUMBERING`), `inputs` (model name, data directory), `sections` (the analyses),
`figures` (the PNGs, drawn by `bertjax.plots.charts`), `page` (the HTML), `reading` (the
generated readings) and `build` (`build_report`). Their public names are importable from
here.
"""

from bertjax.report.build import build_report
from bertjax.report.figures import write_figures
from bertjax.report.inputs import default_data_dir, model_name
from bertjax.report.page import MODEL_SECTIONS, SECTIONS, render_html
from bertjax.report.reading import readings, verdicts
from bertjax.report.sections import (
  ablation_section,
  anisotropy_section,
  attribution_section,
  clark_section,
  disentangled_section,
  effective_section,
  pattern_section,
  pos_section,
)
from bertjax.report.settings import LAYER_NUMBERING, ReportSettings

__all__ = [
  "LAYER_NUMBERING",
  "MODEL_SECTIONS",
  "SECTIONS",
  "ReportSettings",
  "ablation_section",
  "anisotropy_section",
  "attribution_section",
  "build_report",
  "clark_section",
  "default_data_dir",
  "disentangled_section",
  "effective_section",
  "model_name",
  "pattern_section",
  "pos_section",
  "readings",
  "render_html",
  "verdicts",
  "write_figures",
]
