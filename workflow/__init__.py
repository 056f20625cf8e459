"""The research workflow beside the library: asset fetching and text extraction, CoNLL-2003
conversion, the learning curves, the bundled model's card and the probes' comparison.

Run from the repository root as modules (`python -m workflow.evidence report ...`), as
project.yml's commands do; not part of the spacy-elmo wheel.
"""
