"""The experiments: the pipeline around the runtime (docs/layout.md). Composed configs, the study and its
journal, sensitivity and feasibility, the stages, statistics, ablations, figures, the paper's generated LaTeX and
the notebooks' set-up. It imports the runtime; the runtime never imports it.
"""
