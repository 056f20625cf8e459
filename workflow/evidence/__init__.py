"""CoNLL-2003 learning curves of four NER + tagger pipelines (`spacy project run evidence`):
training subsets (`subsets`), the runs (`runs`), their statistics (`stats`) and the report
(`report`); the command line is `python -m workflow.evidence` (`cli`)."""
