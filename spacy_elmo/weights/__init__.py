"""Every reader, writer and name of biLM weights: the bilm-tf/AllenNLP hdf5 layout and the saved
layout (`layouts`), tensor files and the weights' checks (`tensors`), ELMoForManyLangs models
(`elmoformanylangs`), the published models and their downloads (`published`) and the one
resolver of biLM names (`sources`), with size-bounded JSON from `spacy_elmo.util.json_files`.
These read and write in terms of a biLM's description (`spacy_elmo.description`: its options
and character ids) and import nothing of the model; `spacy_elmo.bilm.BiLM` builds itself from
what they return."""
