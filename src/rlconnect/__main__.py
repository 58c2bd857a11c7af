"""``python -m rlconnect ...``: the same as the ``rlconnect`` console script."""

from rlconnect.cli import main

raise SystemExit(main())
