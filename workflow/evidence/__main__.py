"""`python -m workflow.evidence subsets|run|runs|report ...`"""

import sys

from workflow.evidence.cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"workflow.evidence: {error}")
