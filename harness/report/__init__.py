"""Reports: a run's reliability read back from its folder, for people and for machines.

``load_report(logs/<run>)`` reads the run's store (``harness.db``) and evidence record into a
:class:`Report`: per-task successes over trials, pass^k and pass@k for k = 1..n with intervals
and the method that made each one, the infrastructure-error policy in force, failures by class,
outcomes, partial credit (reported beside pass/fail, never mixed into it), the ``p^n`` null model
fitted from the per-trial step lists, its horizon at s = 0.5, and the self-conditioning measure.

The modules:

``model``
    ``build_report``/``load_report``, ``compare_reports`` and the value objects.
``terminal``
    ``render`` and ``render_comparison``: rich tables.
``html``
    ``render_html``: one self-contained HTML file with inline SVG plots and the evidence.
``reliability``
    what a fault-injected run shows about recovery, per fault class.
``export``
    a run in tau-bench's, tau2-bench's or a JSON-lines format.
"""

from .html import render_html

# The package's public names are the model's, re-exported: see harness.report.model.
from .model import (
    COMPARISON_FORMAT,
    INFRA_DESCRIPTIONS,
    REPORT_FORMAT,
    REPORT_VERSION,
    Comparison,
    Report,
    TaskResult,
    build_report,
    compare_reports,
    load_report,
)
from .terminal import render, render_comparison

__all__ = [
    "COMPARISON_FORMAT",
    "INFRA_DESCRIPTIONS",
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "Comparison",
    "Report",
    "TaskResult",
    "build_report",
    "compare_reports",
    "load_report",
    "render",
    "render_comparison",
    "render_html",
]
