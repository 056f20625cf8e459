"""Import the standalone scripts of scripts/ as modules."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """Import ``scripts/NAME.py`` as a module (scripts/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    if str(SCRIPTS) not in sys.path:  # as when run: a script imports its neighbours
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
