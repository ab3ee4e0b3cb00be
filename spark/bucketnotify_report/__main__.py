"""Entry point for ``python -m bucketnotify_report`` and for spark-submit of this file."""

import sys

from bucketnotify_report.cli import main

if __name__ == "__main__":
    sys.exit(main())
