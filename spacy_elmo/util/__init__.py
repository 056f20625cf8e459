"""Small helpers shared by the package: files written whole, hashed and locked (`files`), CPU
threads (`threads`), signals that end a command cleanly (`signals`)."""
