"""Every figure function (matplotlib, Agg): `charts` (heads, layers, maps, curves), and one
module per study: `attention` (Clark et al.), `circuits`, `effective` (Brunner et al.),
`finetuning` (Kovaleva et al.), `geometry` (Ethayarajh), `outliers`, `probing`, `pruning`
(Michel et al.), `sae` and `training` (runs and models compared)."""
