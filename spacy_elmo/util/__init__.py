"""The floor of the package, importing nothing of it: files written whole, hashed, locked and
known by device and inode (`files`), size-bounded JSON (`json_files`), CPU threads (`threads`),
signals that end a command cleanly (`signals`), downloads that resume only the same file
(`download` over `transfer`), install hints read from the package's extras (`extras`)."""
