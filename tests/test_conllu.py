"""CoNLL-U reader: counts against UD stats.xml, multi-word tokens, empty nodes, vocab."""

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from bertjax.data import conllu

SAMPLE = """\
# newdoc id = d1
# sent_id = s1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No
4.1\tknow\tknow\tVERB\tVB\t_\t_\t_\t4:conj\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = s2
# text = Go home
1\tGo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
2\thome\thome\tADV\tRB\t_\t1\tadvmod:lmod\t_\t_
"""


def test_sample_parse():
  sents = conllu.parse_conllu(SAMPLE)
  assert len(sents) == 2
  s = sents[0]
  assert s.sent_id == "s1" and s.text == "I don't know."
  assert s.forms == ("I", "do", "n't", "know", ".")
  assert s.heads == (4, 4, 4, 0, 4)
  assert s.num_words == 5 and s.num_tokens == 4 and s.num_fused == 1 and s.num_empty == 1
  assert s.multiword[0] == conllu.MultiwordToken(2, 3, "don't", "_")
  assert s.surface_tokens() == [("I", 0, 0), ("don't", 1, 2), ("know", 3, 3), (".", 4, 4)]
  assert ("newdoc id", "d1") in s.metadata
  np.testing.assert_array_equal(s.heads_array(), [4, 4, 4, 0, 4])
  assert conllu.corpus_stats(sents) == {
    "sentences": 2,
    "tokens": 6,
    "words": 7,
    "fused": 1,
    "empty": 1,
  }


def test_vocab():
  sents = conllu.parse_conllu(SAMPLE)
  vocab = conllu.build_vocab(sents, "upos")
  assert vocab.labels[0] == "VERB" and vocab.counts[0] == 2
  ids = conllu.encode_field(sents, vocab, "upos")
  assert vocab.decode(ids) == [u for s in sents for u in s.upos]
  rels = conllu.build_vocab(sents, "deprels", strip_subtypes=True)
  assert "advmod" in rels.index and "advmod:lmod" not in rels.index
  with pytest.raises(KeyError, match="ADJ"):
    vocab.encode(["ADJ"])
  assert vocab.encode(["ADJ"], unknown=-1).tolist() == [-1]
  np.testing.assert_array_equal(conllu.word_offsets(sents), [0, 5, 7])


def test_bad_input_names_value():
  bad = "1\tI\tI\tPRON\tPRP\t_\t7\tnsubj\t_\t_\n"
  with pytest.raises(ValueError, match=r"heads \[7\]"):
    conllu.parse_conllu(bad)
  with pytest.raises(ValueError, match="10 tab-separated"):
    conllu.parse_conllu("1\tI\tI\n")


def test_ewt_dev_matches_stats_xml(data_dir):
  ud = data_dir / "ud_english_ewt"
  dev = ET.parse(ud / "stats.xml").getroot().find("size/dev")
  expected = {k: int(dev.find(k).text) for k in ("sentences", "tokens", "words", "fused")}
  sents = conllu.read_conllu(ud / "en_ewt-ud-dev.conllu")
  stats = conllu.corpus_stats(sents)
  assert {k: stats[k] for k in expected} == expected
  assert stats["empty"] > 0
  assert all(s.sent_id and s.text for s in sents)
  # every sentence is a tree with exactly one root
  assert all(sum(h == 0 for h in s.heads) == 1 for s in sents)
  upos = conllu.build_vocab(sents, "upos")
  assert len(upos) == 17
