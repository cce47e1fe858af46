"""Moved: the report's generated reading is `bertjax.report.reading` (bertjax/report/reading.py).

A thin alias kept because README.md names this file: importing `bertjax.report_reading` gives
that module itself.
"""

import sys

from bertjax.report import reading

sys.modules[__name__] = reading
