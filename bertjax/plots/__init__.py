"""Every figure function (matplotlib, Agg): charts of heads, layers and maps, and the
probing plots."""
