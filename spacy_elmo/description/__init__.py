"""What describes a biLM without being one: its options (options.json) and how tokens become
character ids. The bottom layer under both the model (`spacy_elmo.bilm`) and the weight readers
(`spacy_elmo.weights`), importing neither."""
