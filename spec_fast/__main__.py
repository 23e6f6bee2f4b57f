"""``python -m spec_fast generate "prompt"``."""

from spec_fast.cli import main

raise SystemExit(main())
