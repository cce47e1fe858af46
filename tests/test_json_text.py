"""`bertjax.utils.json_text`: result files with each list of numbers on one line."""

import json

from bertjax.utils import json_text


def test_flat_lists_take_one_line_and_the_text_reads_back_the_same():
  """Brackets inside strings only keep a list on several lines, or join an object's items."""
  doc = {
    "curve": [0.1, 0.25, None, 3],
    "nested": {
      "rows": [[1, 2], [3, 4]],
      "empty": [],
      "words": ["a, b", "x\ny"],
      "tokens": ["[CLS]", "b"],
    },
    "text": "see [x",
    "other": "y]",
  }
  text = json_text(doc)
  assert json.loads(text) == doc
  lines = text.splitlines()
  assert '"curve": [0.1, 0.25, null, 3],' in [x.strip() for x in lines]
  assert "[1, 2]," in [x.strip() for x in lines] and '"empty": [],' in [x.strip() for x in lines]
  assert '"words": ["a, b", "x\\ny"],' in [x.strip() for x in lines]
  assert len(lines) < len(json.dumps(doc, indent=1).splitlines())
  assert json_text(doc, indent=None) == json.dumps(doc)
