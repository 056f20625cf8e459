"""Small helpers shared by the package: files written whole (`files`), CPU threads (`threads`)."""
