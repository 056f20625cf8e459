"""The spaCy side: the `elmo` component (`component`), its `Doc`/`Span`/`Token` extensions and
vector hooks (`extensions`), the registered architectures and weight loaders
(`architectures`, `loaders`) and the config builder of `spacy-elmo init-config` (`init_config`)."""
