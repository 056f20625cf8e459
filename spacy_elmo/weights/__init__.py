"""Every reader, writer and name of biLM weights: the bilm-tf/AllenNLP hdf5 layout and the saved
layout (`layouts`), tensor files and the weights' checks (`tensors`), ELMoForManyLangs models
(`elmoformanylangs`), the published models and their downloads (`published`) and the one
resolver of biLM names (`sources`), with size-bounded JSON from `spacy_elmo.util.json_files`.
These read and write in terms of the model's options and character ids
(`spacy_elmo.bilm.options`, `spacy_elmo.bilm.chars`); `spacy_elmo.bilm.BiLM` builds itself from
what they return."""
