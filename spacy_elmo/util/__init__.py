"""The floor of the package, importing nothing of it, thin over libraries: files written whole
and hashed (`files`), size-bounded JSON (`json_files`, srsly), CPU threads (`threads`), signals
handled once where a command starts (`signals`), downloads (`download`: requests, filelock,
tqdm), install hints from the package's metadata (`extras`)."""
