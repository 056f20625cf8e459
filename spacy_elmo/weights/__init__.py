"""Every reader, writer and name of biLM weights: the bilm-tf/AllenNLP hdf5 and saved layouts
(`layouts`), tensor files and the weights' checks (`tensors`), ELMoForManyLangs models, the
published models (`published`) and the one resolver of biLM names (`sources`). They know a
biLM's description (`spacy_elmo.description`), never the model; `BiLM` builds itself from them."""
